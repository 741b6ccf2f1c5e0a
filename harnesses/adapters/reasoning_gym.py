"""reasoning_gym: reasoning-gym's procedurally generated tasks as a harness, scored by the
dataset's own `score_answer`.

    harnesses:
      - name: reasoning_gym
        options: {dataset: letter_counting, size: 32, seed: 1, config: {max_words: 9}, levels: [0, 2]}

Options (all optional): `dataset` (a name `reasoning_gym.create_dataset` knows; default
letter_counting: a short question with a one- or two-digit answer a tiny model can learn), `size`
(tasks per split and level, default 32), `seed` (default 1), `config` (the dataset's config fields),
`levels` (reasoning-gym curriculum levels, 0-based: one set of tasks per level, the curriculum's
fields over `config`) and `prompt` (a style of `reasoning_gym.utils.SYSTEM_PROMPTS`, default direct).

Tasks: train from `seed + LEVEL_STRIDE * level`, eval from that plus EVAL_OFFSET (reasoning-gym
draws entry i from Random(seed + i), so the splits share no draw while size < LEVEL_STRIDE); an eval
question that also appears in train is dropped. Each TaskSpec's meta holds all a later re-scoring
needs (dataset, config, seed, size, the entry as JSON) plus `family` (the dataset) and `level`;
its difficulty is level + 1, or without `levels` the highest curriculum level the config reaches.

Episode (one answer): the question and a line asking for `<answer>...</answer>`. A reply with an
answer (reasoning_gym.utils.extract_answer's tag, else a line `ANSWER: X`) ends the episode; a reply
without one is an `invalid_action` that asks for the tag, and the episode goes on. An episode that
ends without an answer (the turn limit) is scored on its last reply's last non-empty line, as the
dataset's lenient scorer rates it (most give 0 to text that lacks the answer; the default one gives
len(answer) / len(text) to text containing it). No reply at all scores 0 without the scorer; a
scorer that raises on the answer scores it 0 (the dataset could not read it). Entries without an
oracle answer (e.g. rush_hour's) have no scripted solution. A task file may mark a task
`meta.demonstration: worked`: its scripted solution then writes the entry's expression and result
before the tag (`2 * 5 = 10`, then `<answer>10</answer>`), the form a small model that computes in
prose can imitate (`agentrl model sft` learns from scripted solutions).

Belongs here: options, tasks, the episode and scoring through the package. Not here: how training
picks the reward source (`harnesses[].reward`; this class's `reward_source` is "harness").
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

try:
    import reasoning_gym
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import DATASETS, create_curriculum, has_curriculum
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
except ImportError as exc:  # the registry reports this as "cannot be loaded: ..."
    raise ImportError(f"the reasoning-gym package is not installed ({exc}); install it with "
                      "`pip install -e '.[envs]'` in agentrl's checkout (reasoning-gym==0.1.25)") from exc

from agentrl_cli.core.errors import ConfigError
from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.parsing import parse_answer

DEFAULTS = {"dataset": "letter_counting", "size": 32, "seed": 1, "config": {}, "levels": None, "prompt": "direct"}
EVAL_OFFSET = 1_000_003  # eval seed = train seed + this
LEVEL_STRIDE = 10_007  # each curriculum level's seeds sit this far apart; size must stay below it
INSTRUCTION = "Give your final answer between <answer> and </answer> tags."
NO_ANSWER = "no answer found: give your final answer between <answer> and </answer> tags (this task has no tools)"
WRONG_CANDIDATES = ("none", "-987654321", "x")
META_KEYS = ("dataset", "config", "seed", "size", "entry")  # what scoring reads from a task's meta


@dataclass(frozen=True)
class Options:
    dataset: str
    size: int
    seed: int
    config: dict
    levels: tuple[int, ...] | None
    prompt: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def parse_options(options: dict | None) -> Options:
    """`harnesses[].options` checked against reasoning-gym (ConfigError naming the key and the fix)."""
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"harnesses[reasoning_gym].options: unknown key(s) {', '.join(unknown)}",
                          f"use only {', '.join(DEFAULTS)}")
    o = {**DEFAULTS, **(options or {})}
    if o["dataset"] not in DATASETS:
        close = difflib.get_close_matches(str(o["dataset"]), DATASETS, n=3)
        raise ConfigError(f"harnesses[reasoning_gym].options.dataset: {o['dataset']!r} is not a reasoning-gym dataset",
                          (f"did you mean {' or '.join(close)}? " if close else "") + f"datasets: {', '.join(sorted(DATASETS))}")
    for key, low, high in (("size", 1, LEVEL_STRIDE - 1), ("seed", 0, 2 ** 31)):
        if not isinstance(o[key], int) or isinstance(o[key], bool) or not low <= o[key] <= high:
            raise ConfigError(f"harnesses[reasoning_gym].options.{key}: {o[key]!r} is not an integer in [{low}, {high}]",
                              f"set options.{key} to an integer in that range")
    if not isinstance(o["config"], dict) or {"seed", "size"} & set(o["config"]):
        raise ConfigError(f"harnesses[reasoning_gym].options.config: {o['config']!r} is not a mapping of config fields "
                          "without seed and size", "give seed and size as options.seed and options.size")
    if o["prompt"] not in SYSTEM_PROMPTS:
        raise ConfigError(f"harnesses[reasoning_gym].options.prompt: {o['prompt']!r} is not a reasoning-gym prompt style",
                          f"use one of: {', '.join(SYSTEM_PROMPTS)}")
    levels = o["levels"]
    if levels is not None:
        top = _max_level(o["dataset"]) if has_curriculum(o["dataset"]) else -1
        if not isinstance(levels, list) or not levels or any(not isinstance(v, int) or not 0 <= v <= top for v in levels):
            raise ConfigError(f"harnesses[reasoning_gym].options.levels: {levels!r} are not curriculum levels of "
                              f"{o['dataset']} (0..{top})", "list levels in that range, or leave levels unset"
                              if top >= 0 else f"{o['dataset']} has no curriculum: leave levels unset")
        levels = tuple(sorted(set(levels)))
    parsed = Options(o["dataset"], o["size"], o["seed"], dict(o["config"]), levels, o["prompt"])
    for level in parsed.levels or (None,):
        _dataset(parsed.dataset, json.dumps(_config(parsed, level), sort_keys=True), parsed.seed, 1)  # config valid?
    return parsed


def _max_level(name: str) -> int:
    return max(len(a.levels) for a in create_curriculum(name).attributes.values()) - 1


def _curriculum_config(name: str, level: int, defaults: dict):
    curriculum = create_curriculum(name)
    curriculum.set_global_level(level)
    return curriculum, curriculum.generate_configuration(dict(defaults), DefaultCurriculumContext(RangeAttributeMode.UPPER_BOUND))


def _fields(attr) -> list[str]:
    return [attr.lower_field_name, attr.upper_field_name] if isinstance(attr, RangeAttributeDefinition) else [attr.field_name]


def _config(o: Options, level: int | None) -> dict:
    """The dataset's config fields at `level` (the curriculum's fields over `o.config`), JSON-safe."""
    if level is None:
        return dict(o.config)
    curriculum, cfg = _curriculum_config(o.dataset, level, o.config)
    fields = {f: getattr(cfg, f) for a in curriculum.attributes.values() for f in _fields(a)}
    return _json_safe({**o.config, **fields})


def _difficulty(o: Options, level: int | None) -> int:
    """level + 1; without levels, 1 + the highest curriculum level whose upper bounds the config reaches."""
    if level is not None:
        return level + 1
    if not has_curriculum(o.dataset):
        return 1
    config = DATASETS[o.dataset][1](**o.config)
    reached = 0
    for lv in range(1, _max_level(o.dataset) + 1):
        curriculum, cfg = _curriculum_config(o.dataset, lv, o.config)
        uppers = [f for a in curriculum.attributes.values() for f in _fields(a)[-1:]]
        try:
            if all(getattr(cfg, f) <= getattr(config, f) for f in uppers):
                reached = lv
        except TypeError:  # non-numeric attribute values: no order to compare
            return 1
    return reached + 1


def _split_seed(o: Options, split: str, level: int | None) -> int:
    return o.seed + LEVEL_STRIDE * (level or 0) + (EVAL_OFFSET if split == "eval" else 0)


@lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int):
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"harnesses[reasoning_gym].options: reasoning-gym refused the {name} config "
                          f"{config_json}: {type(exc).__name__}: {exc}",
                          f"give options.config only fields of {name}'s config class, with valid values") from None


def build_tasks(o: Options, harness: str = "reasoning_gym") -> list[TaskSpec]:
    tasks: list[TaskSpec] = []
    trained: set[str] = set()
    for split in ("train", "eval"):
        for level in o.levels or (None,):
            config, seed = _config(o, level), _split_seed(o, split, level)
            ds, difficulty = _dataset(o.dataset, json.dumps(config, sort_keys=True), seed, o.size), _difficulty(o, level)
            for i in range(o.size):
                entry = _json_safe({k: v for k, v in ds[i].items() if k in ("question", "answer", "metadata")})
                if split == "train":
                    trained.add(entry["question"])
                elif entry["question"] in trained:
                    continue  # never evaluate on a question trained on
                where = f"{o.dataset}/" + (f"level{level}/" if level is not None else "") + f"{split}/{i}"
                tasks.append(TaskSpec(task_id=f"{harness}/{where}", harness=harness, prompt=entry["question"],
                                      answer=entry["answer"], difficulty=difficulty, split=split,
                                      meta={"family": o.dataset, "dataset": o.dataset, "config": config, "seed": seed,
                                            "size": o.size, "level": level, "entry": entry}))
    if not any(t.split == "eval" for t in tasks):
        raise ConfigError(f"harnesses[reasoning_gym]: every eval question of {o.dataset} also appears in train",
                          "raise options.size or widen options.config so the dataset has more distinct questions")
    return tasks


def _json_safe(value):
    """`value` as JSON data: tuples and sets as lists (sets sorted where they can be), numpy scalars as numbers."""
    def default(x):
        if isinstance(x, (set, frozenset)):
            try:
                return sorted(x)
            except TypeError:
                return sorted(x, key=repr)
        if hasattr(x, "tolist"):
            return x.tolist()
        return list(x) if isinstance(x, tuple) else str(x)
    return json.loads(json.dumps(value, default=default))


def score_record(task_meta: dict, final_answer: str | None) -> float:
    """reasoning-gym's score of `final_answer` for a task, from the task's stored meta alone: what
    compute_reward gave the episode (see the module docstring for no answer and a scorer that raises)."""
    if final_answer is None:
        return 0.0
    ds = _dataset(task_meta["dataset"], json.dumps(task_meta["config"], sort_keys=True), task_meta["seed"], task_meta["size"])
    try:
        return float(ds.score_answer(final_answer, copy.deepcopy(task_meta["entry"])))
    except Exception:  # noqa: BLE001 - the dataset's scorer could not read this answer: a wrong answer
        return 0.0


def answer_of(text: str) -> str | None:
    """The answer a reply gives: reasoning-gym's `<answer>` tag, else a line `ANSWER: X`; None without one."""
    tagged = extract_answer(text)
    return tagged if tagged is not None else parse_answer(text)


def final_answer(trajectory: Trajectory) -> str | None:
    """The answer scored: the last reply's answer, else its last non-empty line; None without a reply."""
    if not trajectory.actions:
        return None
    text = trajectory.actions[-1].text
    given = answer_of(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return given if given is not None else (lines[-1] if lines else None)


class ReasoningGymHarness:
    name = "reasoning_gym"
    version = "1"
    reward_source = "harness"

    def __init__(self, **options) -> None:
        self.options = parse_options(options)
        self.task: TaskSpec | None = None

    # -- optional class hooks (harnesses.base) ------------------------------------------------------
    @classmethod
    def task_set(cls, options: dict) -> TaskSet:
        o = parse_options(options)
        digest = hashlib.sha256(o.to_json().encode()).hexdigest()[:12]
        return TaskSet(f"reasoning_gym-{metadata.version('reasoning-gym')}-{digest}", tuple(build_tasks(o, cls.name)))

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        """`<answer>X</answer>`; a task whose meta has `demonstration: worked` and whose entry names its
        `expression` (the arithmetic datasets) shows it first: `2 * 5 = 10` on a line, then the tag."""
        answer = task.meta["entry"]["answer"]
        if turn != 0 or answer is None:
            return None
        worked = task.meta.get("demonstration") == "worked" and (task.meta["entry"].get("metadata") or {}).get("expression")
        return (f"{worked} = {answer}\n" if worked else "") + f"<answer>{answer}</answer>"

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        """A tagged answer the dataset's own scorer gives 0 (the first such of WRONG_CANDIDATES)."""
        wrong = next((w for w in WRONG_CANDIDATES if score_record(task.meta, w) == 0.0), WRONG_CANDIDATES[-1])
        return f"<answer>{wrong}</answer>"

    # -- contract -----------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return SYSTEM_PROMPTS[self.options.prompt]

    def tools(self) -> list[dict]:
        return []

    def reset(self, task_spec: TaskSpec) -> Observation:
        missing = [k for k in META_KEYS if k not in task_spec.meta]
        if missing:
            raise ValueError(f"task {task_spec.task_id} lacks meta {', '.join(missing)}: it was not made by this "
                             "harness's task_set (leave harnesses[].tasks unset for reasoning_gym)")
        self.task = task_spec
        return Observation(text=f"{task_spec.prompt}\n{INSTRUCTION}")

    def step(self, action: Action) -> Observation:
        if self.task is None:
            return Observation(text="no task: reset first", status="invalid_action", done=True)
        if answer_of(action.text) is None:
            return Observation(text=NO_ANSWER, status="invalid_action")
        return Observation(text="answer recorded", done=True)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer=final_answer(trajectory))

    def compute_reward(self, trajectory: Trajectory) -> float:
        """The dataset's own score of the episode's final answer (`final_answer`), in [0, 1]."""
        return score_record(trajectory.task.meta, final_answer(trajectory))

    def full_reset(self) -> None:
        self.task = None

    def close(self) -> None:
        self.task = None
