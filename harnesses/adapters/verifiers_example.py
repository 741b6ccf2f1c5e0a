"""The `verifiers` harness's default taskset: a small verifiers v1 taskset of our own, built with
verifiers' real classes (`vf.TaskData`, `vf.Task` with `@vf.reward` functions, `vf.Taskset`), so
the adapter runs with no options and its tests exercise verifiers' own scoring.

Tasks: "What is A + B?" (or A - B) with two-digit operands drawn from `Random(seed)`; the prompt
asks for a last line `ANSWER: <number>`.

Rubric (weights 0.5 + 0.5, so verifiers' weighted sum `trace.reward` lies in [0, 1]), both read the
reply's final answer (`final_answer`: a `\\boxed{...}`, else an `ANSWER:` line, else the last
number in the reply):
- `correct_answer`: 1 when the final answer is the expected number, else 0.
- `digit_credit`: graded partial credit, the digits the final answer shares with the expected one
  (as multisets) over the longer of the two digit counts: "85" for 85 earns 1, "58" or "850" earn
  part, no digits earn 0. A wrong answer with digits in common earns some; padding with digits
  lowers it.

`scripted_reply` and `wrong_reply` on the task are the agentrl adapter's optional hooks (a reply
that earns 1.0 and one that earns 0.0); verifiers itself never calls them.

Belongs here: the example's data, rewards and loader. Not here: the adapter (`verifiers_env`).
"""

from __future__ import annotations

import random
import re
from collections import Counter

import verifiers.v1 as vf

__all__ = ["ArithmeticTaskset", "final_answer", "digit_credit"]

_ANSWER_LINE = re.compile(r"^\s*ANSWER\s*:\s*(.*?)\s*$", re.I | re.M)
_NUMBER = re.compile(r"-?\d+")


def final_answer(reply: str) -> str:
    """The reply's final answer: its last `\\boxed{...}`, else its last `ANSWER:` line, else its last number ("" if none)."""
    boxed = vf.extract_boxed_answer(reply, strict=True)
    if boxed:
        return boxed.strip()
    lines = _ANSWER_LINE.findall(reply)
    if lines:
        return lines[-1]
    numbers = _NUMBER.findall(reply)
    return numbers[-1] if numbers else ""


def digit_credit(given: str, expected: str) -> float:
    """Digits `given` shares with `expected` (as multisets) over the longer digit count; 0 without digits."""
    g, e = Counter(c for c in given if c.isdigit()), Counter(c for c in expected if c.isdigit())
    longest = max(sum(g.values()), sum(e.values()))
    return sum((g & e).values()) / longest if longest else 0.0


class ArithmeticData(vf.TaskData):
    answer: str
    """The expected number, as text."""


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward(weight=0.5)
    async def correct_answer(self, trace: vf.Trace) -> float:
        """1 when the reply's final answer is the expected number."""
        return float(final_answer(trace.last_reply).strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def digit_credit(self, trace: vf.Trace) -> float:
        """Partial credit: the expected digits the final answer has, penalised for extra digits."""
        return digit_credit(final_answer(trace.last_reply), self.data.answer)

    def scripted_reply(self) -> str:
        return f"ANSWER: {self.data.answer}"

    def wrong_reply(self) -> str:
        return "ANSWER: none"


class ArithmeticConfig(vf.TasksetConfig):
    num_tasks: int = 32
    """How many tasks to build."""
    seed: int = 7
    """Seed of the operands."""


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self) -> list[ArithmeticTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            op = rng.choice("+-")
            a, b = (a, b) if op == "+" else (max(a, b), min(a, b))
            answer = a + b if op == "+" else a - b
            prompt = f"What is {a} {op} {b}? End your reply with a line `ANSWER: <number>`."
            tasks.append(ArithmeticTask(ArithmeticData(idx=i, name=f"arithmetic-{i}", prompt=prompt, answer=str(answer)),
                                        self.config.task))
        return tasks
