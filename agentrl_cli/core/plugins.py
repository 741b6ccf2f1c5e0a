"""Load a swappable part by name: a row of its registry (name -> "module:Class") or a
`module:Class` path written in the config. An unknown name lists what is registered; a path that
cannot be imported says why. Used by the registries of training backends, weight transports and
harnesses."""

from __future__ import annotations

import importlib
import re

from agentrl_cli.core.errors import NotFoundError

PLUGIN_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_class(kind: str, name: str, registry: dict[str, str], key: str) -> type:
    """The class `name` stands for in `registry`, or at the `module:Class` path `name`.
    `kind` and `key` (the config key that named it) go into the error."""
    target = registry.get(name, name if ":" in name else None)
    if target is None:
        raise NotFoundError(f"{key}: unknown {kind} {name!r}; registered: {', '.join(sorted(registry))}",
                            f"set {key} to one of those or to a `module:Class` path")
    return import_target(f"{key}: {kind} {name!r}", target)


def import_target(what: str, target: str) -> type:
    """The object at the `module:Class` path `target`; `what` names it in the error."""
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise NotFoundError(f"{what} points at {target!r}, which cannot be loaded: {exc}",
                            "check the module path and that its package is installed") from None
