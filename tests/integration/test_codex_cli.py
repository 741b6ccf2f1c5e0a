"""OpenAI's Codex CLI, unmodified (`@openai/codex`, pinned in .ci/setup --dev), as a `command` agent of the
`agent` harness on a shipped Harbor task: the command (tests/agents/codex_agent.sh, the config docs/agents.md
gives) runs in a real bubblewrap sandbox whose only way out is the allow-listed gateway; Codex speaks the
Responses API to a real gateway session, its `exec_command` tool runs inside the same sandbox (its own
sandbox off), so a host file it is told to read is not there. The model is scripted (`Tapped`: the commands
are the test's), since a random tiny model would never call the tool and the sandbox would go untested."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.gateway.app import create_app
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.runtime.observe.step_metrics import read_rows
from tests.integration.conftest import needs_bwrap
from tests.integration.test_gateway import ADMIN
from tests.integration.test_mini_swe_agent import Tapped

AGENT = Path(__file__).parents[1] / "agents" / "codex_agent.sh"
VERSION = "0.171.0"  # as .ci/setup installs it
SECRET = "host-secret-7c2a"


def _codex() -> str | None:
    """The Codex CLI's version when it is installed under /usr, which the sandbox binds; else None."""
    found = shutil.which("codex")
    if not found or not Path(found).resolve().is_relative_to("/usr"):
        return None
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() if out.returncode == 0 else None


pytestmark = [pytest.mark.integration, needs_bwrap,
              pytest.mark.skipif(_codex() is None, reason=f"the Codex CLI is not installed under /usr "
                                                          f"(bash .ci/setup --dev: npm install -g @openai/codex@{VERSION})")]


def exec_command(cmd: str) -> str:
    """A call of Codex's shell tool as the built-in model's format writes it."""
    return "<tool_call>\n" + json.dumps({"name": "exec_command", "arguments": {"cmd": cmd}}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


def test_codex_runs_its_commands_in_the_sandbox_on_a_harbor_task_and_every_call_is_recorded_token_exact(
        tokenizer, tmp_path):
    from agentrl_cli.envs.sandbox.provider import DirectProvider
    from agentrl_cli.envs.sandbox.sandbox import SandboxSettings
    from harnesses.agent import AgentHarness
    from harnesses.agent.harbor_tasks import task_set

    assert _codex() == f"codex-cli {VERSION}"
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)  # on the host, where an agent running its commands locally would read it
    backend = Tapped(tokenizer, [exec_command(f"cat {secret}; pwd; echo made > made.txt; ls"), "All done."])
    gw = Gateway(backend)
    srv = ServerThread(create_app(gw, admin_key=ADMIN), name="gateway").start()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        session = httpx.post(srv.url + "/sessions", json={"meta": {"harness": "agent"}}, headers=admin, timeout=30).json()
        gateway = urlsplit(srv.url)
        provider = DirectProvider(SandboxSettings(allowlist=(f"{gateway.hostname}:{gateway.port}",)))
        harness = AgentHarness(command="bash codex_agent.sh", files=[str(AGENT)], tasks="harbor", timeout_s=120,
                               sandbox_provider=provider)
        harness.reset(task_set().tasks[0])
        outcome = harness.play(session["base_url"], session["api_key"])
        record = httpx.delete(srv.url + f"/sessions/{session['session_id']}", headers=admin, timeout=30).json()
    finally:
        srv.stop()
    assert outcome.answer == "All done."  # Codex's last message, its only stdout
    assert not (tmp_path / "made.txt").exists()
    assert "made.txt" in harness.final.files  # written in the sandbox's /work, carried to the task's grading
    steps = sorted((s for seg in record["segments"] for s in seg["calls"]), key=lambda s: s["index"])
    assert [c["name"] for s in steps for c in s["tool_calls"]] == ["exec_command"]
    seen = steps[0]["observation"][0]  # what the sandbox answered, as Codex sent it back
    assert seen["role"] == "tool" and SECRET not in seen["content"] and "No such file" in seen["content"]
    assert "/work" in seen["content"] and "codex_agent.sh" in seen["content"]
    assert gw.stats()["gateway/calls"] == 2 and gw.stats()["gateway/malformed_tool_calls"] == 0
    assert gw.stats()["gateway/rerender_mismatch_calls"] == 0
    for seg in record["segments"]:  # the stored ids are the served ones
        ids = seg["token_ids"]
        mine = [(i, o) for i, o in backend.served if ids[:len(i) + len(o)] == i + o]
        assert mine and sum(seg["loss_mask"]) == sum(len(o) for _, o in mine)
    assert sum(len(seg["calls"]) for seg in record["segments"]) == 2


# Codex's own instructions and tool schemas are about 13,000 tokens of the built-in tokenizer: past the
# 2048 a run allows by default (the tiny model's RoPE positions go on past its configured 2048)
LONG_CONTEXT = ["--set", "model.context_length=16384", "--set", "training.seq_len_limit=16384"]
CODEX = "{command: 'bash codex_agent.sh', files: ['%s'], timeout_s: 240, tasks: %s}"


def test_codex_passes_stage_5_token_exact_on_the_harbor_tasks(cli, write_yaml, quick_sets):
    """The catalogue's acceptance on the random model (it writes no tool call: the plumbing is what is
    judged). Stage 5 on the Harbor tasks: every call served and stored token-exact, the episode graded by
    the task's own tests."""
    sets, agent = [*quick_sets, *LONG_CONTEXT], CODEX
    write_yaml(f"harnesses:\n  - name: agent\n    reward: harness\n    options: {agent % (AGENT, 'harbor')}\n")
    result, data = cli.json("stage", "run", "5", *sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:300]) for n, c in checks.items() if c["status"] == "fail"]
    exact = checks["harness agent: token-exact through the gateway"]
    assert exact["status"] == "pass" and exact["measured"]["calls"] >= 1 and exact["measured"]["mismatches"] == 0
    graded = checks["harness agent: one episode through the training path"]["measured"]
    assert graded["verifier"] == "harness" and graded["reward_status"] in ("ok", "fail")  # scored by Harbor's tests


@pytest.mark.long  # about 70 s: each episode's ~13,000 tokens prefilled and trained on the CPU
def test_codex_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    """Stage 8 smoke with Codex's built-in instructions, on the `brief` tasks, whose reward varies within a
    group (on the Harbor tasks an agent that never acts scores the same in every episode). In CI Codex
    trains through stage 8 smoke with a short instructions file, beside the other catalogued agents
    (test_agent_catalogue.py)."""
    sets, agent = [*quick_sets, *LONG_CONTEXT], CODEX
    write_yaml(f"harnesses:\n  - name: agent\n    options: {agent % (AGENT, 'brief')}\n")
    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",
            "--set", "training.gradient_accumulation_steps=2",
            "--set", "rollout.concurrency=2"]  # each episode's prefill of ~13,000 tokens takes about 1 GB on CPU
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *sets, *wide)
    report = data["reports"][-1]
    assert result.exit_code == 0 and report["status"] == "pass", \
        [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    assert rows and rows[-1]["rollout/token_exact_mismatches"] == 0 and rows[-1]["rollout/token_exact_episodes"] > 0
