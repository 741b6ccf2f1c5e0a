"""Old import paths of modules that moved when `agentrl_cli/` was grouped into wings, kept
working: importing one returns the module at its new path and warns (DeprecationWarning) with the
new path and the version the old one goes away in. Belongs here: the table of moves and the import
hook that serves it. Does not: anything a module of agentrl_cli imports (new code uses new paths)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.3.0"

# old path (under agentrl_cli.) -> new path(s); a module split in two lists both, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "episode": ("core.episode",), "outcomes": ("core.outcomes",), "errors": ("core.errors",),
    "report": ("core.report",), "plugins": ("core.plugins",), "environment": ("core.environment",),
    "fsutil": ("core.fsutil",), "httpclient": ("core.httpclient",), "logstreams": ("core.logstreams",),
    "rundir": ("core.rundir", "acceptance.run_meta"), "serving": ("core.serving",),
    "observe.progress": ("core.progress",), "observe.redaction": ("core.redaction",),
    "data.redact": ("core.redact",), "security": ("core.security",),
    "sandbox": ("envs.sandbox",), "tools": ("envs.tools",),
    "inference": ("engines.inference",), "openai_api": ("engines.openai_api",), "gateway": ("engines.gateway",),
    "rollout.resume": ("engines.resume",), "weightsync.group": ("engines.weight_group",),
    "rollout": ("runtime.rollout",), "reward": ("runtime.reward",), "data": ("runtime.data",),
    "observe": ("runtime.observe",),
    "plan": ("ops.plan",), "netplan": ("ops.netplan",), "controlplane": ("ops.controlplane",),
    "image": ("ops.image",), "bench": ("ops.bench",),
    "training": ("learner",),
    "loop": ("run.loop",), "supervise": ("run.supervise",),
    "runbook": ("acceptance.runbook",), "context": ("acceptance.context",), "baseline": ("acceptance.baseline",),
    "harness_probe": ("acceptance.harness_probe",), "verify": ("acceptance.verify",),
    "troubleshoot": ("acceptance.troubleshoot",), "evaluation": ("acceptance.evaluation",),
    "select": ("acceptance.select",), "chaos": ("acceptance.chaos",),
    "observe.run_record": ("acceptance.run_record",), "observe.run_data": ("acceptance.run_data",),
    "observe.run_report": ("acceptance.run_report",), "observe.plots": ("acceptance.plots",),
    "observe.alerts": ("acceptance.alerts",),
    "app": ("cli.app",), "render": ("cli.render",), "commands": ("cli.commands",),
}
# `agentrl_cli.run` was the module that is now `agentrl_cli.run.training_run`: the `run` wing's
# package answers its old names itself (agentrl_cli/run/__init__.py).


def new_paths(fullname: str) -> tuple[str, ...] | None:
    """The new path(s) of an old `agentrl_cli.…` module name, or None when it did not move."""
    if not fullname.startswith("agentrl_cli."):
        return None
    parts = fullname.split(".")[1:]
    for i in range(len(parts), 0, -1):
        hit = MOVED.get(".".join(parts[:i]))
        if hit:
            rest = parts[i:]
            return tuple(".".join(["agentrl_cli", new, *rest]) for new in (hit if not rest else hit[:1]))
    return None


def deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path goes away in agentrl {REMOVED_IN}",
                  DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.Loader):
    """Hands the import system the module already loaded at its new path, and gives it back its own
    `__spec__` and `__loader__` (the import system sets them to the old name's on the way)."""

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.own = (getattr(module, "__spec__", None), getattr(module, "__loader__", None))

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__, module.__loader__ = self.own


class _Split(types.ModuleType):
    """An old module whose names now live in several new ones, or an old package some of whose
    modules moved elsewhere than the rest: its names are looked up where they went."""

    __path__: list[str] = []  # a package to the import system; the finder answers for its modules

    def __init__(self, name: str, targets: tuple[str, ...]):
        super().__init__(name)
        self._targets = targets

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if f"{self.__name__}.{attr}"[len("agentrl_cli."):] in MOVED:
            return importlib.import_module(f"{self.__name__}.{attr}")
        for target in self._targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} (moved to {', '.join(self._targets)})")


class MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        targets = new_paths(fullname)
        if not targets:
            return None
        deprecated(fullname, " and ".join(targets))
        old = fullname[len("agentrl_cli."):]
        split = len(targets) > 1 or any(key.startswith(old + ".") for key in MOVED)
        module = _Split(fullname, targets) if split else importlib.import_module(targets[0])
        return importlib.util.spec_from_loader(fullname, _Alias(module))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
