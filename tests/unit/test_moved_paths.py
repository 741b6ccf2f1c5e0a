"""Paths from before the wings keep working (agentrl_cli/_moved.py): every old module imports as the
module at its new path, warns naming the new path and the version the old one goes away in, and the
documented `module:Class` paths of before still load."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from agentrl_cli import _moved
from agentrl_cli.core.plugins import import_target

# a sample of the documented `module:Class` / `module:function` paths of the last release before the wings
DOCUMENTED = {
    "agentrl_cli.training.deepspeed_backend:DeepSpeedBackend": "agentrl_cli.learner.deepspeed_backend",
    "agentrl_cli.training.fsdp_backend:FSDPBackend": "agentrl_cli.learner.fsdp_backend",
    "agentrl_cli.weightsync.disk:DiskTransport": "agentrl_cli.weightsync.disk",
    "agentrl_cli.weightsync.group:open_group": "agentrl_cli.engines.weight_group",
    "agentrl_cli.reward.judge:JudgeVerifier": "agentrl_cli.runtime.reward.judge",
    "agentrl_cli.data.local_store:LocalStore": "agentrl_cli.runtime.data.local_store",
    "agentrl_cli.episode:Action": "agentrl_cli.core.episode",
    "agentrl_cli.report:StageReport": "agentrl_cli.core.report",
    "agentrl_cli.run:TrainingRun": "agentrl_cli.run.training_run",
    "agentrl_cli.rundir:create_run": "agentrl_cli.acceptance.run_meta",
    "agentrl_cli.rundir:get_run": "agentrl_cli.core.rundir",
    "agentrl_cli.app:main": "agentrl_cli.cli.app",
}


def run_python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter: the modules are imported for the first time, so the hook answers."""
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_old_module_path_is_the_module_at_its_new_path(old):
    new = _moved.new_paths(f"agentrl_cli.{old}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the warning itself: test_an_old_path_warns_...
        module = importlib.import_module(f"agentrl_cli.{old}")
    if len(new) == 1 and not any(k.startswith(old + ".") for k in _moved.MOVED):
        assert module is importlib.import_module(new[0])
        assert module.__spec__.name == new[0]  # the module keeps its own spec
    else:  # split, or a package some of whose modules went elsewhere: names are looked up where they went
        assert module._targets == new


@pytest.mark.parametrize("path,home", sorted(DOCUMENTED.items()))
def test_a_documented_path_of_before_still_loads_the_same_object(path, home):
    module, _, name = path.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert import_target(path, path) is getattr(importlib.import_module(home), name)


def test_an_old_path_warns_naming_the_new_path_and_the_version():
    done = run_python("import agentrl_cli.training.grpo as g; print(g.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "agentrl_cli.learner.grpo"
    assert "agentrl_cli.training.grpo moved to agentrl_cli.learner.grpo" in done.stderr
    assert f"goes away in agentrl {_moved.REMOVED_IN}" in done.stderr


def test_names_from_a_package_some_of_whose_modules_moved_elsewhere_resolve():
    done = run_python("from agentrl_cli.observe import alerts, keys, redaction; "
                      "print(alerts.__name__, keys.__name__, redaction.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["agentrl_cli.acceptance.alerts", "agentrl_cli.runtime.observe.keys",
                                   "agentrl_cli.core.redaction"]


def test_the_old_run_module_name_still_gives_the_training_run():
    done = run_python("from agentrl_cli.run import TrainingRun; print(TrainingRun.__module__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "agentrl_cli.run.training_run" and "DeprecationWarning" in done.stderr


def test_new_code_imports_no_old_path():
    done = run_python("import warnings; warnings.simplefilter('error', DeprecationWarning); "
                      "import agentrl_cli.cli.app, agentrl_cli.run.training_run, stages.s8_training")
    assert done.returncode == 0, done.stderr
