"""The task sets the `agent` harness ships (`harnesses[].options.tasks`), for agents that have no
tasks of their own yet; `harnesses[].tasks` (a JSONL or Parquet file) replaces them.

- `basic` (the default): small arithmetic ("What is 17 + 25?") and string tasks ("Reverse the word
  stone."), checked by the `answer` verifier against the agent's final answer.
- `brief`: "answer in at most N characters" tasks, checked by the `regex` verifier on the final
  answer's length: a format any model can meet or miss, so rewards vary within a group even for an
  untrained model (the smoke tests train on it).

Generated from a fixed seed: the same tasks in every process, versioned by `VERSION`.
"""

from __future__ import annotations

import random

from agentrl_cli.core.episode import TaskSet, TaskSpec

VERSION = "1"
SETS = ("basic", "brief")
WORDS = ("apple", "river", "stone", "cloud", "ember", "maple", "delta", "frost", "lemon", "tiger", "pearl", "orbit")
BRIEF_LIMIT = 43  # characters: about half of a random tiny model's 16-token replies fit, so rewards vary


def _basic(rng: random.Random, split: str, n: int) -> list[TaskSpec]:
    tasks = []
    for i in range(n):
        if i % 2 == 0:
            a, b = rng.randint(2, 60), rng.randint(2, 60)
            op = rng.choice("+-*")
            answer = {"+": a + b, "-": a - b, "*": a * b}[op]
            prompt = f"What is {a} {op} {b}? Give the final answer as a number alone."
            meta = {"family": "arithmetic", "verify": "answer"}
        else:
            word = rng.choice(WORDS)
            kind = rng.choice(("reverse", "upper", "length"))
            prompt, answer = {"reverse": (f"Reverse the word {word}. Give the reversed word alone.", word[::-1]),
                              "upper": (f"Write the word {word} in capital letters, alone.", word.upper()),
                              "length": (f"How many letters has the word {word}? Give the number alone.", len(word))}[kind]
            meta = {"family": "string", "verify": "answer"}
        tasks.append(TaskSpec(task_id=f"agent/basic/{split}/{i}", harness="agent", prompt=prompt, answer=answer,
                              difficulty=1, split=split, meta=meta))
    return tasks


def _brief(rng: random.Random, split: str, n: int) -> list[TaskSpec]:
    pattern = f"(?s).{{1,{BRIEF_LIMIT}}}"
    return [TaskSpec(task_id=f"agent/brief/{split}/{i}", harness="agent", answer=word, difficulty=1, split=split,
                     prompt=f"Say something about the word {word} in at most {BRIEF_LIMIT} characters.",
                     meta={"family": "brief", "verify": "regex", "pattern": pattern})
            for i, word in enumerate(rng.choice(WORDS) for _ in range(n))]


def task_set(name: str) -> TaskSet:
    """The shipped set `name` (one of SETS); ValueError naming the sets otherwise."""
    make = {"basic": _basic, "brief": _brief}.get(name)
    if make is None:
        raise ValueError(f"unknown agent task set {name!r}; the agent harness ships {', '.join(SETS)}")
    rng = random.Random(f"agent-{name}-{VERSION}")
    return TaskSet(f"agent-{name}-{VERSION}", tuple(make(rng, "train", 32) + make(rng, "eval", 16)))
