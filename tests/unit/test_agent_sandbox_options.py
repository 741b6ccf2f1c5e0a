"""The `agent` harness's `sandbox` option and its Harbor tasks are checked at load: each mistake a
ConfigError naming the option and the fix; a good config loads the shipped Harbor tasks."""

from __future__ import annotations

import pytest

from agentrl_cli.core.errors import ConfigError
from harnesses.agent import AgentHarness


def needs_no_sandbox(task, base_url, api_key):
    return "done"


def takes_a_sandbox(task, base_url, api_key, sandbox):
    return sandbox.exec("true").status


@pytest.mark.parametrize("options,named", [
    ({"entry": f"{__name__}:takes_a_sandbox", "sandbox": "yes"}, "options.sandbox must be true or false"),
    ({"command": "python3 a.py", "sandbox": True}, "a command always runs in a sandbox"),
    ({"entry": f"{__name__}:needs_no_sandbox", "sandbox": True}, "takes no `sandbox` argument"),
    ({"entry": f"{__name__}:takes_a_sandbox", "tasks": "harbor"}, "tasks: harbor needs an agent in a sandbox"),
])
def test_a_bad_sandbox_option_is_refused_at_load_naming_it(options, named):
    with pytest.raises(ConfigError) as info:
        AgentHarness.task_set(options)
    assert named in info.value.message


def test_a_sandboxed_entry_on_harbor_tasks_loads_the_shipped_tasks_with_their_workdir_mapped():
    tasks = AgentHarness.task_set({"entry": f"{__name__}:takes_a_sandbox", "sandbox": True, "tasks": "harbor"}).tasks
    assert {t.meta["harbor"]["name"].split("/")[-1] for t in tasks} == {"count-lines", "fix-script", "write-greeting"}
    harness = AgentHarness(entry=f"{__name__}:takes_a_sandbox", sandbox=True, tasks="harbor")
    shown = harness.reset(tasks[0]).text
    assert "Your working directory is /work." in shown and harness.in_sandbox
