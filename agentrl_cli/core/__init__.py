"""The ground floor: the episode vocabulary, outcomes, errors, the report type, plug-in loading,
redaction, host facts, progress, service security, the HTTP client, log streams and run-directory
paths. Imports nothing of agentrl_cli above it."""
