"""Secrets never leave a run: a stage 8 smoke run is given its inference key by environment
(AGENTRL_INFERENCE__API_KEY, the embedded server requiring it) and a second secret that no pattern
recognises (AGENTRL_REWARD__API_KEY, known only by value). A harness plants both in its output, in a
tool result, in its own log line and in a line of the inference server's log (a request whose query
string carries them, which the server's access log prints). Afterwards no file of the run (logs,
metrics.jsonl, stage reports, report.html, meta.json, the audit log) and nothing the command printed
holds either, the server's log shows the planted line redacted, the trajectory store holds no
inference key, and no process the run started had a key on its command line."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, ToolCallResult, Trajectory

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]
NAME = f"{__name__}:PlantingHarness"
INFERENCE_KEY = "Qm9vZ3kZ7xY-2pLk_8vRtW3nA5sD0fGh1jK4lP6oI9u"  # as `agentrl secrets rotate` makes them
KNOWN_ONLY = "plant-5e1f0c2a9b7d4e63"  # hex after a word: only its known value gives it away
SEEN_COMMAND_LINES: list[str] = []
log = logging.getLogger(__name__)


def _descendants_command_lines() -> list[str]:
    """The command lines of every process below this one (the run's servers, ranks, sandboxes)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    mine, found = {os.getpid()}, True
    while found:
        found = False
        for pid, ppid in parents.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                found = True
    out = []
    for pid in mine - {os.getpid()}:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            continue
    return out


class PlantingHarness:
    """One-step tasks whose observation, tool result and log line carry the run's secrets."""

    name = "planting"
    version = "1"

    def __init__(self, server_port: int) -> None:
        self.server_port, self.answer = server_port, None
        self.secrets = [os.environ["AGENTRL_INFERENCE__API_KEY"], os.environ["AGENTRL_REWARD__API_KEY"]]

    @classmethod
    def task_set(cls) -> TaskSet:
        tasks = [TaskSpec(task_id=f"planting/{split}/{i}", harness="planting", prompt=f"Say something ({i}).", answer="x",
                          difficulty=1, split=split, meta={"family": "planting", "verify": "regex", "pattern": "(?s).{1,40}"})
                 for split in ("train", "eval") for i in range(8)]
        return TaskSet("planting-1", tuple(tasks))

    def system_prompt(self) -> str:
        return "Answer briefly."

    def tools(self) -> list[dict]:
        return [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                  "parameters": {"type": "object", "properties": {}}}}]

    def reset(self, task_spec: TaskSpec) -> Observation:
        self.answer = None
        SEEN_COMMAND_LINES.extend(_descendants_command_lines())
        query = "&".join(f"note{i}={s}" for i, s in enumerate(self.secrets))
        httpx.get(f"http://127.0.0.1:{self.server_port}/health?{query}", timeout=30)  # the server logs this line
        log.warning("workspace ready with keys %s", " ".join(self.secrets))
        return Observation(text=f"{task_spec.prompt} Your workspace keys are {' and '.join(self.secrets)}.")

    def step(self, action: Action) -> Observation:
        self.answer = action.text.strip()
        SEEN_COMMAND_LINES.extend(_descendants_command_lines())
        result = f"lookup found {' '.join(self.secrets)}"
        return Observation(text=result, done=True, calls=[ToolCallResult(name="lookup", output=result)])

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer=self.answer)

    def compute_reward(self, trajectory: Trajectory) -> float:
        return float(bool(self.answer) and len(self.answer) <= 40)

    def full_reset(self) -> None:
        self.answer = None

    def close(self) -> None:
        self.answer = None


def test_no_secret_planted_in_a_stage_8_smoke_run_reaches_its_files_or_command_lines(cli, write_yaml, quick_sets, isolated):
    port = int(next(s for s in quick_sets if s.startswith("inference.port=")).split("=")[1])
    write_yaml(f"harnesses:\n  - name: '{NAME}'\n    options: {{server_port: {port}}}\n")
    env = {"AGENTRL_INFERENCE__API_KEY": INFERENCE_KEY, "AGENTRL_REWARD__API_KEY": KNOWN_ONLY}
    SEEN_COMMAND_LINES.clear()
    result = cli("stage", "run", "8", "--phase", "smoke", *quick_sets, "--set", "rollout.max_steps_per_trajectory=1",
                 "--json", env=env)
    [run] = list((isolated / "runs").glob("*/stage8"))
    run = run.parent
    report = run / "reports" / "stage-8.json"
    assert report.exists() and (run / "stage8" / "metrics.jsonl").exists() and (run / "report.html").exists(), result.output

    files = [p for p in (isolated / "runs").rglob("*") if p.is_file()
             and not {"checkpoints", "weights"} & set(p.relative_to(isolated / "runs").parts)]
    assert {p.name for p in files} >= {"stage-8.json", "stage-8.md", "metrics.jsonl", "report.html", "hf-0.log"}
    for path in files:
        data = path.read_bytes()
        assert INFERENCE_KEY.encode() not in data and KNOWN_ONLY.encode() not in data, path
    for secret in (INFERENCE_KEY, KNOWN_ONLY):
        assert secret not in result.output  # the run's own stdout and stderr (a job's log file)

    server_log = (run / "stage8" / "logs" / "hf-0.log").read_text()
    planted = re.findall(r'"GET /health\?note0=(\S+)&note1=(\S+) HTTP', server_log)
    assert planted and set(planted) == {("[REDACTED:inference.api_key]", "[REDACTED:reward.api_key]")}, server_log[-2000:]
    import pyarrow.parquet as pq

    stored = " ".join(str(pq.read_table(p).to_pylist()) for p in (isolated / "data").rglob("*.parquet"))
    assert "Your workspace keys are [REDACTED:" in stored and INFERENCE_KEY not in stored  # the store's own redaction

    lines = [c for c in SEEN_COMMAND_LINES if "agentrl_cli" in c]
    assert any(" serve inference " in c for c in lines), SEEN_COMMAND_LINES  # the scan saw the server
    assert not any(INFERENCE_KEY in c or KNOWN_ONLY in c for c in SEEN_COMMAND_LINES)
