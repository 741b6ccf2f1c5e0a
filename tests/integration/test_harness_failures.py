"""A harness written to the contract as seed 003 states it (name, version, reset, step,
compute_reward, close; no evidence, system_prompt, tools or full_reset) trains with the defaults
agentrl applies; a harness whose own code raises never hangs a run: its episodes end `infra_error`
(masked, so their groups complete), are counted per harness and method, and past
`rollout.max_harness_errors` failures in a row the run stops naming the harness, the method and the
exception."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.rollout.harness_errors import HarnessFailed
from agentrl_cli.run.training_run import train
from harnesses.base import CONTRACT_VERSION, Observation
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


class Seed003Harness:
    name = "seed003"
    version = "0.1"

    def reset(self, task_spec):
        self.task = task_spec
        return Observation(text=task_spec.prompt)

    def step(self, action):
        return Observation(text="recorded", done=True)

    def compute_reward(self, trajectory) -> float:
        return 1.0

    def close(self) -> None:
        self.task = None


class Seed003Scored(Seed003Harness):
    """Seed 003's members only, scoring its own episodes: a reply of at most 43 characters earns 1
    (about half of a random tiny model's 16-token replies, so rewards vary within a group)."""

    def step(self, action):
        self.reply = action.text.strip()
        return Observation(text="recorded", done=True)

    def compute_reward(self, trajectory) -> float:
        return float(0 < len(trajectory.actions[-1].text.strip()) <= 43)


class BrokenReward(Seed003Harness):
    def compute_reward(self, trajectory) -> float:
        raise KeyError("score table")


class BrokenStep(Seed003Harness):
    def step(self, action):
        raise RuntimeError("the environment fell over")


class SometimesBroken(Seed003Harness):
    calls = 0

    def step(self, action):
        SometimesBroken.calls += 1
        if SometimesBroken.calls % 10 == 0:
            raise RuntimeError("one step in ten fails")
        return super().step(action)


def config(tmp_path, random_model_dir, harness: str, reward: str | None = None, **extra):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"s3/{split}/{i}", "prompt": f"Say something short about {w}.",
                                         "answer": w, "split": split, "difficulty": 1,
                                         "meta": {"family": "s3", "verify": "regex", "pattern": "(?s).{1,43}"}}) + "\n"
                             for split in ("train", "eval") for i, w in enumerate(["sea", "sky", "sun", "tree"])))
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 16, "rollout.concurrency": 4, "rollout.group_size": 2,
            "rollout.max_steps_per_trajectory": 1, "rollout.mode": "sync", "training.micro_batch_size": 4,
            "training.checkpoint_interval_steps": 100, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir),
            **extra}
    harnesses = json.dumps([{"name": f"{__name__}:{harness}", "tasks": str(tasks), **({"reward": reward} if reward else {})}])
    return load_config(None, [f"{k}={v}" for k, v in sets.items()] + [f"harnesses={harnesses}"], env={}).config


def test_a_harness_with_only_the_seed_contract_trains_with_agentrls_defaults(tmp_path, random_model_dir):
    summary = asyncio.run(train(config(tmp_path, random_model_dir, "Seed003Harness"), tmp_path / "run", random_model_dir, 2,
                                run_id="seed003"))
    c = summary.counters
    assert summary.steps == 2 and c.get("episode_errors", 0) == 0 and c.get("termination_infra_error", 0) == 0
    assert not [k for k in c if "/harness_errors/" in k]
    assert all(isinstance(m["train/loss"], float) for m in summary.metrics)


def test_a_harness_whose_step_always_raises_stops_the_run_naming_it(tmp_path, random_model_dir):
    cfg = config(tmp_path, random_model_dir, "BrokenStep", **{"rollout.max_harness_errors": 4})
    t0 = time.perf_counter()
    with pytest.raises(HarnessFailed) as info:
        asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 50, run_id="broken"))
    elapsed = time.perf_counter() - t0
    message = info.value.message
    assert "BrokenStep" in message and "step()" in message and "RuntimeError: the environment fell over" in message
    assert "in 4 episodes in a row" in message and "rollout.max_harness_errors" in info.value.hint
    assert elapsed < 300, elapsed  # stopped at the failures, not at a timeout (training.step_wait_timeout_s)


def test_a_harness_failing_one_step_in_ten_trains_to_the_end_with_those_episodes_masked(tmp_path, random_model_dir):
    SometimesBroken.calls = 0
    summary = asyncio.run(train(config(tmp_path, random_model_dir, "SometimesBroken"), tmp_path / "run", random_model_dir, 6,
                                run_id="sometimes"))
    c = summary.counters
    failed = c[f"env/{__name__}:SometimesBroken/harness_errors/step"]
    assert summary.steps == 6 and failed >= 2 and c["termination_infra_error"] == failed
    assert sum(m["reward/masked"] for m in summary.metrics) >= 1
    assert summary.metrics[-1][f"env/{__name__}:SometimesBroken/harness_errors/step"] >= 1


class HangsInStep(Seed003Harness):
    """Every third call of reset() or step() hangs, deaf to close(), until the test ends (HANG_S at
    most); an instance asked to reset while one of its calls still runs in another thread counts an
    overlap, and one closed during its hang counts as retired."""

    HANG_S = 120.0
    calls = overlaps = retired = ended_by_cap = 0
    hung: Counter = Counter()
    guard, test_over = threading.Lock(), threading.Event()

    def __init__(self) -> None:
        self.in_call = False

    def reset(self, task_spec):
        if self.in_call:
            type(self).overlaps += 1
        self.maybe_hang("reset")
        return super().reset(task_spec)

    def step(self, action):
        self.maybe_hang("step")
        return super().step(action)

    def maybe_hang(self, method: str) -> None:
        with self.guard:
            type(self).calls += 1
            if type(self).calls % 3:
                return
        self.in_call = True
        type(self).hung[method] += 1
        if not self.test_over.wait(self.HANG_S):
            type(self).ended_by_cap += 1
        self.in_call = False

    def close(self) -> None:
        if self.in_call:
            type(self).retired += 1
        super().close()


def test_a_harness_hanging_in_step_ends_its_episode_timeout_at_the_step_deadline_and_the_run_goes_on(tmp_path, random_model_dir):
    """Two harness threads (rollout.concurrency 2) and hangs that ignore close(): without a thread in
    place of each hung one the rollout would stall; the hung instances are retired, never lent again;
    a hung step ends its episode `timeout` (scored), a hung reset `infra_error` (masked: no tokens)."""
    HangsInStep.calls = HangsInStep.overlaps = HangsInStep.retired = HangsInStep.ended_by_cap = 0
    HangsInStep.hung = Counter()
    HangsInStep.test_over.clear()
    cfg = config(tmp_path, random_model_dir, "HangsInStep", **{"rollout.step_timeout_seconds": 1, "rollout.concurrency": 2})
    try:
        t0 = time.perf_counter()
        summary = asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 2, run_id="hangs"))
        elapsed = time.perf_counter() - t0
        hung = dict(HangsInStep.hung)
    finally:
        HangsInStep.test_over.set()  # the hung threads return now
    c = summary.counters
    assert summary.steps == 2 and hung["step"] >= 1 and hung["reset"] >= 1, hung
    assert c["termination_timeout"] == hung["step"] and c["termination_infra_error"] == hung["reset"]
    assert c["env_calls_abandoned"] == sum(hung.values()) and all(isinstance(m["train/loss"], float) for m in summary.metrics)
    assert elapsed < HangsInStep.HANG_S and HangsInStep.ended_by_cap == 0  # no episode waited for a hang to end
    assert HangsInStep.overlaps == 0  # an instance whose call still hangs is never lent to the next episode
    deadline = time.monotonic() + 10
    while HangsInStep.retired < sum(hung.values()) and time.monotonic() < deadline:  # closed on threads of their own
        time.sleep(0.05)
    assert HangsInStep.retired == sum(hung.values())
    from agentrl_cli.runtime.data.stores import open_store
    from agentrl_cli.runtime.data.writer import read_records

    records = read_records(open_store(cfg.data))
    timed_out = [r for r in records if r.outcome == "timeout"]
    assert len(timed_out) == hung["step"]
    assert all((r.steps[-1].observation_status, r.steps[-1].observation) == ("timeout", "step took longer than 1 s")
               for r in timed_out)
    lost = [r for r in records if r.reward_status == "infra_error"]
    assert len(lost) == hung["reset"] and all("environment_unavailable" in r.flags and not r.token_ids for r in lost)


class NoStep:
    name, version = "nostep", "0.1"

    def reset(self, task_spec):
        return Observation(text=task_spec.prompt)

    def close(self) -> None:
        pass


def test_a_harness_missing_a_required_member_is_refused_at_load_naming_it(cli, write_yaml):
    write_yaml(f"harnesses:\n  - name: '{__name__}:NoStep'\n")
    result = cli("stage", "run", "0")
    assert result.exit_code == 2
    assert "missing step" in result.stderr and f"harness contract {CONTRACT_VERSION}" in result.stderr
    assert not list((write_yaml("", "x.txt").parent / "runs").glob("*"))  # refused before any run was created


def test_a_seed_contract_harness_scoring_itself_trains_through_stage_8_smoke(cli, write_yaml, quick_sets, tmp_path):
    tasks = tmp_path / "own-tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"own/{split}/{i}", "prompt": f"Say something short about {w}.",
                                         "answer": w, "split": split}) + "\n"
                             for split in ("train", "eval") for i, w in enumerate(["sea", "sky", "sun", "tree"])))
    write_yaml(f"harnesses:\n  - name: '{__name__}:Seed003Scored'\n    reward: harness\n    tasks: '{tasks}'\n"
               f"data:\n  root: '{tmp_path / 'store'}'\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "rollout.max_steps_per_trajectory=1")
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    from agentrl_cli.runtime.data.stores import open_store
    from agentrl_cli.runtime.data.writer import read_records

    records = [r for r in read_records(open_store(load_config(None, [f"data.root={tmp_path / 'store'}"], env={}).config.data))
               if r.reward_status != "infra_error"]
    assert records
    for r in records:  # the stored outcome is the harness's own score of that reply (the task's answer plays no part)
        reply = r.steps[-1].action.strip()
        assert r.reward_components["outcome"] == float(0 < len(reply) <= 43)
    assert len({r.reward_components["outcome"] for r in records}) == 2


def test_a_compute_reward_that_raises_masks_the_episode_and_stops_the_run_naming_it(tmp_path, random_model_dir):
    cfg = config(tmp_path, random_model_dir, "BrokenReward", reward="harness", **{"rollout.max_harness_errors": 3})
    with pytest.raises(HarnessFailed) as info:
        asyncio.run(train(cfg, tmp_path / "run", random_model_dir, 50, run_id="broken-reward"))
    assert "compute_reward() raised in 3 episodes in a row" in info.value.message and "KeyError" in info.value.message


def test_stage_0_troubleshoot_and_verify_name_a_harness_whose_step_always_raises(cli, write_yaml, quick_sets, tmp_path):
    """The runbook as a user meets it: stage 0 stops at the failures with exit 1 and the harness's
    hint; `troubleshoot --run` ranks the harness first; verify's run stops the same way, a failing check."""
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"b/{s}/{i}", "prompt": "hi", "answer": "x", "split": s}) + "\n"
                             for s in ("train", "eval") for i in range(4)))
    write_yaml(f"harnesses:\n  - name: '{__name__}:BrokenStep'\n    tasks: '{tasks}'\n"
               f"rollout:\n  max_harness_errors: 4\ndata:\n  root: '{tmp_path / 'store'}'\n")
    result, report = cli.json("verify", "--layer", "correctness", *quick_sets)  # a new run: verify trains on its own
    stopped = report["layers"]["correctness"][0]
    assert result.exit_code == 1 and stopped["status"] == "fail" and "step() raised" in stopped["detail"], report
    assert "agentrl harness check" in stopped["hint"]
    result, data = cli.json("stage", "run", "0", *quick_sets, "--run-id", "broken-step")
    loop = data["reports"][0]["checks"][0]
    assert result.exit_code == 1 and loop["status"] == "fail"
    assert "BrokenStep': step() raised in 4 episodes in a row: RuntimeError: the environment fell over" in loop["detail"]
    assert "agentrl harness check" in loop["hint"]
    result, found = cli.json("troubleshoot", "--run", "broken-step", *quick_sets)
    assert result.exit_code == 1 and found["findings"][0]["id"] == "harness-code-failing", found
