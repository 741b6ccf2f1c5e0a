"""verifiers: a verifiers v1 taskset (its tasks and its reward functions) as a harness, scored by
the taskset's own rubric through verifiers' real code.

    harnesses:
      - name: verifiers
        options: {taskset: "my_pkg.tasks:MyTaskset", config: {num_tasks: 64}}

With no options it plays our example taskset (`verifiers_example`: arithmetic with graded partial
credit). Options, splits, the TaskSet version and what is refused at load: `verifiers_load`.

Episode: reset shows the task's prompt (a Messages prompt as its texts joined); the system prompt
is the task's own followed by `options.instruction` (say how to submit; "" for none). A reply that
matches `options.submit_pattern` (default: a line `ANSWER: ...` or a `\\boxed{`) ends the episode;
one that does not, an empty reply or a tool call (the adapter offers no tools) is answered with
`invalid_action` and the instruction, and the episode goes on until the turn limit. Set
`submit_pattern: null` to end on any non-empty reply (then "hello" is a submission and stage 5's
invalid-action check fails by design).

Score (`compute_reward`): the episode as verifiers would have recorded it, a `vf.Trace` of the task
whose message graph (`graph.prepare_turn(...).commit`) holds the task's prompt messages, each reply
as a sampled assistant message and the harness's answers in between as user messages; then the
task's own `Task.score` (its `@vf.reward` and plugged reward functions, its metrics) in a private
event loop, and verifiers' weighted sum `trace.reward`, mapped from `options.reward_range` (default
[0, 1]: unchanged) to [0, 1]. A sum outside the range is an error naming the option (the episode is
masked), never clipped. The detail holds each function's score and weight and the metrics. An
episode without a reply, or one that ended in a timeout or error, scores 0 without the rubric
(verifiers does not score a failed rollout). `reward_source` is "harness".

Scripted solutions: a task class may define `scripted_reply()` and `wrong_reply()` (the example
does); without them `scripted_action` gives None and `wrong_action` a bare `ANSWER: none`.

Belongs here: the episode, the trace, the scoring and the harness class. Not here: options and
loading (`verifiers_load`), the example taskset (`verifiers_example`).
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor

try:
    import verifiers.v1 as vf
    from verifiers.v1.graph import prepare_turn
    from verifiers.v1.state import state_cls
except ImportError as exc:  # the registry reports this as "cannot be loaded: ..."
    raise ImportError(f"the verifiers package (v1 API, Python >= 3.11) is not importable ({exc}); install it with "
                      "`pip install verifiers==0.3.1`") from exc

from agentrl_cli.core.errors import ConfigError
from harnesses.adapters.verifiers_load import DEFAULTS, NAME, load
from harnesses.base import Action, Evidence, HarnessReward, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.parsing import parse_answer

FAILED = ("timeout", "error")  # observation statuses of an episode verifiers would not score


def run_sync(coro):
    """Run a coroutine to completion from synchronous code: a fresh event loop in this thread
    (harness methods run in worker threads), or in a helper thread when this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifiers-score") as pool:
        return pool.submit(asyncio.run, coro).result()


def prompt_messages(task) -> list:
    """The task's opening messages as verifiers builds them: its system prompt, then its prompt."""
    data = task.data
    prompt = data.prompt
    messages = [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
    return ([vf.SystemMessage(content=data.system_prompt)] if data.system_prompt is not None else []) + messages


def build_trace(task, trajectory: Trajectory):
    """The `vf.Trace` verifiers would have recorded for this episode (see the module docstring)."""
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     state=state_cls(type(task))(), agent=vf.AgentInfo(config=vf.AgentConfig()))
    messages = prompt_messages(task)
    for i, action in enumerate(trajectory.actions):
        reply = vf.AssistantMessage(content=action.text)
        prepare_turn(trace, messages).commit(vf.Response(id=f"turn-{i}", created=0, model="agentrl", message=reply,
                                                         finish_reason="stop"))
        messages = [*messages, reply]
        after = trajectory.observations[i + 1] if i + 1 < len(trajectory.observations) else None
        if after is not None and not after.done:
            messages.append(vf.UserMessage(content=after.text))
    trace.ok = True
    trace.stop("submitted" if trajectory.observations and trajectory.observations[-1].done else "max_turns")
    return trace


async def _score(task, trace) -> None:
    timeout = task.data.timeout.scoring
    await (asyncio.wait_for(task.score(trace), timeout) if timeout else task.score(trace))


def score_trace(task, trace, reward_range=(0.0, 1.0)) -> HarnessReward:
    """Score `trace` with the task's own rubric; verifiers' weighted sum mapped from `reward_range` to [0, 1]."""
    run_sync(_score(task, trace))
    unscored = [name for name, r in trace.rewards.items() if r is None]
    if unscored:
        raise RuntimeError(f"verifiers left reward(s) {', '.join(unscored)} unscored")
    low, high = reward_range
    total = trace.reward
    score = (total - low) / (high - low)
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"the rubric's weighted sum {total:g} lies outside harnesses[{NAME}].options.reward_range "
                         f"[{low:g}, {high:g}]; set reward_range to the range the taskset's rewards can reach")
    detail = {"reward": total, "rewards": {n: [r.score, r.weight] for n, r in sorted(trace.rewards.items())},
              **({"metrics": dict(sorted(trace.metrics.items()))} if trace.metrics else {})}
    return HarnessReward(score, detail=json.dumps(detail, separators=(",", ":")))


class VerifiersHarness:
    name = NAME
    version = "1"
    reward_source = "harness"

    def __init__(self, **options) -> None:
        self.loaded = load(options)  # checks the options' keys and the taskset
        o = {**DEFAULTS, **options}
        self.instruction, pattern = str(o["instruction"] or ""), o["submit_pattern"]
        self.reward_range = parse_range(o["reward_range"])
        try:
            self.submit = None if pattern is None else re.compile(str(pattern))
        except re.error as exc:
            raise ConfigError(f"harnesses[{NAME}].options.submit_pattern: {pattern!r} is not a regular expression: {exc}",
                              "give a Python regular expression, or null to end on any reply") from None
        self.task: TaskSpec | None = None
        self.done = False

    # -- optional class hooks (harnesses.base) ------------------------------------------------------
    @classmethod
    def task_set(cls, options: dict) -> TaskSet:
        return load(options).task_set

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        return task.meta.get("scripted_reply") if turn == 0 else None

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return task.meta.get("wrong_reply") or "ANSWER: none"

    # -- contract -----------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        own = self.loaded.tasks[self.task.task_id].data.system_prompt if self.task is not None else None
        return "\n\n".join(p for p in (own, self.instruction) if p)

    def tools(self) -> list[dict]:
        return []

    def reset(self, task_spec: TaskSpec) -> Observation:
        if task_spec.task_id not in self.loaded.tasks:
            raise ValueError(f"task {task_spec.task_id} is not in taskset {self.loaded.target!r}: verifiers tasks come from "
                             f"the harness's own task_set (leave harnesses[].tasks unset for {NAME})")
        self.task, self.done = task_spec, False
        return Observation(text=self.loaded.tasks[task_spec.task_id].data.prompt_text)

    def step(self, action: Action) -> Observation:
        if self.task is None or self.done:
            return Observation(text="no episode in progress: reset first", status="invalid_action", done=True)
        text = action.text.strip()
        hint = f" {self.instruction}" if self.instruction else ""
        if not text:
            return Observation(text="empty reply." + hint, status="invalid_action")
        if action.tool_calls or "<tool_call>" in text:
            return Observation(text="this task offers no tools: answer in plain text." + hint, status="invalid_action")
        if self.submit is not None and not self.submit.search(action.text):
            return Observation(text="no final answer found." + hint, status="invalid_action")
        self.done = True
        return Observation(text="reply recorded", done=True)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        """The last reply's final answer (its `\\boxed{...}`, else its `ANSWER:` line), for the record and `reward: verifiers`."""
        text = trajectory.actions[-1].text if trajectory.actions else ""
        return Evidence(final_answer=vf.extract_boxed_answer(text, strict=True).strip() or parse_answer(text))

    def compute_reward(self, trajectory: Trajectory) -> HarnessReward:
        """The task's own rubric on the episode (see the module docstring)."""
        task = self.loaded.tasks.get(trajectory.task.task_id)
        if task is None:
            raise ValueError(f"task {trajectory.task.task_id} is not in taskset {self.loaded.target!r}")
        if not trajectory.actions:
            return HarnessReward(0.0, detail="no reply to score")
        last = trajectory.observations[-1] if trajectory.observations else None
        if last is not None and last.status in FAILED:
            return HarnessReward(0.0, detail=f"episode ended in {last.status}: verifiers does not score a failed rollout")
        return score_trace(task, build_trace(task, trajectory), self.reward_range)

    def full_reset(self) -> None:
        self.task, self.done = None, False

    def close(self) -> None:
        self.full_reset()


def parse_range(value) -> tuple[float, float]:
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and value[0] < value[1])
    if not ok:
        raise ConfigError(f"harnesses[{NAME}].options.reward_range: {value!r} is not [low, high] with low < high",
                          "give the range of the rubric's weighted sum, e.g. [0, 1] (the default) or [-1, 2]")
    return float(value[0]), float(value[1])
