#!/bin/bash
# OpenAI's Codex CLI (`npm install -g @openai/codex`), unmodified, as a `command` agent of the `agent`
# harness: run in agentrl's sandbox, its model the episode's gateway session over the Responses API.
# Configured by a config.toml in its own CODEX_HOME (no login, no ~/.codex of the host): the session
# as a custom provider, its own sandbox and approvals off (agentrl's sandbox is around it), nothing
# sent anywhere but the gateway. The task's prompt comes on stdin; Codex's last message, written by
# `--output-last-message`, is the only thing on stdout (the final answer); its log goes to stderr.
set -euo pipefail
export CODEX_HOME="${CODEX_HOME:-/tmp/codex-home}"  # the sandbox's own tmpfs, not the graded work directory
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<EOF
model = "policy"
model_provider = "agentrl"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_reasoning_summary = "none"
web_search = "disabled"

[model_providers.agentrl]
name = "agentrl gateway session"
base_url = "$OPENAI_BASE_URL"
env_key = "OPENAI_API_KEY"
wire_api = "responses"

[agents]
enabled = false

[features]
goals = false
view_image = false
apps = false
plugins = false
image_generation = false
shell_snapshot = false

[analytics]
enabled = false

[history]
persistence = "none"
EOF
codex exec --strict-config --skip-git-repo-check --ephemeral --color never \
  --output-last-message "$CODEX_HOME/last-message.txt" - >&2
cat "$CODEX_HOME/last-message.txt"
