"""The harness contract suite: every registered harness must pass it, so a new environment is
accepted by running this file. Reset cleanliness, scripted solutions, invalid actions, close frees
everything, versions reported.

    pytest tests/integration/test_harness_contract.py                          # every registered harness
    pytest tests/integration/test_harness_contract.py --harness my.mod:MyHarness  # one harness (repeatable)

Tasks come from the harness's own `task_set()` (or the committed task set); checks that need its
scripted solutions (`scripted_action`) or a wrong answer (`wrong_action`) are skipped, with the
reason, for a harness without those hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesses.base import Action, HarnessAdapter, HarnessReward, Observation, Trajectory, missing_members
from harnesses.defaults import WithDefaults
from harnesses.contract import INVALID_TEXTS, invalid_actions_handled, play, reset_clean, scripted_policy
from harnesses.registry import harness_version, registered, resolve
from harnesses.task_sources import builtin_or_own
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def harness_names(config) -> list[str]:
    """The harnesses under test: those named with --harness, else every registered one."""
    return list(config.getoption("--harness")) or sorted(registered())


def pytest_generate_tests(metafunc):
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", harness_names(metafunc.config))


@pytest.fixture
def harness(name):
    """The harness with the contract's defaults applied where it lacks an optional member, as training sees it."""
    h = WithDefaults(lambda: resolve(name)())
    yield h
    h.close()


def one_task_per_family(name: str, split: str = "train"):
    """The first task of every family of the harness's task set in `split` (all tasks count as one
    family when they carry no `meta.family`)."""
    first: dict = {}
    for task in builtin_or_own(name).select(split):
        first.setdefault(task.meta.get("family", ""), task)
    assert first, f"{name} has no {split} tasks"
    return list(first.values())


def test_all_three_builtins_are_registered_by_entry_point_too():
    assert {"terminal_like", "code_sandbox_like", "tool_api_like"} <= set(registered())


def test_contract_shape_and_version(harness, name):
    assert not missing_members(type(harness.inner)) and isinstance(harness, HarnessAdapter)
    assert isinstance(harness.name, str) and harness.name and isinstance(harness.version, str) and harness.version
    assert harness_version(name) == harness.version
    assert isinstance(harness.system_prompt(), str)
    for tool in harness.tools():
        assert tool["type"] == "function" and tool["function"]["name"] and tool["function"]["parameters"]["type"] == "object"


def test_scripted_solution_of_every_family_earns_full_reward(harness, name):
    policy = scripted_policy(harness)
    if policy is None:
        pytest.skip(f"{name} has no scripted solutions (no scripted_action hook)")
    for task in one_task_per_family(name):
        traj, last = play(harness, task, policy=policy)
        assert last.done, (task.task_id, last.text)
        assert all(o.status in ("ok", "empty") for o in traj.observations), [o.text for o in traj.observations]
        assert HarnessReward.of(harness.compute_reward(traj)).score == 1.0, task.task_id


def test_wrong_answer_earns_nothing(harness, name):
    wrong_action = getattr(type(harness.inner), "wrong_action", None)
    if wrong_action is None:
        pytest.skip(f"{name} names no wrong answer (no wrong_action hook)")
    task = one_task_per_family(name, "eval")[0]
    harness.reset(task)
    traj = Trajectory(task=task, actions=[Action(text=wrong_action(task))])
    assert harness.step(traj.actions[0]).done
    assert HarnessReward.of(harness.compute_reward(traj)).score == 0.0


def test_reset_is_clean_initial_observation_equal_after_destroy_and_rebuild(harness, name):
    for task in one_task_per_family(name, "eval"):
        ok, detail = reset_clean(harness, task)
        assert ok, detail


@pytest.mark.parametrize("text", INVALID_TEXTS)
def test_invalid_actions_become_invalid_action_observations(harness, name, text):
    harness.reset(one_task_per_family(name)[0])
    obs = harness.step(Action(text=text))
    assert isinstance(obs, Observation)
    assert obs.status in ("invalid_action", "error") and not obs.done, obs


def test_invalid_action_check_passes(harness, name):
    ok, detail = invalid_actions_handled(harness, one_task_per_family(name)[0])
    assert ok, detail


def test_step_before_reset_is_refused(harness):
    obs = harness.step(Action(text="ANSWER: 1"))
    assert obs.status == "invalid_action"


def test_close_frees_everything(name):
    h = resolve(name)()
    task = one_task_per_family(name)[0]
    h.reset(task)
    sandbox = getattr(h, "sandbox", None)
    service = getattr(h, "_service", None)
    pids = sandbox.processes() if sandbox is not None else set()
    h.close()
    if sandbox is not None:
        assert not sandbox.alive and not sandbox.base.exists()
        assert not any(Path(f"/proc/{p}").exists() for p in pids if p != 0) or _settled(pids)
    if service is not None:
        import httpx
        with pytest.raises(httpx.HTTPError):
            httpx.get(service.url + "/health", timeout=1)


def _settled(pids) -> bool:
    import time
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return True
        time.sleep(0.05)
    return False
