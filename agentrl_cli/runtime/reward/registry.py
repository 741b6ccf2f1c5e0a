"""Reward scorers by name: the table of built-in scorers a config names in `reward.verifiers` (or a
task in `meta.verify`), loaded lazily, and user reward functions named by `module:function`.

A table row is "module:Class"; the class is built as `Class(config)` with the PlatformConfig and
implements the `Verifier` protocol (`verifiers.py`: `name`, `version`, `verify(req) -> Verdict`).
Its module is imported only when a config names it, so a scorer that needs a model costs nothing
to a run that does not use it.

A user reward function is any module-level callable (a function, or an instance with `__call__`)
named `module:function`. The contract:

    def my_reward(req: ScoreRequest) -> float | Verdict

It gets the whole scoring request (task, steps, final answer, files) and returns its score in
[0, 1], as a number (a bool counts as 0/1), or a `Verdict` to add flags and a detail. It is judged by
the rules every verifier is judged by (`scorer.py`): its name and version enter `verifier_versions`
and so the cache key (version: the callable's `__version__` attribute, else a hash of its source;
set `__version__` when its behaviour depends on code outside it); it runs under `reward.timeout_s`;
an exception, a score outside [0, 1] or any other return value is `infra_error` (retried, then
masked and counted, never a score); a trajectory that edited a protected file scores 0 with the
`tamper` flag before the function is called, and a `tamper` flag in its Verdict caps the reward at 0.
Not here: running verifiers, retries, caching (`scorer.py`); combining scores (`aggregate.py`).
"""

from __future__ import annotations

import hashlib
import inspect
import numbers

from agentrl_cli.core import parts
from agentrl_cli.core.errors import NotFoundError
from agentrl_cli.core.plugins import PLUGIN_PATH, import_target, load_class
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.verifiers import Verdict, Verifier, VerifierError
from harnesses.hidden_tests import tampered

VERIFIERS: dict[str, str] = parts.table(parts.VERIFIERS)  # reward.verifiers names (the rows: core/parts.py)


def function_version(fn, what: str) -> str:
    """`fn.__version__`, else `src-` and 12 hex digits of the sha256 of its source."""
    version = getattr(fn, "__version__", None)
    if version is not None:
        return str(version)
    try:
        source = inspect.getsource(fn if inspect.isroutine(fn) else type(fn))
    except (OSError, TypeError) as exc:
        raise NotFoundError(f"{what}: its source cannot be read to version it ({exc})",
                            "give it a `__version__` attribute (e.g. `my_reward.__version__ = \"1\"`)") from None
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


class FunctionVerifier:
    """A user reward function (`module:function`) behind the Verifier protocol."""

    def __init__(self, name: str, fn, version: str) -> None:
        self.name, self.fn, self.version = name, fn, version

    def verify(self, req: ScoreRequest) -> Verdict:
        bad = tampered(req.file_map(), req.protected)
        if bad:
            return Verdict(0.0, ["tamper"], f"protected files edited or deleted: {bad}")
        out = self.fn(req)
        if isinstance(out, Verdict):
            return out
        if isinstance(out, numbers.Real):
            return Verdict(float(out), detail=f"{self.name} gave {float(out):g}")
        raise VerifierError(f"reward function {self.name} returned {type(out).__name__} {out!r:.60}; "
                            "it must return a number in [0, 1] or a Verdict")


def build_verifier(name: str, config, key: str = "reward.verifiers") -> Verifier:
    """The scorer `name` stands for: a table row built as `Class(config)`, or the user reward
    function at the `module:function` path `name`. Raises NotFoundError (exit 2) naming `key` and
    the fix when the name is unknown or cannot be imported."""
    if name in VERIFIERS:
        if config is None:
            raise NotFoundError(f"{key}: verifier {name!r} is built from the platform config, and this scorer has none",
                                "build the scorer with Scorer.from_config(config)")
        return load_class("verifier", name, VERIFIERS, key)(config)
    if not PLUGIN_PATH.match(name):
        raise NotFoundError(f"{key}: unknown verifier {name!r}; registered: {', '.join(sorted(VERIFIERS))}",
                            f"set {key} to one of those or to a `module:function` path of a reward function")
    what = f"{key}: reward function {name!r}"
    fn = import_target(what, name)
    if isinstance(fn, type) or not callable(fn):
        raise NotFoundError(f"{what} is {'a class' if isinstance(fn, type) else type(fn).__name__}, not a function",
                            "point it at a function (or an instance with __call__) taking a ScoreRequest and "
                            "returning a number in [0, 1] or a Verdict")
    return FunctionVerifier(name, fn, function_version(fn, what))
