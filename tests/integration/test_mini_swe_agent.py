"""mini-swe-agent, unmodified, as an `entry` agent of the `agent` harness (`sandbox: true`): its model
calls go through litellm's `openai/` provider to a real gateway session over HTTP and are recorded
token-exact; its `bash` tool runs in a real bubblewrap sandbox from the harness's provider, so a
host file it is told to read is not there. The model is scripted (`ScriptedBackend`: the commands
are the test's), since a random tiny model would never call the tool and the sandbox would go
untested."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.gateway.app import create_app
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.runtime.observe.step_metrics import read_rows
from tests.integration.conftest import needs_bwrap
from tests.integration.test_gateway import ADMIN
from tests.integration.test_malformed_tool_calls import ScriptedBackend

pytestmark = [pytest.mark.integration, needs_bwrap,  # not imported here: importing it prints a banner
              pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None,
                                 reason="mini-swe-agent is not installed (pip install -e '.[dev]')")]
SECRET = "host-secret-4e1f"


def bash(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


class Tapped(ScriptedBackend):
    """The scripted model, keeping (input ids, output ids) of every generation as served."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.served: list[tuple[list[int], list[int]]] = []

    async def generate(self, input_ids, sampling, *, n=1, top_logprobs=0):
        out = await super().generate(input_ids, sampling, n=n, top_logprobs=top_logprobs)
        self.served.append((list(input_ids), list(out[0].output_ids)))
        return out


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


def test_mini_swe_agent_runs_its_commands_in_the_sandbox_and_every_call_is_recorded_token_exact(tokenizer, tmp_path):
    from agentrl_cli.envs.sandbox.provider import DirectProvider
    from harnesses.agent import AgentHarness
    from harnesses.agent.tasks import task_set

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)  # on the host, where an agent running commands locally would read it
    backend = Tapped(tokenizer, [bash(f"cat {secret}; pwd; echo made > made.txt && ls"),
                                 bash("printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\nall done\\n'")])
    gw = Gateway(backend)
    srv = ServerThread(create_app(gw, admin_key=ADMIN), name="gateway").start()
    try:
        session = httpx.post(srv.url + "/sessions", json={"meta": {"harness": "agent"}},
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
        harness = AgentHarness(entry="tests.agents.mini_swe_agent:run", sandbox=True, tasks="brief", timeout_s=120,
                               sandbox_provider=DirectProvider())
        harness.reset(task_set("brief").tasks[0])
        outcome = harness.play(session["base_url"], session["api_key"])
        record = httpx.delete(srv.url + f"/sessions/{session['session_id']}",
                              headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()
    finally:
        srv.stop()
    assert outcome.answer == "all done"  # its submission, from the sandbox's output
    assert not (tmp_path / "made.txt").exists()
    steps = sorted((s for seg in record["segments"] for s in seg["calls"]), key=lambda s: s["index"])
    assert [c["name"] for s in steps for c in s["tool_calls"]] == ["bash", "bash"]
    seen = steps[0]["observation"][0]  # what the sandbox answered, as the agent sent it back
    assert seen["role"] == "tool" and SECRET not in seen["content"] and "No such file" in seen["content"]
    assert "/work" in seen["content"] and "made.txt" in seen["content"]
    assert gw.stats()["gateway/calls"] == 2 and gw.stats()["gateway/malformed_tool_calls"] == 0
    for seg in record["segments"]:  # the stored ids are the served ones
        ids = seg["token_ids"]
        mine = [(i, o) for i, o in backend.served if ids[:len(i) + len(o)] == i + o]
        assert mine and sum(seg["loss_mask"]) == sum(len(o) for _, o in mine)
    assert sum(len(seg["calls"]) for seg in record["segments"]) == 2


@pytest.mark.long
def test_mini_swe_agent_passes_stage_5_token_exact_on_the_harbor_tasks_and_trains_through_stage_8_smoke(
        cli, write_yaml, quick_sets):
    """The catalogue's acceptance on the built-in model (it writes no tool call: the plumbing is what is
    judged). Stage 5 on the Harbor tasks: every call served and stored token-exact, the episode graded
    by the task's own tests. Stage 8 smoke on the `brief` tasks: on the Harbor tasks an agent that never
    acts scores the same in every episode, so every group is flat and the smoke's reward check fails
    by design; `brief` scores the length of its last reply, which varies."""
    # mini-swe-agent's own instructions are about 2,100 tokens of the built-in tokenizer: more than the
    # 2048 a run allows by default (the tiny model's RoPE positions go on past its configured 2048)
    sets = [*quick_sets, "--set", "model.context_length=4096", "--set", "training.seq_len_limit=4096"]
    agent = "{entry: 'tests.agents.mini_swe_agent:run', sandbox: true, timeout_s: 120, tasks: %s}"
    write_yaml(f"harnesses:\n  - name: agent\n    reward: harness\n    options: {agent % 'harbor'}\n")
    result, data = cli.json("stage", "run", "5", *sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:300]) for n, c in checks.items() if c["status"] == "fail"]
    exact = checks["harness agent: token-exact through the gateway"]
    assert exact["status"] == "pass" and exact["measured"]["calls"] >= 1 and exact["measured"]["mismatches"] == 0
    graded = checks["harness agent: one episode through the training path"]["measured"]
    assert graded["verifier"] == "harness" and graded["reward_status"] in ("ok", "fail")  # scored by Harbor's tests

    write_yaml(f"harnesses:\n  - name: agent\n    options: {agent % 'brief'}\n")
    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",
            "--set", "training.gradient_accumulation_steps=2"]  # as the openai agent's smoke: flat groups unlikely
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *sets, *wide)
    report = data["reports"][-1]
    assert result.exit_code == 0 and report["status"] == "pass", \
        [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    assert rows and rows[-1]["rollout/token_exact_mismatches"] == 0 and rows[-1]["rollout/token_exact_episodes"] > 0
