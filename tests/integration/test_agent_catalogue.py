"""The catalogue of real agents (docs/agents.md), unmodified, trained in CI: the OpenAI Agents SDK
(Responses API), the anthropic SDK (Messages API), mini-swe-agent (litellm's chat completions, its
commands in agentrl's sandbox) and OpenAI's Codex CLI (Responses API, a command in the sandbox), side
by side in one run (each the `agent` harness under a name of its own, tests/agents/catalogue.py). Stage
5 checks each token-exact through the gateway (every call served, stored as served); stage 8 smoke
trains on all four's episodes with no token-exact mismatch. Codex runs with a short instructions file
of its own config (`model_instructions_file`): its built-in instructions are ~10,500 of the ~12,900
tokens it sends, which a 4096-token context does not hold (Codex with them: test_codex_cli.py, stage 5
in CI, stage 8 under `-m long`).
The built-in model mostly writes nonsense for them: the plumbing is what is judged. Each agent's own
tests (its dialect with the real SDK, a scripted model that makes mini-swe-agent's tool run in the
sandbox and find no host file) are in test_responses_api.py, test_messages_api.py and
test_mini_swe_agent.py and test_codex_cli.py."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from agentrl_cli.runtime.data.writer import read_records
from agentrl_cli.runtime.observe.step_metrics import read_rows
from tests.integration.conftest import needs_bwrap
from tests.integration.test_codex_cli import VERSION, _codex

AGENTS = Path(__file__).parents[1] / "agents"

pytestmark = [pytest.mark.integration, needs_bwrap,
              pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None or importlib.util.find_spec("agents") is None,
                                 reason="the catalogue's agents are not installed (pip install -e '.[dev]')"),
              pytest.mark.skipif(_codex() is None, reason=f"the Codex CLI is not installed under /usr "
                                                          f"(bash .ci/setup --dev: npm install -g @openai/codex@{VERSION})")]
CATALOGUE = {
    "tests.agents.catalogue:AgentsSdkAgent": "{entry: 'tests.agents.agents_sdk_agent:run', tasks: brief}",
    "tests.agents.catalogue:AnthropicAgent": "{entry: 'tests.agents.anthropic_agent:run', tasks: brief}",
    "tests.agents.catalogue:MiniSweAgent": "{entry: 'tests.agents.mini_swe_agent:run', sandbox: true, timeout_s: 120, tasks: brief}",
    "tests.agents.catalogue:CodexAgent": f"{{command: 'bash codex_agent.sh codex_instructions.md', timeout_s: 120, tasks: brief, "
                                         f"files: ['{AGENTS / 'codex_agent.sh'}', '{AGENTS / 'codex_instructions.md'}']}}",
}
# mini-swe-agent's instructions are about 2,100 tokens of the built-in tokenizer and Codex's prompt with
# the short instructions about 2,400: more than the 2048 a run allows by default (the tiny model's
# positions go on past its configured 2048)
LONG_CONTEXT = ["--set", "model.context_length=4096", "--set", "training.seq_len_limit=4096"]


def _store():
    from agentrl_cli.config.models import DataConfig
    from agentrl_cli.runtime.data.stores import open_store

    return open_store(DataConfig())  # data.root's default, under the test's working directory


def test_every_catalogued_agent_passes_stage_5_token_exact_and_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n" + "".join(f"  - name: {name}\n    options: {options}\n" for name, options in CATALOGUE.items()))
    result, data = cli.json("stage", "run", "5", *quick_sets, *LONG_CONTEXT)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:300]) for n, c in checks.items() if c["status"] == "fail"]
    for name in CATALOGUE:
        exact = checks[f"harness {name}: token-exact through the gateway"]
        assert exact["status"] == "pass" and exact["measured"]["calls"] >= 1 and exact["measured"]["mismatches"] == 0, name

    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",
            "--set", "training.gradient_accumulation_steps=2"]  # as the openai agent's smoke: flat groups unlikely
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *quick_sets, *LONG_CONTEXT, *wide)
    report = data["reports"][-1]
    assert result.exit_code == 0 and report["status"] == "pass", \
        [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    last = rows[-1]
    assert last["rollout/token_exact_mismatches"] == 0 and last["rollout/token_exact_episodes"] > 0
    assert last["gateway/aborted_calls"] == 0 and last["gateway/unauthorized"] == 0
    played = Counter(r.harness for r in read_records(_store()) if r.run_id == report["run_id"])
    assert set(played) == set(CATALOGUE), played  # every agent's episodes were played, stored and trained on
