"""Render `templates/platform.yaml` from the models: every key with its default and a comment
giving its meaning and allowed values, so the template can never drift from the code.

Regenerate with `python -m agentrl_cli.config.template > templates/platform.yaml`.
"""

from __future__ import annotations

import typing

import yaml
from pydantic import BaseModel

from agentrl_cli.config.explain import _model_of, _unwrap, describe_allowed
from agentrl_cli.config.models import PlatformConfig

HEADER = """\
# agentrl platform config, written by `agentrl init`.
# Every key is shown with its default, which works on one CPU box with the embedded parts.
# Precedence: built-in defaults < this file < AGENTRL_SECTION__KEY env vars < --set key.path=value.
# `agentrl config validate` checks it; `agentrl config show --describe` explains every key.
"""


def _scalar(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("\n...").strip()


def _render_model(obj: BaseModel, indent: int, first_prefix: str = "") -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for i, (name, info) in enumerate(type(obj).model_fields.items()):
        value = getattr(obj, name)
        prefix = first_prefix if i == 0 and first_prefix else pad
        sub = _model_of(info.annotation)
        comment = f"{pad}# {info.description}"
        if sub is not None and value is None:  # an optional section that is off: its keys as a comment
            lines += [comment, f"{prefix}{name}: null", f"{pad}# to turn it on, replace null with (defaults shown):"]
            lines += [f"{pad}# {line[indent:]}" for line in _render_model(sub(), indent + 2) if not line.lstrip().startswith("#")]
        elif sub is not None and typing.get_origin(_unwrap(info.annotation)) is None:
            lines += [comment, f"{prefix}{name}:"] + _render_model(value, indent + 2)
        elif sub is not None:
            lines += [comment, f"{prefix}{name}:"]
            for item in value:
                lines += _render_model(item, indent + 4, first_prefix=" " * (indent + 2) + "- ")
        else:
            dumped = value.get_secret_value() if hasattr(value, "get_secret_value") else value
            lines += [f"{comment} [{describe_allowed(info)}]", f"{prefix}{name}: {_scalar(dumped)}"]
    return lines


def render_template() -> str:
    cfg = PlatformConfig()
    out = [HEADER]
    for name, info in PlatformConfig.model_fields.items():
        value = getattr(cfg, name)
        out.append(f"# {info.description}")
        if isinstance(value, list):
            out.append(f"{name}:")
            for item in value:
                out += _render_model(item, 4, first_prefix="  - ")
        else:
            out.append(f"{name}:")
            out += _render_model(value, 2)
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render_template(), end="")
