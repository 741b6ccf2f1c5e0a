"""A three-turn harness whose good and bad episodes differ only in the middle turn, with a step reward
at that turn: the learner benchmark's `turn` against `episode` arm (`learner.py --arms episode,turn`).

Every episode has `turns` turns (default 3). Each turn the model is shown which turn it is; any reply
moves the episode on (no action is invalid, so the process terms of the reward are the same in
every episode). The middle turn (`turns // 2`) asks for a full sentence: it is good when the reply,
stripped, is at least `min_chars` characters long. The default 140 is set against the built-in
model with `inference.max_new_tokens: 48` (the benchmark's): before training its greedy middle reply
reaches it on 1 of 12 eval tasks and about one sampled middle reply in twenty does (their median is
18 characters, their 97th percentile 144), so a run starts near 0 and must learn the turn. The
first and last turns are free: what the model says there changes nothing. The middle turn's observation carries `info["reward"]` 1.0 when it was
good, else 0.0, and every other turn's 0.0 (`step_rewards = True`: the stored step rewards that
`training.advantage: turn` reads); the episode's own score (`compute_reward`, the training reward's
outcome: `reward_source = "harness"`) is 1.0 when the middle turn was good, else 0.0, so an episode
succeeds exactly when its middle turn did.

Tasks: its own task set (`task_set()`), `TASKS` train and `TASKS` eval tasks that differ only in the
topic word of their prompt.

Load it by `module:Class` path, e.g.
    harnesses: [{name: "benchmarks.middle_turn_harness:MiddleTurn", options: {min_chars: 140}}]
"""

from __future__ import annotations

from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, Trajectory

TASKS = 24
TOPICS = ("rivers", "clocks", "birds", "bread", "trains", "maps", "salt", "glass", "wool", "bells", "kites", "tides")
SYSTEM = "You are in a short conversation of a few turns. Reply to each message."


def _tasks() -> tuple[TaskSpec, ...]:
    out = []
    for split, offset in (("train", 0), ("eval", 10_000)):
        for i in range(TASKS):
            topic = TOPICS[i % len(TOPICS)]
            out.append(TaskSpec(task_id=f"middle_turn/{split}/{i}", harness="middle_turn",
                                prompt=f"Let us talk about {topic} (conversation {offset + i}).", answer=None,
                                difficulty=1, split=split, meta={"family": "middle_turn", "max_turns": 3}))
    return tuple(out)


class MiddleTurn:
    name = "middle_turn"
    version = "1"
    reward_source = "harness"
    reward_sources = ("harness",)
    step_rewards = True  # the middle turn's observation carries its reward in info["reward"]

    def __init__(self, min_chars: int = 140, turns: int = 3) -> None:
        if min_chars < 1 or turns < 3:
            raise ValueError(f"min_chars must be >= 1 and turns >= 3, got {min_chars}, {turns}")
        self.min_chars, self.turns = int(min_chars), int(turns)
        self.middle = self.turns // 2
        self.turn, self.good = 0, False

    @classmethod
    def task_set(cls) -> TaskSet:
        return TaskSet("middle-turn-1", _tasks())

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        return "This is a full sentence about it." if turn < 3 else None

    def system_prompt(self) -> str:
        return SYSTEM

    def reset(self, task_spec: TaskSpec) -> Observation:
        self.turn, self.good = 0, False
        return Observation(text=f"{task_spec.prompt}\nTurn 1 of {self.turns}: say something about it.")

    def step(self, action: Action) -> Observation:
        reward = 0.0
        if self.turn == self.middle:
            self.good = len(action.text.strip()) >= self.min_chars
            reward = 1.0 if self.good else 0.0
        self.turn += 1
        done = self.turn >= self.turns
        prompt = ("Thank you." if done else
                  f"Turn {self.turn + 1} of {self.turns}: " + ("answer with a full sentence." if self.turn == self.middle
                                                                  else "say anything you like."))
        return Observation(text=prompt, done=done, info={"reward": reward})

    def compute_reward(self, trajectory: Trajectory) -> float:
        return 1.0 if self.good else 0.0

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer="good" if self.good else "bad")

    def close(self) -> None:
        pass
