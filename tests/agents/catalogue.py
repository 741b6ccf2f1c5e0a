"""The catalogued agents as harnesses of their own names, so one run plays them all side by side:
each is the `agent` harness unchanged (`harnesses.agent.AgentHarness`), named for the agent it
plays. A test-only registration; a user names the `agent` harness and its options."""

from harnesses.agent import AgentHarness


class AgentsSdkAgent(AgentHarness):
    name = "agents_sdk_agent"  # tests/agents/agents_sdk_agent.py: the OpenAI Agents SDK, Responses API


class AnthropicAgent(AgentHarness):
    name = "anthropic_agent"  # tests/agents/anthropic_agent.py: the anthropic SDK, Messages API


class MiniSweAgent(AgentHarness):
    name = "mini_swe_agent"  # tests/agents/mini_swe_agent.py: mini-swe-agent (litellm), commands in the sandbox


class CodexAgent(AgentHarness):
    name = "codex_agent"  # tests/agents/codex_agent.sh: OpenAI's Codex CLI, a command in the sandbox
