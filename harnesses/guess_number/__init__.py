"""guess_number: a two-role guessing game, the built-in multi-agent harness (`harnesses.multi_agent`).

The `holder` knows a secret number between `low` and `high`; the `guesser` does not. They take
turns, the guesser first: the guesser sends `GUESS: <number>`, the holder answers `HIGHER` (the
secret is higher), `LOWER` or `CORRECT`. The game ends when the holder says CORRECT, or when the
holder has answered the last of `max_guesses` guesses. Both see the shared history of guesses and
answers; only the holder's observations carry the secret.

Rewards (`role_rewards`, each in [0, 1]): the guesser 1 when one of its guesses was the secret, else
0; the holder the share of the guesses it answered truthfully (a guess left unanswered counts as
not), 0 when there was none. A holder's false CORRECT ends the game (the guesser did not find it).
A malformed move is answered `invalid_action` and the same role moves again.

Tasks: its own versioned task set (`task_set()`), three ranges (8, 16, 32) by family. Scripted
solutions: binary search and truthful answers (`scripted_action` for the joint episode,
`scripted_move` for one role in any state: a role seated `scripted` plays it).
"""

from __future__ import annotations

import re

from harnesses.base import Action, Evidence, HarnessReward, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.multi_agent import combined_reward

GUESSER, HOLDER = "guesser", "holder"
REPLIES = ("HIGHER", "LOWER", "CORRECT")
RANGES = {"range8": 8, "range16": 16, "range32": 32}
TASK_SET_VERSION = "guess-1"
_GUESS = re.compile(r"GUESS:\s*(-?\d+)", re.IGNORECASE)
_REPLY = re.compile(r"\b(HIGHER|LOWER|CORRECT)\b", re.IGNORECASE)

PROMPTS = {
    GUESSER: "You play a guessing game. Find the secret number. Each turn, reply with exactly one line: GUESS: <number>",
    HOLDER: "You play a guessing game. You know the secret number. Answer each guess truthfully with one word: "
            "HIGHER if the secret is higher, LOWER if it is lower, CORRECT if it is the guess.",
}


def truth(secret: int, guess: int) -> str:
    return "CORRECT" if guess == secret else "HIGHER" if secret > guess else "LOWER"


def _tasks() -> tuple[TaskSpec, ...]:
    out = []
    for family, high in RANGES.items():
        for secret in range(1, high + 1, max(1, high // 16)):
            split = "eval" if secret % 3 == 0 else "train"  # held out: the secrets divisible by 3
            out.append(TaskSpec(task_id=f"guess_number-{family}-{split}-{secret:02d}", harness="guess_number",
                                prompt=f"Find the secret number between 1 and {high}.", answer=secret,
                                difficulty=high.bit_length() - 3, split=split,
                                meta={"family": family, "low": 1, "high": high, "max_guesses": high.bit_length()}))
    return tuple(out)


def _search(low: int, high: int, history: list[tuple[int, str]]) -> int:
    """The binary-search guess after `history` (guesses and answers, taken as true)."""
    for guess, reply in history:
        if reply == "HIGHER":
            low = max(low, guess + 1)
        elif reply == "LOWER":
            high = min(high, guess - 1)
    return (low + max(low, high)) // 2


class GuessNumber:
    name = "guess_number"
    version = "1.0"
    roles = (GUESSER, HOLDER)
    moves = "turns"
    reward_source = "harness"
    reward_sources = ("harness",)  # no verifier can grade a role; role_rewards does

    # -- optional hooks ------------------------------------------------------------------------------
    @classmethod
    def task_set(cls) -> TaskSet:
        return TaskSet(TASK_SET_VERSION, _tasks())

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        """Turn `turn` of the scripted joint episode: even turns the guesser's binary search, odd the holder's truthful answer."""
        meta, secret = task.meta, int(task.answer)
        history: list[tuple[int, str]] = []
        for t in range(turn + 1):
            guess = _search(meta["low"], meta["high"], history)
            if t == turn:
                return f"GUESS: {guess}" if t % 2 == 0 else truth(secret, guess)
            if t % 2 == 1:
                history.append((guess, truth(secret, guess)))
                if history[-1][1] == "CORRECT" or len(history) >= meta["max_guesses"]:
                    return None
        return None  # pragma: no cover - the loop returns

    def scripted_move(self, role: str) -> str | None:
        """What a competent `role` plays now: binary search over the history, or the truthful answer."""
        if self.task is None or self.to_move() != role:
            return None
        if role == GUESSER:
            return f"GUESS: {_search(self.task.meta['low'], self.task.meta['high'], self.history)}"
        return truth(int(self.task.answer), self.pending)

    def role_prompt(self, role: str) -> str:
        return PROMPTS[role]

    def system_prompt(self) -> str:
        return PROMPTS[GUESSER]

    # -- contract ------------------------------------------------------------------------------------
    def __init__(self) -> None:
        self.task: TaskSpec | None = None
        self._clear()

    def _clear(self) -> None:
        self.history: list[tuple[int, str]] = []  # (guess, the holder's answer)
        self.truthful = 0
        self.pending: int | None = None  # a guess waiting for its answer
        self.found = False
        self.over = False
        self.last_invalid: dict[str, str] = {}  # role -> why its last move was refused

    def reset(self, task: TaskSpec) -> Observation:
        self.task = task
        self._clear()
        return self.observe(GUESSER)

    def to_move(self) -> str | None:
        if self.task is None or self.over:
            return None
        return HOLDER if self.pending is not None else GUESSER

    def observe(self, role: str) -> Observation:
        meta = self.task.meta
        lines = [f"Secret number between {meta['low']} and {meta['high']}."]
        if role == HOLDER:
            lines.append(f"You hold the secret: {self.task.answer}.")
        lines += [f"Guess {i + 1}: {g} -> {r}" for i, (g, r) in enumerate(self.history)] or ["No guesses yet."]
        if role in self.last_invalid:
            lines.append(f"Your last move was not valid: {self.last_invalid[role]}")
        if role == GUESSER:
            lines.append(f"Guesses left: {meta['max_guesses'] - len(self.history)}. Reply with GUESS: <number>.")
        elif self.pending is not None:
            lines.append(f"The guesser guesses {self.pending}. Reply HIGHER, LOWER or CORRECT.")
        return Observation(text="\n".join(lines), data={"role": role, "history": [list(h) for h in self.history]},
                           done=self.over, info={"role": role})

    def step(self, action: Action) -> Observation:
        role = self.to_move()
        if role is None:
            return Observation(text="The game is over.", status="invalid_action", done=True, info={"role": None})
        meta = self.task.meta
        if role == GUESSER:
            found = _GUESS.findall(action.text or "")
            guess = int(found[-1]) if found else None
            if guess is None or not meta["low"] <= guess <= meta["high"]:
                return self._invalid(role, f"send GUESS: <number> with a number from {meta['low']} to {meta['high']}")
            self.last_invalid.pop(role, None)
            self.pending = guess
            self.found = self.found or guess == int(self.task.answer)
            return Observation(text=f"You guessed {guess}; the holder answers next.", info={"role": role})
        replies = {m.upper() for m in _REPLY.findall(action.text or "")}
        if len(replies) != 1:
            return self._invalid(role, "answer with exactly one of HIGHER, LOWER, CORRECT")
        self.last_invalid.pop(role, None)
        (reply,) = replies
        guess, self.pending = self.pending, None
        self.history.append((guess, reply))
        self.truthful += reply == truth(int(self.task.answer), guess)
        self.over = reply == "CORRECT" or len(self.history) >= meta["max_guesses"]
        return Observation(text=f"You answered {reply} to {guess}.", done=self.over, info={"role": role})

    def _invalid(self, role: str, why: str) -> Observation:
        self.last_invalid[role] = why
        return Observation(text=f"Not a valid move: {why}.", status="invalid_action", info={"role": role})

    def role_rewards(self, trajectory: Trajectory) -> dict[str, HarnessReward]:
        asked = len(self.history) + (self.pending is not None)
        lies = len(self.history) - self.truthful
        return {GUESSER: HarnessReward(1.0 if self.found else 0.0, [], f"secret {'found' if self.found else 'not found'}"),
                HOLDER: HarnessReward(self.truthful / asked if asked else 0.0, ["lied"] if lies else [],
                                      f"{self.truthful}/{asked} guesses answered truthfully")}

    def compute_reward(self, trajectory: Trajectory) -> HarnessReward:
        return combined_reward(self.role_rewards(trajectory))

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(final_answer=str(self.history[-1][0]) if self.history else None)

    def close(self) -> None:
        self.task = None
