"""Load, merge and validate the platform config; turn every mistake into a ConfigError.

Precedence, lowest first: built-in defaults < the YAML file < `AGENTRL_SECTION__KEY` environment
variables < `--set section.key=value` overrides. A secret key (a SecretStr field, e.g.
inference.api_key) also reads from a file named by `AGENTRL_SECTION__KEY_FILE` (how pods get the
Kubernetes Secrets mounted as files: the value never sits in argv or a ConfigMap). Lists in the file replace the default list whole;
list items are addressed by index (`--set harnesses.0.cpu=2`). Setting a key of an optional section
that is off (null by default, e.g. training.lora, reward.judge) turns the section on with its
defaults and sets that key (`--set training.lora.rank=16`). Values of overrides are parsed as
YAML scalars, so `8` is an int, `true` a bool and `[a, b]` a list.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from agentrl_cli.config.explain import format_validation_error, optional_section
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import AgentrlError, ConfigError
from agentrl_cli.core.parts import BACKEND_KNOBS, BACKENDS, ENGINE_KNOBS, ENGINES, refused_knobs

DEFAULT_CONFIG_NAME = "agentrl.yaml"
ENV_PREFIX = "AGENTRL_"


@dataclass
class LoadedConfig:
    """A validated config and where it came from."""

    config: PlatformConfig
    source: str  # path of the file, or "built-in defaults"
    overrides: list[str] = field(default_factory=list)

    @property
    def hash(self) -> str:
        return config_hash(self.config)

    def masked_overrides(self) -> list[str]:
        return [mask_override(o) for o in self.overrides]

    def resolved(self) -> dict[str, Any]:
        """The config as plain JSON-able data, secrets masked."""
        return self.config.model_dump(mode="json")


SECRET_WORDS = ("api_key", "apikey", "token", "password", "secret", "credential")


def mask_override(item: str) -> str:
    """`inference.api_key=sk-...` -> `inference.api_key=***`; other items unchanged."""
    key, sep, _ = item.partition("=")
    if sep and any(word in key.rsplit(".", 1)[-1].lower() for word in SECRET_WORDS):
        return f"{key}=***"
    return item


def secret_keys() -> list[tuple[str, str]]:
    """(section, key) of every SecretStr field of the config."""
    out = []
    for section, f in PlatformConfig.model_fields.items():
        model = f.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            out += [(section, name) for name, g in model.model_fields.items()
                    if SecretStr in (g.annotation, *getattr(g.annotation, "__args__", ()))]
    return out


def _read_secret_file(path: str, var: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"environment variable {var} names {path}, which cannot be read: {exc}",
                          f"point {var} at a readable file holding only the secret (e.g. a mounted Kubernetes Secret), "
                          "or unset it") from None


def config_hash(config: PlatformConfig) -> str:
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                env: Mapping[str, str] | None = None) -> LoadedConfig:
    """Resolve the config. `path=None` means ./agentrl.yaml if present, else built-in defaults."""
    env = os.environ if env is None else env
    overrides = list(overrides or [])
    data, source = _read_file(path)
    merged = _deep_merge(PlatformConfig().model_dump(mode="python"), data)
    origins: dict[tuple, str] = {}
    secret_files = {f"{section}.{name}_file": [section, name] for section, name in secret_keys()}
    for key, value in sorted(env.items()):
        if key.startswith(ENV_PREFIX) and "__" in key:
            dotted = key[len(ENV_PREFIX):].lower().replace("__", ".")
            if dotted in secret_files:
                parts, parsed = secret_files[dotted], _read_secret_file(value, key)
            else:
                parts, parsed = _split_path(dotted, f"environment variable {key}"), _parse_scalar(value)
            _set_path(merged, parts, parsed, f"environment variable {key}")
            origins[tuple(parts)] = f"environment variable {key}"
    for item in overrides:
        parts, value = _parse_set(item)
        _set_path(merged, parts, value, f"--set {item}")
        origins[tuple(parts)] = f"--set {item}"
    try:
        config = PlatformConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(*format_validation_error(exc, merged, origins, source)) from None
    refuse_unhonoured_knobs(config, source)
    refuse_turn_credit_without_step_rewards(config, source)
    return LoadedConfig(config=config, source=source, overrides=overrides)


def with_overrides(config: PlatformConfig, overrides: Mapping[str, Any], origin: str) -> PlatformConfig:
    """`config` with dotted-key `overrides` ({"training.learning_rate": 3e-4}) applied and validated
    again; a bad key or value raises ConfigError naming it and `origin`. Nested mappings are read as
    dotted keys ({"training": {"learning_rate": 1}} sets one key, it does not replace the section)."""
    data = config.model_dump(mode="python")
    origins: dict[tuple, str] = {}
    for key, value in _flatten(overrides):
        parts = _split_path(str(key), origin)
        _set_path(data, parts, value, f"{origin}: {key}")
        origins[tuple(parts)] = f"{origin}: {key}"
    try:
        config = PlatformConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(*format_validation_error(exc, data, origins, origin)) from None
    refuse_unhonoured_knobs(config, origin)
    refuse_turn_credit_without_step_rewards(config, origin)
    return config


def refuse_unhonoured_knobs(config: PlatformConfig, source: str) -> None:
    """A knob the chosen part does not honour (core/parts.py: the rows, and a `module:Class` part's
    `honours`) is refused at load, naming the part, the key and the fix."""
    try:
        refused = refused_knobs(BACKENDS, config.training.backend, "training.backend", config.training, BACKEND_KNOBS)
        refused += refused_knobs(ENGINES, config.inference.engine, "inference.engine", config.inference, ENGINE_KNOBS)
    except AgentrlError as exc:  # a `module:Class` part asked about a knob, which cannot be imported
        raise ConfigError(f"invalid config ({source}): {exc.message}", exc.hint) from None
    if refused:
        raise ConfigError(f"invalid config ({source}): " + "; ".join(what for what, _ in refused),
                          "; ".join(fix for _, fix in refused))


def refuse_turn_credit_without_step_rewards(config: PlatformConfig, source: str) -> None:
    """`training.advantage: turn` trains each turn on its step rewards: a configured harness that
    reports none (no `step_rewards` class attribute) is refused at load, naming it."""
    if config.training.advantage != "turn":
        return
    from harnesses.registry import step_rewards

    try:
        without = [h.name for h in config.harnesses if not step_rewards(h.name)]
    except AgentrlError as exc:  # a harness that cannot be resolved: said as it is
        raise ConfigError(f"invalid config ({source}): training.advantage: turn: {exc.message}", exc.hint) from None
    if without:
        raise ConfigError(f"invalid config ({source}): training.advantage: turn needs step rewards, and harness "
                          f"{', '.join(repr(n) for n in without)} reports none (its class does not declare step_rewards = True), "
                          "so every turn would train on the outcome alone",
                          "set training.advantage: episode, or train on a harness that reports a reward per step "
                          "(openenv, agent; a harness of your own declares step_rewards = True and puts each step's "
                          "reward in its observation's info[\"reward\"])")


def _flatten(mapping: Mapping[str, Any], prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _read_file(path: str | os.PathLike | None) -> tuple[dict, str]:
    if path is None:
        if not Path(DEFAULT_CONFIG_NAME).exists():
            return {}, "built-in defaults"
        path = DEFAULT_CONFIG_NAME
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"config file not found: {p}",
                          f"run `agentrl init` to write {DEFAULT_CONFIG_NAME} from the template, or pass --config PATH to an existing file")
    if p.is_dir():
        raise ConfigError(f"config path is a directory, not a file: {p}", "pass --config PATH/TO/agentrl.yaml")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}", "check the file's permissions and that it is UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML in {p}{where}: {problem}",
                          "fix the YAML syntax there (indentation with spaces, `key: value` pairs); "
                          "`agentrl init --force` writes a fresh template") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of sections (model:, rollout:, ...), not a {type(data).__name__}",
                          "start from the template: `agentrl init`")
    return data, str(p)


def _deep_merge(base: Any, update: Any) -> Any:
    if isinstance(base, dict) and isinstance(update, dict):
        out = dict(base)
        for k, v in update.items():
            out[k] = _deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(update)


def _parse_set(item: str) -> tuple[list, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad --set {item!r}: expected KEY.PATH=VALUE",
                          "for example `--set rollout.concurrency=8` or `--set harnesses.0.cpu=2`")
    return _split_path(key.strip(), f"--set {item}"), _parse_scalar(raw)


def _split_path(key: str, origin: str) -> list:
    parts = key.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"bad key path {key!r} in {origin}: empty segment",
                          "use dotted names like rollout.concurrency (list items by index: harnesses.0.cpu)")
    return [int(p) if p.isdigit() else p for p in parts]


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _section_defaults(loc: list) -> dict | None:
    """The defaults of the optional section at `loc` as plain data, or None when `loc` is no optional
    section. A section with a required key starts empty: validation then names the missing key."""
    model = optional_section(tuple(loc))
    if model is None:
        return None
    try:
        return model().model_dump(mode="python")
    except ValidationError:
        return {}


def _set_path(data: dict, parts: list, value: Any, origin: str) -> None:
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        here = ".".join(str(p) for p in parts[: i + 1])
        if isinstance(node, list):
            if not isinstance(part, int) or not -len(node) <= part < len(node):
                raise ConfigError(f"{origin}: {here} is not an item of a list of {len(node)}",
                                  f"use an index from 0 to {len(node) - 1}")
            node = node[part]
        elif isinstance(node, dict):
            if node.get(part) is None and (section := _section_defaults(parts[: i + 1])) is not None:
                node[part] = section  # an optional section that is off: on, with its defaults
            if part not in node or not isinstance(node[part], (dict, list)):
                node[part] = {} if part not in node else node[part]
                if not isinstance(node[part], (dict, list)):
                    raise ConfigError(f"{origin}: {here} is a value, not a section", f"set {here}=VALUE instead")
            node = node[part]
        else:  # pragma: no cover - guarded above
            raise ConfigError(f"{origin}: cannot descend into {here}", "check the key path")
    last = parts[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or not -len(node) <= last < len(node):
            raise ConfigError(f"{origin}: index {last} is outside a list of {len(node)}", f"use an index from 0 to {len(node) - 1}")
    node[last] = value
