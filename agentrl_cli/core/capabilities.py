"""The capability matrix of the README, generated from the registries' rows (`parts.py`): which
training backend honours which feature, which weight-sync transport sends what, and the choices of
every other swappable part. A test fails when the README's copy is stale; rewrite it with

    python -m agentrl_cli.core.capabilities README.md

Belongs here: rendering the rows as Markdown and replacing the README's block. Does not: the rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl_cli.core import parts

START, END = "<!-- capability-matrix:start -->", "<!-- capability-matrix:end -->"
FEATURES = (("correction", "off-policy correction"), ("packing", "packing"), ("loss_aggregation", "loss aggregation"),
            ("lora", "LoRA"), ("sharding", "sharding over ranks"))


def _yes(flag: bool) -> str:
    return "yes" if flag else "-"


def matrix() -> str:
    """The block between the README's markers, markers excluded."""
    lines = ["| training backend (`training.backend`) | " + " | ".join(label for _, label in FEATURES) + " | how |",
             "|---|" + "---|" * (len(FEATURES) + 1)]
    lines += [f"| `{p.name}` | " + " | ".join(_yes(f in p.honours) for f, _ in FEATURES) + f" | {p.summary} |"
              for p in parts.BACKENDS]
    lines += ["", "| inference engine (`inference.engine`) | weight sync | LoRA at run time | pause modes | named `tool_choice` "
              "constrained | pipeline parallel (`inference.pp_size`) | image adds | what |", "|---|---|---|---|---|---|---|---|"]
    for p in parts.ENGINES:
        tagged = lambda tag: ", ".join(sorted(h.split(":", 1)[1] for h in p.honours if h.startswith(tag + ":"))) or "-"  # noqa: E731
        lines.append(f"| `{p.name}` | {tagged('transport')} | {_yes('adapters' in p.honours)} | {tagged('pause')} | "
                     f"{_yes('tool_choice' in p.honours)} | {_yes('pipeline_parallel' in p.honours)} | "
                     f"{', '.join(p.packages) or '-'} | {p.summary} |")
    lines += ["", "| weight sync (`training.weight_sync`) | full weights | LoRA adapter alone | how |", "|---|---|---|---|"]
    adapter = {p.name for p in parts.LORA_TRANSPORTS}
    lines += [f"| `{p.name}` | {_yes('full' in p.honours)} | {_yes(p.name in adapter)} | {p.summary} |" for p in parts.TRANSPORTS]
    lines += ["", "| part | config key | choices |", "|---|---|---|"]
    for label, key, rows in (("trajectory store", "data.store", parts.STORES),
                             ("job executor", "controlplane.executor", parts.EXECUTORS),
                             ("model verifier", "reward.verifiers", parts.VERIFIERS),
                             ("reward term", "reward.weights", parts.REWARD_TERMS)):
        choices = ", ".join(f"`{p.name}`" + (f" ({p.summary})" if p.summary else "") for p in rows)
        lines.append(f"| {label} | `{key}` | {choices} |")
    lines += ["", "Every row is a name and a `module:Class` in `agentrl_cli/core/parts.py`; a part of your own is a "
              "`module:Class` path in the same key, and says what it honours with a class attribute `honours` (an engine, "
              "with its `capabilities`)."]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the markers {START} and {END} are missing")
    return f"{head}{START}\n{block}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m agentrl_cli.core.capabilities README.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(replace_block(path.read_text(encoding="utf-8"), matrix()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
