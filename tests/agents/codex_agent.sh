#!/bin/bash
# OpenAI's Codex CLI (`npm install -g @openai/codex`), unmodified, as a `command` agent of the `agent`
# harness: run in agentrl's sandbox, its model the episode's gateway session over the Responses API.
# Configured by a config.toml in its own CODEX_HOME (no login, no ~/.codex of the host): the session
# as a custom provider, its own sandbox and approvals off (agentrl's sandbox is around it), nothing
# sent anywhere but the gateway. The task's prompt comes on stdin; Codex's events (`--json`) are read
# back: its last message is the only thing on stdout (the final answer), its errors go to stderr.
# A reply cut at the token cap is a failed turn to Codex (`Incomplete response returned, reason:
# max_output_tokens`, exit 1), as against OpenAI; an untrained model is cut nearly every time, so
# that one failure ends the episode with the text it got, and any other fails the command.
# An optional argument names an instructions file (Codex's own `model_instructions_file`) to send in
# place of Codex's built-in instructions: about 10,500 of its ~12,900 tokens, written for OpenAI's
# models, more than a small open model's context holds.
set -euo pipefail
export CODEX_HOME="${CODEX_HOME:-/tmp/codex-home}"  # the sandbox's own tmpfs, not the graded work directory
mkdir -p "$CODEX_HOME"
instructions=""
if [ $# -ge 1 ]; then instructions="model_instructions_file = \"$(realpath "$1")\""; fi
cat > "$CODEX_HOME/config.toml" <<EOF
$instructions
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
status=0
codex exec --strict-config --skip-git-repo-check --ephemeral --color never --json - \
  > "$CODEX_HOME/events.jsonl" || status=$?
exec python3 -I -c '
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
items = [e["item"] for e in events if e.get("type") == "item.completed"]
said = [i["text"] for i in items if i.get("type") == "agent_message"]
failed = [e["error"]["message"] for e in events if e.get("type") == "turn.failed"]
for message in [i["message"] for i in items if i.get("type") == "error"] + failed:
    print("codex:", message, file=sys.stderr)
if said:
    print(said[-1])
cut = failed == ["Incomplete response returned, reason: max_output_tokens"]
sys.exit(0 if cut else int(sys.argv[2]))
' "$CODEX_HOME/events.jsonl" "$status"
