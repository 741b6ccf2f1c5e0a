"""Stage 5 plays every harness at the run's concurrency for it: a harness that leaves a process
behind only when two or more of its episodes run at once fails stage 5's concurrency check, which
names the process and ends it; played one at a time the same harness passes, so the check at the
run's concurrency is what catches it. Real bubblewrap sandboxes from the run's warm pools."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import replace

import pytest

from agentrl_cli.acceptance import leftover_processes
from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.acceptance.run_meta import create_run
from agentrl_cli.config import load_config
from agentrl_cli.core.errors import EnvironmentBusy
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.envs.sandbox import SandboxSettings
from harnesses.base import Action, Observation, TaskSet, TaskSpec
from harnesses.sandboxed import SandboxHarness

pytestmark = [pytest.mark.integration]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
NAME = f"{__name__}:CrowdedHarness"
ONE_SESSION = f"{__name__}:OneSessionHarness"
LEAKED = ["sleep", "1000"]


class CrowdedHarness(SandboxHarness):
    """Each episode runs a short command in its sandbox and answers. Its bug: while another of its
    episodes is live, reset starts a helper process on the host, detached, and forgets it."""

    name = "crowded"
    version = "1"
    live = 0  # episodes live across every instance: the state its instances share
    lock = threading.Lock()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.in_episode = False

    @classmethod
    def task_set(cls) -> TaskSet:
        tasks = [TaskSpec(task_id=f"crowded/{split}/{i}", harness="crowded", prompt="Answer.", answer="0", difficulty=1,
                          split=split, meta={"family": "crowded", "verify": "regex", "pattern": "(?s).*"})
                 for split in ("train", "eval") for i in range(2)]
        return TaskSet("crowded-1", tuple(tasks))

    def tools(self) -> list[dict]:
        return []

    def reset(self, task_spec: TaskSpec) -> Observation:
        obs = super().reset(task_spec)
        with CrowdedHarness.lock:
            if not self.in_episode:
                self.in_episode = True
                CrowdedHarness.live += 1
            crowded = CrowdedHarness.live > 1
        if crowded:
            subprocess.Popen(LEAKED, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        return obs

    def step(self, action: Action) -> Observation:
        if self.sandbox is None:
            return Observation(text="reset first", status="invalid_action", done=True)
        if not action.text.startswith("ANSWER:"):
            return Observation(text="answer with ANSWER: <n>", status="invalid_action")
        r = self.sandbox.exec("sleep 0.2; echo answered", timeout=10)  # long enough for the episodes at once to overlap
        return Observation(text=r.stdout.strip(), status=r.status, done=True)

    def end_episode(self) -> None:
        with CrowdedHarness.lock:
            if self.in_episode:
                self.in_episode = False
                CrowdedHarness.live -= 1
        super().end_episode()

    def full_reset(self) -> None:
        self.end_episode()
        super().full_reset()


class OneSessionHarness:
    """An environment that holds one session at once: a second reset while one is open is refused at
    capacity, naming it (as OpenEnv's CAPACITY_REACHED does)."""

    name, version = "one_session", "1"
    open_sessions = 0
    lock = threading.Lock()

    def __init__(self) -> None:
        self.holding = False

    @classmethod
    def task_set(cls) -> TaskSet:
        return TaskSet("one-1", tuple(TaskSpec(task_id=f"one/eval/{i}", harness="one_session", prompt="Answer.", answer="0",
                                               difficulty=1, split="eval", meta={"family": "one"}) for i in range(2)))

    def reset(self, task_spec: TaskSpec) -> Observation:
        with OneSessionHarness.lock:
            if not self.holding:
                if OneSessionHarness.open_sessions >= 1:
                    raise EnvironmentBusy("Server at capacity: 1/1 sessions active (code: CAPACITY_REACHED)", capacity=1)
                OneSessionHarness.open_sessions += 1
                self.holding = True
        return Observation(text=task_spec.prompt)

    def step(self, action: Action) -> Observation:
        time.sleep(0.1)  # the session stays open a while, so the episodes started at once meet it
        return Observation(text="ok", done=True)

    def end_episode(self) -> None:
        with OneSessionHarness.lock:
            if self.holding:
                self.holding = False
                OneSessionHarness.open_sessions -= 1

    def close(self) -> None:
        self.end_episode()


def harness_checks(tmp_path, sandbox_root, concurrency: int) -> dict:
    """Stage 5's checks of the harness, with `rollout.concurrency` at `concurrency`."""
    from stages.s5_sandbox import _harness_checks

    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}", f"rollout.concurrency={concurrency}",
                                f"sandbox.root_dir={sandbox_root}", f'harnesses=[{{"name": "{NAME}"}}]'], env={})
    ctx = StageContext(loaded=loaded, run=create_run(loaded, command=["test"]), stage=5, title="sandbox and harnesses")
    checks = _harness_checks(ctx, NAME, replace(SandboxSettings.from_config(loaded.config.sandbox), root_dir=sandbox_root))
    return {c.name: c for c in checks}


def leaked_sleeps() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "-x", " ".join(LEAKED)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@needs_bwrap
def test_a_harness_that_leaks_a_process_only_under_concurrency_fails_stage_5_naming_it(tmp_path, sandbox_root):
    before = set(leaked_sleeps())
    checks = harness_checks(tmp_path, sandbox_root, concurrency=4)
    check = checks[f"harness {NAME}: concurrency"]
    assert check.status == CheckStatus.FAIL, check.detail
    assert check.measured["concurrency"] == 4 and check.measured["episodes"] == 8 and check.measured["failures"] == 0
    assert check.measured["leaks"]["processes"] >= 1 and "outlived them" in check.detail and "sleep 1000" in check.detail
    assert check.measured["leaks"]["sandbox_processes"] == 0 and check.measured["leaks"]["dirs"] == 0
    assert set(leaked_sleeps()) <= before  # the check ended what it found
    assert checks[f"harness {NAME}: clean reset"].status == CheckStatus.PASS  # one episode at a time: nothing wrong


@needs_bwrap
def test_the_same_harness_played_one_episode_at_a_time_passes(tmp_path, sandbox_root):
    check = harness_checks(tmp_path, sandbox_root, concurrency=1)[f"harness {NAME}: concurrency"]
    assert check.status == CheckStatus.PASS, check.detail
    assert check.measured["concurrency"] == 1 and check.measured["episodes"] == 2
    assert check.measured["leaks"] == {"processes": 0, "sandbox_processes": 0, "sandboxes_held": 0, "dirs": 0, "fds": 0}


def test_a_process_started_in_the_window_carries_the_mark_and_one_started_after_does_not():
    with leftover_processes.marked() as token:
        inside = subprocess.Popen(["sleep", "30"], start_new_session=True)
    outside = subprocess.Popen(["sleep", "30"])
    try:
        found = leftover_processes.carrying(token)
        assert inside.pid in found and outside.pid not in found and "sleep 30" in found[inside.pid]
        leftover_processes.end(found)
        assert leftover_processes.carrying(token) == {}  # dead when end returns (a zombie until reaped), never still running
        assert inside.wait(timeout=10) == -9 and leftover_processes.leftovers(token, settle_s=1) == {}
    finally:
        outside.kill()
        outside.wait()


def test_refusals_at_capacity_are_backpressure_capping_the_episodes_at_once_never_failures(tmp_path):
    from agentrl_cli.acceptance.harness_concurrency import play_at

    cfg = load_config(None, ["rollout.env_create_backoff_s=0.001", f'harnesses=[{{"name": "{ONE_SESSION}"}}]'], env={}).config
    played = play_at(cfg, ONE_SESSION, list(OneSessionHarness.task_set().tasks), 4, 8, tmp_path)
    assert played.clean and played.episodes == 8 and played.failures == [] and played.given_up == 0
    assert played.backpressure >= 1 and played.capped_at == 1 and OneSessionHarness.open_sessions == 0


@needs_bwrap
def test_hidden_tests_scored_at_the_pools_limit_never_wait_for_a_second_sandbox(tmp_path, sandbox_root):
    """code_sandbox_like's own reward runs its hidden tests in a fresh sandbox: with as many episodes
    at once as the pool holds sandboxes, each gives its episode's sandbox back first (else all wait)."""
    from agentrl_cli.acceptance.harness_concurrency import play_at
    from harnesses.registry import resolve

    name = "code_sandbox_like"
    sandbox_root.chmod(0o755)  # its sandboxes run as an unprivileged user, which must traverse the root
    sets = [f"sandbox.root_dir={sandbox_root}", "sandbox.max_concurrency=2", "sandbox.pool_size=2",
            f'harnesses=[{{"name": "{name}", "reward": "harness"}}]']
    cfg = load_config(None, sets, env={}).config
    tasks = [t for t in resolve(name).task_set().tasks if t.split == "eval"][:2]
    played = play_at(cfg, name, tasks, 2, 4, sandbox_root)
    assert played.clean and played.episodes == 4 and played.failures == [], (played.failures, played.leaks)
