"""The harness contract suite: every registered harness must pass it, so a new environment is
accepted by running this file. Reset cleanliness, scripted solutions, invalid actions, close frees
everything, versions reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesses.base import Action, HarnessAdapter, Observation, Trajectory
from harnesses.contract import INVALID_TEXTS, invalid_actions_handled, play, reset_clean
from harnesses.registry import harness_version, registered, resolve
from harnesses.tasks import HARNESS_FAMILIES, load_tasks
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
NAMES = sorted(registered())


@pytest.fixture(params=NAMES)
def harness(request):
    h = resolve(request.param)()
    yield h
    h.close()


def _one_task_per_family(name: str, split: str = "train"):
    return [load_tasks(name, split, family)[0] for family in HARNESS_FAMILIES[name]]


def test_all_three_builtins_are_registered_by_entry_point_too():
    assert {"terminal_like", "code_sandbox_like", "tool_api_like"} <= set(NAMES)


def test_contract_shape_and_version(harness):
    assert isinstance(harness, HarnessAdapter)
    assert harness.name in NAMES and isinstance(harness.version, str) and harness.version
    assert harness_version(harness.name) == harness.version
    assert harness.system_prompt().strip()
    for tool in harness.tools():
        assert tool["type"] == "function" and tool["function"]["name"] and tool["function"]["parameters"]["type"] == "object"


def test_scripted_solution_of_every_family_earns_full_reward(harness):
    for task in _one_task_per_family(harness.name):
        traj, last = play(harness, task)
        assert last.done, (task.task_id, last.text)
        assert all(o.status in ("ok", "empty") for o in traj.observations), [o.text for o in traj.observations]
        assert harness.compute_reward(traj) == 1.0, task.task_id


def test_wrong_answer_earns_nothing(harness):
    task = load_tasks(harness.name, "eval", "arith")[0]
    harness.reset(task)
    wrong = {"terminal_like": "ANSWER: -1", "code_sandbox_like": "```python\nopen('solution.py','w').write('def solve():\\n    return -1\\n')\n```\nSUBMIT",
             "tool_api_like": '<tool_call>{"name": "final_answer", "arguments": {"answer": -1}}</tool_call>'}[harness.name]
    traj = Trajectory(task=task, actions=[Action(text=wrong)])
    assert harness.step(traj.actions[0]).done
    assert harness.compute_reward(traj) == 0.0


def test_reset_is_clean_initial_observation_equal_after_destroy_and_rebuild(harness):
    for task in _one_task_per_family(harness.name, "eval"):
        ok, detail = reset_clean(harness, task)
        assert ok, detail


@pytest.mark.parametrize("text", INVALID_TEXTS)
def test_invalid_actions_become_invalid_action_observations(harness, text):
    harness.reset(_one_task_per_family(harness.name)[0])
    obs = harness.step(Action(text=text))
    assert isinstance(obs, Observation)
    assert obs.status in ("invalid_action", "error") and not obs.done, obs


def test_invalid_action_check_passes(harness):
    ok, detail = invalid_actions_handled(harness, _one_task_per_family(harness.name)[0])
    assert ok, detail


def test_step_before_reset_is_refused(harness):
    obs = harness.step(Action(text="ANSWER: 1"))
    assert obs.status == "invalid_action"


def test_close_frees_everything():
    for name in NAMES:
        h = resolve(name)()
        task = _one_task_per_family(name)[0]
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
