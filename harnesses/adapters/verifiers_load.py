"""Options of the `verifiers` harness and the taskset they name, loaded once per process and checked
for what the adapter can score (`harnesses.adapters.verifiers_env` has the harness itself).

    harnesses:
      - name: verifiers
        options: {taskset: "my_pkg.tasks:MyTaskset", config: {num_tasks: 64}, eval_fraction: 0.2}

Options (all optional):
- `taskset`: a `module:attr` path to a verifiers v1 `Taskset` instance, a `Taskset` subclass (built
  with its own config type from `config`) or a factory (called with `config` as keyword arguments,
  returning a Taskset); or the id of an installed verifiers taskset package (`vf.load_taskset`).
  Default: our example, `harnesses.adapters.verifiers_example:ArithmeticTaskset`.
- `config`: the taskset's config fields, or the factory's arguments. Default {}.
- `max_tasks`: keep the first N tasks (`Taskset.head`); needed for an infinite taskset.
- `eval_fraction`: the share of tasks held out for eval when the taskset has no splits (0 < x < 1,
  default 0.25).
- `submit_pattern`, `instruction`, `reward_range`: how an episode is played and scored
  (`verifiers_env`).

Splits: the taskset's own when every task's data has a `split` field (train; eval, test,
validation, dev and val count as eval); else a task is eval when the first 8 hex digits of
sha256(its key) fall in the lowest `eval_fraction` of their range (stable under adding tasks),
with at least one task in each split. TaskSet version: `verifiers-<package version>-<digest>` of
the target, the config, every task's content hash and split, and the reward functions' names and
weights.

Refused at load (exit 2, naming the fix): tasks needing a container, a runtime, tools or a judge
model (the adapter scores offline, with the task's reward functions only), a task class without
reward functions, no tasks, duplicate task keys.

Belongs here: options, loading, checks, the TaskSpecs. Not here: playing or scoring an episode.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from functools import lru_cache

import verifiers
import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.utils.generic import concrete_type

from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.core.plugins import import_target
from harnesses.base import TaskSet, TaskSpec

NAME = "verifiers"
DEFAULT_TASKSET = "harnesses.adapters.verifiers_example:ArithmeticTaskset"
DEFAULT_SUBMIT = r"(?im)^\s*ANSWER\s*:\s*\S|\\boxed\{"
DEFAULT_INSTRUCTION = "Solve the task. End your reply with a line `ANSWER: <your answer>` (or give it as \\boxed{...})."
DEFAULTS = {"taskset": DEFAULT_TASKSET, "config": {}, "max_tasks": None, "eval_fraction": 0.25,
            "submit_pattern": DEFAULT_SUBMIT, "instruction": DEFAULT_INSTRUCTION, "reward_range": [0.0, 1.0]}
EVAL_SPLITS = ("eval", "test", "validation", "dev", "val")


@dataclass(frozen=True)
class Loaded:
    """A loaded taskset: agentrl's task id -> the verifiers task, and the TaskSet made of them."""

    target: str
    tasks: dict  # task_id -> vf.Task
    task_set: TaskSet


def options_key(options: dict | None) -> str:
    """`options` with the defaults applied, as sorted JSON (the cache key); unknown keys are refused."""
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"harnesses[{NAME}].options: unknown key(s) {', '.join(unknown)}", f"use only {', '.join(DEFAULTS)}")
    return json.dumps({**DEFAULTS, **(options or {})}, sort_keys=True, default=str)


def load(options: dict | None) -> Loaded:
    """The taskset `options` name, loaded and checked (cached per process)."""
    return _load(options_key(options))


@lru_cache(maxsize=16)
def _load(key: str) -> Loaded:
    o = json.loads(key)
    frac, limit = o["eval_fraction"], o["max_tasks"]
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise ConfigError(f"harnesses[{NAME}].options.eval_fraction: {frac!r} is not a number between 0 and 1",
                          "set eval_fraction to e.g. 0.25")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"harnesses[{NAME}].options.max_tasks: {limit!r} is not a positive integer", "set max_tasks to e.g. 64")
    if not isinstance(o["config"], dict):
        raise ConfigError(f"harnesses[{NAME}].options.config: {o['config']!r} is not a mapping", "give the taskset's config fields")
    taskset = build_taskset(o["taskset"], o["config"])
    if taskset.INFINITE and limit is None:
        raise ConfigError(f"harnesses[{NAME}]: taskset {o['taskset']!r} is infinite", "set options.max_tasks to the number to train on")
    tasks = list(taskset.head(limit) if limit is not None else taskset)
    if not tasks:
        raise ConfigError(f"harnesses[{NAME}]: taskset {o['taskset']!r} yields no tasks", "check options.config")
    for task in {type(t): t for t in tasks}.values():
        check_scorable(task, taskset, o["taskset"])
    family = type(tasks[0]).__name__
    splits = own_splits(tasks) or hashed_splits(tasks, frac)
    specs, by_id = [], {}
    for task, split in zip(tasks, splits):
        key = str(task.key)
        task_id = f"{NAME}/{family}/{key[:16] if len(key) == 64 else key}"
        if task_id in by_id:
            raise ConfigError(f"harnesses[{NAME}]: two tasks of {o['taskset']!r} have the key {key!r}",
                              "task keys must be unique within a taskset (override Task.key, or drop the duplicates)")
        by_id[task_id] = task
        specs.append(task_spec(task, task_id, split, family, o["taskset"]))
    return Loaded(o["taskset"], by_id, TaskSet(version(o, tasks, splits), tuple(specs)))


def build_taskset(target: str, config: dict):
    """The verifiers Taskset at `target` (see the module docstring for what it may name)."""
    if ":" not in target:
        try:
            return vf.load_taskset(vf.taskset_config_type(target).model_validate({**config, "id": target}))
        except (ImportError, TypeError, AttributeError, ValueError) as exc:
            raise ConfigError(f"harnesses[{NAME}].options.taskset: {target!r} is not an installed verifiers taskset: {exc}",
                              "install its package, or give a `module:attr` path to a Taskset, its class or a factory") from None
    try:
        obj = import_target(f"harnesses[{NAME}].options.taskset", target)
    except NotFoundError as exc:
        raise ConfigError(exc.message, exc.hint) from None
    try:
        if isinstance(obj, vf.Taskset):
            if config:
                raise ConfigError(f"harnesses[{NAME}].options.config is set, but {target!r} is a built Taskset",
                                  "drop options.config, or point options.taskset at the Taskset class or a factory")
            return obj
        if isinstance(obj, type) and issubclass(obj, vf.Taskset):
            config_type = concrete_type(obj, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
            return obj(config_type.model_validate(config))
        built = obj(**config) if callable(obj) else None
    except ValidationError as exc:
        raise ConfigError(f"harnesses[{NAME}].options.config does not fit {target!r}: {exc}",
                          "give only the taskset config's fields, with valid values") from None
    except TypeError as exc:
        raise ConfigError(f"harnesses[{NAME}].options.taskset: calling {target!r} with options.config failed: {exc}",
                          "give the factory's keyword arguments in options.config") from None
    if not isinstance(built, vf.Taskset):
        raise ConfigError(f"harnesses[{NAME}].options.taskset: {target!r} gave {type(built).__name__}, not a verifiers v1 Taskset",
                          "point it at a vf.Taskset, a Taskset subclass or a function returning one")
    return built


def needs_runtime(fn) -> bool:
    """Whether a scoring function needs a runtime (as verifiers' `Task.score` decides)."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def check_scorable(task, taskset, target: str) -> None:
    """ConfigError unless `task` can be played and scored without a runtime, tools or a judge model."""
    what = f"harnesses[{NAME}]: taskset {target!r} (task class {type(task).__name__})"
    hint = "the verifiers adapter scores offline with the task's own reward functions; use a taskset without it"
    problems = []
    if task.NEEDS_CONTAINER or type(task).setup is not vf.Task.setup or type(task).finalize is not vf.Task.finalize:
        problems.append("needs a container or a setup/finalize hook")
    if type(task).toolsets(task.config) or type(taskset).toolsets(taskset.config):
        problems.append("offers tools (toolsets)")
    if task.config.judges:
        problems.append("is scored by a judge model (task.judges)")
    rewards = task.hooks("reward")
    late = [fn.__name__ for fn in (*task.hooks("metric"), *rewards) if needs_runtime(fn)]
    if late:
        problems.append(f"has reward or metric functions that need a runtime: {', '.join(late)}")
    if not rewards:
        problems.append("has no reward functions (@vf.reward or task.rewards)")
    if problems:
        raise ConfigError(f"{what} {'; '.join(problems)}", hint)


def own_splits(tasks) -> list[str] | None:
    """train/eval from every task's `data.split`, or None when some task has none."""
    found = [getattr(t.data, "split", None) or (t.data.model_extra or {}).get("split") for t in tasks]
    if any(not isinstance(s, str) for s in found):
        return None
    return ["eval" if s.lower() in EVAL_SPLITS else "train" for s in found]


def hashed_splits(tasks, fraction: float) -> list[str]:
    """eval for the tasks whose key hashes below `fraction`, with at least one task in each split."""
    points = [int(hashlib.sha256(str(t.key).encode()).hexdigest()[:8], 16) / 16 ** 8 for t in tasks]
    splits = ["eval" if p < fraction else "train" for p in points]
    if len(tasks) > 1 and "eval" not in splits:
        splits[points.index(min(points))] = "eval"
    if len(tasks) > 1 and "train" not in splits:
        splits[points.index(max(points))] = "train"
    return splits


def task_spec(task, task_id: str, split: str, family: str, target: str) -> TaskSpec:
    data = task.data
    answer = getattr(data, "answer", None)
    meta = {"family": family, "taskset": target, "key": str(task.key), "hash": task.hash}
    for hook in ("scripted_reply", "wrong_reply"):  # the adapter's optional hooks on a task class
        reply = getattr(task, hook, None)
        if callable(reply):
            meta[hook] = reply()
    return TaskSpec(task_id=task_id, harness=NAME, prompt=data.prompt_text, difficulty=1, split=split, meta=meta,
                    answer=answer if isinstance(answer, (str, int, float)) or answer is None else str(answer))


def version(o: dict, tasks, splits) -> str:
    rewards = sorted({(fn.__name__, getattr(fn, "_vf_weight", 1.0)) for t in {type(t): t for t in tasks}.values()
                      for fn in t.hooks("reward")})
    blob = json.dumps({"taskset": o["taskset"], "config": o["config"], "rewards": rewards,
                       "tasks": [[t.hash, s] for t, s in zip(tasks, splits)]}, sort_keys=True, default=str)
    return f"verifiers-{verifiers.__version__}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"
