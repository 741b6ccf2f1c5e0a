"""The harness contract suite: every registered harness must pass it, so a new environment is
accepted by running this file. Reset cleanliness, scripted solutions, invalid actions, close frees
everything, versions reported.

    pytest tests/integration/test_harness_contract.py                          # every registered harness
    pytest tests/integration/test_harness_contract.py --harness my.mod:MyHarness  # one harness (repeatable)
    pytest tests/integration/test_harness_contract.py --harness my.mod:MyHarness --harness-config plug.yaml

Each harness is built and given its tasks as `agentrl harness check NAME --config PLATFORM_YAML`
and training build them: from the `harnesses[]` entry of its name in the platform config
`--harness-config` names (its `tasks` file, its `options` as constructor arguments), read from the
directory pytest was started in, so relative paths in it mean what they mean to `agentrl harness
check`. An entry is required for every harness named with --harness. Without --harness-config,
tasks come from the harness's own `task_set()` (or the committed task set). Checks that need its
scripted solutions (`scripted_action`) or a wrong answer (`wrong_action`) are skipped, with the
reason, for a harness without those hooks."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from agentrl_cli.config.models import HarnessConfig
from harnesses.base import Action, HarnessAdapter, HarnessReward, Observation, Trajectory, missing_members
from harnesses.defaults import WithDefaults
from harnesses.contract import INVALID_TEXTS, invalid_actions_handled, play, reset_clean, scripted_policy
from harnesses.registry import create, harness_version, registered
from harnesses.task_sources import task_set
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def harness_names(config) -> list[str]:
    """The harnesses under test: those named with --harness, else every registered one."""
    return list(config.getoption("--harness")) or sorted(registered())


@lru_cache(maxsize=None)
def _load(path: Path):
    from agentrl_cli.config.load import load_config
    from agentrl_cli.core.errors import ConfigError

    try:
        return load_config(path, env={}).config
    except ConfigError as exc:
        raise pytest.UsageError(f"--harness-config {path}: {exc.message}\n  fix: {exc.hint}") from None


def platform_config(config):
    """The platform config --harness-config names (relative to where pytest was started), or None."""
    option = config.getoption("--harness-config")
    return None if option is None else _load(config.invocation_params.dir / option)


def pytest_generate_tests(metafunc):
    if "name" in metafunc.fixturenames:
        names, platform = harness_names(metafunc.config), platform_config(metafunc.config)
        if platform is not None:
            entries = {h.name for h in platform.harnesses}
            lacking = [n for n in metafunc.config.getoption("--harness") if n not in entries]
            if lacking:
                raise pytest.UsageError(
                    f"--harness-config {metafunc.config.getoption('--harness-config')} has no harnesses[] entry "
                    f"named {', '.join(lacking)} (it has: {', '.join(sorted(entries)) or 'none'})\n"
                    f"  fix: add `- name: {lacking[0]}` with its tasks: and options: under harnesses:")
        metafunc.parametrize("name", names)


@pytest.fixture
def platform(request, isolated, monkeypatch):
    """The platform config of --harness-config (or None); with one, tests run in the directory pytest
    was started in, where `agentrl harness check --config` would read its relative paths."""
    config = platform_config(request.config)
    if config is not None:
        monkeypatch.chdir(request.config.invocation_params.dir)
    return config


@pytest.fixture
def entry(name, platform) -> HarnessConfig:
    """The harness's harnesses[] entry: the config's, else one with nothing but its name."""
    found = next((h for h in platform.harnesses if h.name == name), None) if platform is not None else None
    return found or HarnessConfig(name=name)


@pytest.fixture
def harness(name, platform):
    """The harness with the contract's defaults applied where it lacks an optional member, as training sees it."""
    h = WithDefaults(lambda: create(name, platform))
    yield h
    h.close()


@pytest.fixture
def first_tasks(entry, platform):
    """first_tasks(split) -> the first task of every family of the harness's tasks in `split` (all
    tasks count as one family when they carry no `meta.family`)."""
    def first(split: str = "train"):
        found: dict = {}
        for task in task_set(entry, platform.data if platform is not None else None).select(split):
            found.setdefault(task.meta.get("family", ""), task)
        assert found, f"{entry.name} has no {split} tasks"
        return list(found.values())
    return first


def test_all_three_builtins_are_registered_by_entry_point_too():
    assert {"terminal_like", "code_sandbox_like", "tool_api_like"} <= set(registered())


def test_contract_shape_and_version(harness, name):
    assert not missing_members(type(harness.inner)) and isinstance(harness, HarnessAdapter)
    assert isinstance(harness.name, str) and harness.name and isinstance(harness.version, str) and harness.version
    assert harness_version(name) == harness.version
    assert isinstance(harness.system_prompt(), str)
    for tool in harness.tools():
        assert tool["type"] == "function" and tool["function"]["name"] and tool["function"]["parameters"]["type"] == "object"


def test_scripted_solution_of_every_family_earns_full_reward(harness, name, first_tasks):
    policy = scripted_policy(harness)
    if policy is None:
        pytest.skip(f"{name} has no scripted solutions (no scripted_action hook)")
    for task in first_tasks():
        traj, last = play(harness, task, policy=policy)
        assert last.done, (task.task_id, last.text)
        assert all(o.status in ("ok", "empty") for o in traj.observations), [o.text for o in traj.observations]
        assert HarnessReward.of(harness.compute_reward(traj)).score == 1.0, task.task_id


def test_wrong_answer_earns_nothing(harness, name, first_tasks):
    wrong_action = getattr(type(harness.inner), "wrong_action", None)
    if wrong_action is None:
        pytest.skip(f"{name} names no wrong answer (no wrong_action hook)")
    task = first_tasks("eval")[0]
    harness.reset(task)
    traj = Trajectory(task=task, actions=[Action(text=wrong_action(task))])
    assert harness.step(traj.actions[0]).done
    assert HarnessReward.of(harness.compute_reward(traj)).score == 0.0


def test_reset_is_clean_initial_observation_equal_after_destroy_and_rebuild(harness, first_tasks):
    for task in first_tasks("eval"):
        ok, detail = reset_clean(harness, task)
        assert ok, detail


@pytest.mark.parametrize("text", INVALID_TEXTS)
def test_invalid_actions_become_invalid_action_observations(harness, first_tasks, text):
    harness.reset(first_tasks()[0])
    obs = harness.step(Action(text=text))
    assert isinstance(obs, Observation)
    assert obs.status in ("invalid_action", "error") and not obs.done, obs


def test_invalid_action_check_passes(harness, first_tasks):
    ok, detail = invalid_actions_handled(harness, first_tasks()[0])
    assert ok, detail


def test_step_before_reset_is_refused(harness):
    obs = harness.step(Action(text="ANSWER: 1"))
    assert obs.status == "invalid_action"


def test_close_frees_everything(name, platform, first_tasks):
    h = create(name, platform)
    task = first_tasks()[0]
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
