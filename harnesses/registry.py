"""Find harness classes by name: the `agentrl.harnesses` entry-point group (the one registration
source: the built-ins are registered there too, by agentrl's own package metadata in pyproject.toml),
or a `module:Class` path. An unknown name lists what is registered.

The entry points are read once per process: reading them parses every installed distribution's
metadata (about 12 ms with torch, transformers and DeepSpeed installed, holding the GIL), and a
rollout resolves a harness for every episode it starts. A harness package installed while a
process runs is seen by the next process.
"""

from __future__ import annotations

import functools
from importlib import metadata

from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.core.plugins import import_target
from harnesses.base import CONTRACT_VERSION, MULTI_AGENT_MEMBERS, REQUIRED_MEMBERS, missing_members
from harnesses.multi_agent import is_multi_agent

ENTRY_POINT_GROUP = "agentrl.harnesses"


def registered() -> dict[str, str]:
    """name -> "module:Class" of the installed entry points (the built-ins among them)."""
    return dict(_registered())


@functools.cache
def _registered() -> dict[str, str]:
    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def resolve(name: str) -> type:
    """The harness class for a registered name or a `module:Class` path."""
    target = _registered().get(name, name if ":" in name else None)
    if target is None:
        known = ", ".join(sorted(registered())) or "none (is agentrl installed? `pip install -e .` registers the built-ins)"
        raise NotFoundError(f"unknown harness {name!r}; registered: {known}",
                            f"use a registered name, a `module:Class` path, or register one under the "
                            f"`{ENTRY_POINT_GROUP}` entry-point group")
    cls = import_target(f"harness {name!r}", target)
    missing = missing_members(cls)
    if missing:
        raise ConfigError(f"harness {name!r} ({target}) does not implement harness contract {CONTRACT_VERSION}: "
                          f"missing {', '.join(missing)}",
                          f"define {', '.join(missing)} on the class (harnesses/base.py: required members "
                          f"{', '.join(REQUIRED_MEMBERS)}, and with `roles` also {', '.join(MULTI_AGENT_MEMBERS)}; "
                          "the others are optional, with defaults)")
    return cls


def reward_source(harness_config) -> str:
    """Where a configured harness's training reward comes from: `harnesses[].reward`, else the class's
    `reward_source`, else "verifiers" ("harness" for a multi-agent harness: its role_rewards).
    `harness` and `mix` need the class's compute_reward (ConfigError), which a multi-agent harness
    has by default (`harnesses.multi_agent.episode_reward`)."""
    cls = resolve(harness_config.name)
    multi_agent = is_multi_agent(cls)
    source = (getattr(harness_config, "reward", None) or getattr(cls, "reward_source", None)
              or ("harness" if multi_agent else "verifiers"))
    if source not in ("verifiers", "harness", "mix"):
        raise ConfigError(f"harness {harness_config.name!r}: reward_source {source!r} is not verifiers, harness or mix",
                          "set harnesses[].reward, or fix the class's reward_source attribute")
    allowed = tuple(getattr(cls, "reward_sources", ("verifiers", "harness", "mix")))
    if source not in allowed:
        raise ConfigError(f"harness {harness_config.name!r} cannot use reward: {source}; it allows {', '.join(allowed)}",
                          f"set harnesses[].reward to one of {', '.join(allowed)} (or leave it unset)")
    if source != "verifiers" and not hasattr(cls, "compute_reward") and not multi_agent:
        raise ConfigError(f"harness {harness_config.name!r} has reward: {source}, but defines no compute_reward",
                          "define compute_reward(trajectory) on the harness, or set harnesses[].reward: verifiers")
    return source


def step_rewards(name: str) -> bool:
    """Whether the harness reports a reward per step (its `step_rewards` class attribute; default False)."""
    return bool(getattr(resolve(name), "step_rewards", False))


def harness_version(name: str) -> str:
    """The contract version a harness reports, or a plain reason why it is not available."""
    try:
        cls = resolve(name)
    except NotFoundError:
        return "unavailable: not registered"
    except ConfigError:
        return "unavailable: does not implement the harness contract"
    return str(getattr(cls, "version", "unknown"))


def uses_sandboxes(name: str) -> bool:
    """Whether the harness acts through sandboxes (so a run gives it a sandbox pool)."""
    from harnesses.sandboxed import SandboxHarness

    return issubclass(resolve(name), SandboxHarness)


def create(name: str, platform_config=None, *, sandboxes=None, **kwargs):
    """The one way to build a harness: an instance configured from the platform config.

    A sandboxed harness gets `sandboxes` when given (a pool or provider the caller owns), else the
    sandbox service (`sandbox.service_url`) or local sandboxes with the configured `sandbox.*` limits
    and the harness's own (`cpu`, `memory_gb`, network allowlist), and the rollout's step timeout; `harnesses[].options` become constructor arguments. `sandboxes`
    is ignored for harnesses that use none, and an image (`harnesses[].image`) set on one is refused
    (ConfigError: it would run in no image while its entry says it does)."""
    from harnesses.sandboxed import SandboxHarness

    cls = resolve(name)
    if platform_config is not None:
        entry = next((h for h in platform_config.harnesses if h.name == name), None)
        if entry is not None and entry.image and not issubclass(cls, SandboxHarness):
            from agentrl_cli.core.errors import ConfigError

            raise ConfigError(f"harnesses[{name}].image is {entry.image!r}, but {name} acts through no sandbox: "
                              "its episodes would not run in that image",
                              f"remove image from the {name} entry (its environment is the service it calls)")
        options = dict(entry.options) if entry is not None else {}
        kwargs = {**options, **kwargs}
    if issubclass(cls, SandboxHarness):
        if sandboxes is None and platform_config is not None:
            sandboxes = _sandboxes_for(name, platform_config)
        if sandboxes is not None:
            kwargs["sandboxes"] = sandboxes
        if platform_config is not None:
            kwargs.setdefault("step_timeout_s", platform_config.rollout.step_timeout_seconds)
    return cls(**kwargs)


def _sandboxes_for(name: str, platform_config):
    from agentrl_cli.envs.sandbox.provider import DirectProvider, harness_settings, service_provider

    hc = next((h for h in platform_config.harnesses if h.name == name), None)
    if platform_config.sandbox.service_url or hc is None:
        return service_provider(platform_config.sandbox, hc)
    return DirectProvider(harness_settings(platform_config.sandbox, hc))
