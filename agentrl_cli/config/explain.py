"""Turn pydantic validation errors into messages that name the key path, the bad value, the rule
and the fix. Also describes fields for `agentrl config show --describe` and the template."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Literal, Union

import annotated_types as at
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from agentrl_cli.config.models import PlatformConfig

MAX_ERRORS_SHOWN = 6


def format_validation_error(exc: ValidationError, data: dict, origins: dict[tuple, str], source: str) -> tuple[str, str]:
    errors = exc.errors(include_url=False)
    lines = [f"invalid config ({source}): {len(errors)} problem{'s' if len(errors) != 1 else ''}"]
    fixes = []
    for err in errors[:MAX_ERRORS_SHOWN]:
        loc = tuple(err["loc"])
        path = dotted(loc)
        origin = _origin(loc, origins, data, source)
        if err["type"] == "extra_forbidden":
            parent_model = model_at(loc[:-1])
            known = list(parent_model.model_fields) if parent_model else []
            guess = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            parent = dotted(loc[:-1]) or "the top level"
            mean = f"; did you mean {guess[0]}?" if guess else ""
            lines.append(f"  unknown key {path}  [from {origin}]{mean}")
            lines.append(f"    known keys in {parent}: {', '.join(known)}")
            prefix = (dotted(loc[:-1]) + ".") if loc[:-1] else ""
            fixes.append(f"rename {path} to {prefix}{guess[0]}" if guess else f"remove {path}")
            continue
        info = field_at(loc)
        shown = _short(err.get("input"))
        lines.append(f"  {path or '(top level)'} = {shown}  [from {origin}]")
        lines.append(f"    rule: {err['msg']}")
        if info is not None:
            allowed = describe_allowed(info)
            lines.append(f"    allowed: {allowed}" + (f"  ({info.description})" if info.description else ""))
            example = _example(info)
            fixes.append(f"set {path} to {allowed}" + (f", e.g. `--set {path}={example}`" if example is not None else ""))
        else:
            fixes.append(f"correct {path or 'the config'} as the rule says")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN} more")
    fixes.append("`agentrl config show --describe` lists every key with its meaning and default")
    return "\n".join(lines), "\n       ".join(fixes)


def dotted(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def _origin(loc: tuple, origins: dict[tuple, str], data: dict, source: str) -> str:
    for n in range(len(loc), 0, -1):
        if loc[:n] in origins:
            return origins[loc[:n]]
    return source


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] and return the inner annotation."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, dict):
        args = typing.get_args(annotation)
        return _model_of(args[-1]) if args else None
    return None


def model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class that holds keys at `loc` (ints index into lists)."""
    model: type[BaseModel] | None = PlatformConfig
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = model.model_fields.get(str(part))
        if info is None:
            return None
        model = _model_of(info.annotation)
    return model


def optional_section(loc: tuple) -> type[BaseModel] | None:
    """The section model of the field at `loc` when that field is an optional section (a model typed
    `Model | None`, off by default, e.g. training.lora); None for any other field."""
    parent = model_at(loc[:-1])
    info = parent.model_fields.get(str(loc[-1])) if parent is not None and loc else None
    if info is None:
        return None
    inner = _unwrap(info.annotation)
    optional = inner is not info.annotation
    return inner if optional and isinstance(inner, type) and issubclass(inner, BaseModel) else None


def field_at(loc: tuple) -> FieldInfo | None:
    """The field named at `loc`; union tags pydantic appends (e.g. 'int') are skipped."""
    for i in range(len(loc) - 1, -1, -1):
        name = loc[i]
        if isinstance(name, int):
            continue
        parent = model_at(loc[:i])
        if parent is not None and name in parent.model_fields:
            return parent.model_fields[name]
    return None


def describe_allowed(info: FieldInfo) -> str:
    ann = info.annotation
    optional = _unwrap(ann) is not ann
    ann = _unwrap(ann)
    origin = typing.get_origin(ann)
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if extra.get("choices"):  # a registry's names, or a plug-in path
        kind = "one of " + ", ".join(str(a) for a in extra["choices"]) + (f" or a `{extra['plugin']}` path" if extra.get("plugin") else "")
    elif origin is Literal:
        kind = "one of " + ", ".join(str(a) for a in typing.get_args(ann))
    elif ann is bool:
        kind = "true or false"
    elif ann is int:
        kind = "an integer"
    elif ann is float:
        kind = "a number"
    elif ann is str:
        kind = "text"
    elif ann is SecretStr:
        kind = "text (secret)"
    elif origin is list or ann is list:
        kind = "a list"
    elif origin is dict or ann is dict:
        kind = "a mapping"
    elif isinstance(ann, type) and issubclass(ann, BaseModel):
        kind = "a section with keys " + ", ".join(ann.model_fields)
    else:
        kind = str(ann)
    bounds = []
    for meta in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(meta, getattr(at, attr.capitalize())):
                bounds.append(f"{sym} {getattr(meta, attr)}")
        if isinstance(meta, at.MinLen) and meta.min_length:
            bounds.append(f"at least {meta.min_length} {'item' if kind == 'a list' else 'character'}(s)")
    text = kind + ("" if not bounds else " " + " and ".join(bounds))
    return text + (" (or null)" if optional else "")


def _example(info: FieldInfo) -> Any:
    if info.is_required():
        return None
    default = info.get_default(call_default_factory=True)
    if isinstance(default, (BaseModel, list, dict)) or default is None:
        return None
    if isinstance(default, bool):
        return str(default).lower()
    return default


def describe_keys(model: type[BaseModel] = PlatformConfig, prefix: str = "") -> list[tuple[str, str, str, Any]]:
    """(key path, allowed values, description, default) for every leaf key, in declaration order."""
    rows = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_of(info.annotation)
        if sub is not None and typing.get_origin(_unwrap(info.annotation)) is None:
            rows.extend(describe_keys(sub, path + "."))
        elif sub is not None:  # list of sections
            rows.extend(describe_keys(sub, path + "[]."))
        else:
            default = None if info.is_required() else info.get_default(call_default_factory=True)
            rows.append((path, describe_allowed(info), info.description or "", default))
    return rows
