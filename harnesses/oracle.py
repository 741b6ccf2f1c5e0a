"""Scripted solutions by task: a facade over the harnesses' own `scripted_action` hooks (each
built-in harness keeps its solutions in its folder). They drive the contract tests, the stage-5
checks, replay tests and the supervised warm start of the built-in model.

`oracle_action(task, turn)` returns the action text for `turn` (0-based) of `task`, or None when the
episode should be over; `terse_action` and `slip_action` are the warm start's other styles, where a
harness has them (`terse_action` / `slip_action` hooks; otherwise the plain solution).
"""

from __future__ import annotations

from collections.abc import Mapping

from harnesses.base import TaskSpec
from harnesses.parsing import tool_call

__all__ = ["ORACLES", "SLIPS", "oracle_action", "reference_solution", "slip_action", "terse_action",
           "terse_slip_action", "tool_call"]


def __getattr__(name: str):
    if name == "LIST_SOLUTIONS":  # the code harness's gold functions, by kind
        from harnesses.code_sandbox_like.solutions import LIST_SOLUTIONS

        return LIST_SOLUTIONS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reference_solution(task: TaskSpec) -> str:
    """The gold solution.py of a code task (the reward's null/gold check uses it)."""
    from harnesses.code_sandbox_like.solutions import reference_solution

    return reference_solution(task)


def _cls(harness: str):
    from harnesses.registry import resolve

    return resolve(harness)


class _Hooks(Mapping):
    """harness name -> a class hook, for the registered harnesses that define it."""

    def __init__(self, hook: str, value=lambda cls, fn: fn) -> None:
        self.hook, self.value = hook, value

    def _names(self) -> list[str]:
        from harnesses.registry import registered

        out = []
        for name in sorted(registered()):
            try:
                if getattr(_cls(name), self.hook, None) is not None:
                    out.append(name)
            except Exception:  # noqa: BLE001 - a plugin that cannot be loaded has no hooks to offer
                continue
        return out

    def __getitem__(self, name: str):
        from agentrl_cli.core.errors import NotFoundError

        try:
            cls = _cls(name)
        except NotFoundError:
            raise KeyError(name) from None
        fn = getattr(cls, self.hook, None)
        if fn is None:
            raise KeyError(name)
        return self.value(cls, fn)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


ORACLES: Mapping = _Hooks("scripted_action")  # harness -> scripted_action(task, turn)
SLIPS: Mapping = _Hooks("SLIP", value=lambda cls, text: text)  # harness -> what its slip gets wrong


def oracle_action(task: TaskSpec, turn: int) -> str | None:
    """The scripted action for `turn` (0-based) of `task`, or None when the episode is over."""
    return _cls(task.harness).scripted_action(task, turn)


def slip_action(task: TaskSpec, turn: int, echo: bool = True) -> str | None:
    """The scripted solution with the harness's one plausible slip that fails the hidden tests (its
    `SLIP`), where the harness has one; otherwise the plain solution. The warm start's
    demonstrations carry it at a fixed rate (`agentrl_cli/model/demos.py`), for reinforcement
    learning to find and unlearn."""
    hook = getattr(_cls(task.harness), "slip_action", None)
    return hook(task, turn, echo=echo) if hook is not None else oracle_action(task, turn)


def terse_slip_action(task: TaskSpec, turn: int) -> str | None:
    """`slip_action` in the terser style."""
    return slip_action(task, turn, echo=False)


def terse_action(task: TaskSpec, turn: int) -> str | None:
    """The same solution in a terser style where a harness has one (code written without echoing
    solution.py back: shorter by 35 tokens, and nothing to check the file with)."""
    hook = getattr(_cls(task.harness), "terse_action", None)
    return hook(task, turn) if hook is not None else oracle_action(task, turn)
