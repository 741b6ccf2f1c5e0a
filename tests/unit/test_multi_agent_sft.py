"""`agentrl model sft` on a multi-agent harness (guess_number): one demonstration per (task, policy
role), each that role's own conversation; its loss mask covers exactly that role's moves (each with
its end-of-turn token), and its token ids are the very ids the rollout (`run_multi_episode`) builds
for that role when the same moves are generated, so a warm-started model sees at serve time what it
saw in training. A role seated `scripted` gets no demonstration. A short warm start of a random
tiny model trains on both roles and imports the result."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.config.models import HarnessConfig
from agentrl_cli.engines.inference.client import Generation
from agentrl_cli.model.demos import tokenize
from agentrl_cli.model.warm_start import demonstrations
from agentrl_cli.runtime.rollout.multi_episode import Seat, run_multi_episode
from harnesses.guess_number import GuessNumber
from harnesses.multi_agent import play_scripted


@pytest.fixture(scope="module")
def tok(random_model_dir):
    return AutoTokenizer.from_pretrained(random_model_dir)


def cfg():
    return load_config(None, [], env={}).config


class ScriptedPlayer:
    """A seat's client that generates the given moves in order, as token ids ending on the
    end-of-turn token: the rollout's side of the episode is real (harness, chat rendering, masks),
    only the sampling is replaced by the demonstrated moves."""

    def __init__(self, tokenizer, moves: list[str], eos: int) -> None:
        self.tok, self.moves, self.eos = tokenizer, list(moves), eos

    async def generate(self, prompt_ids, sampling) -> Generation:
        ids = self.tok.encode(self.moves.pop(0), add_special_tokens=False) + [self.eos]
        return Generation(output_ids=ids, output_logprobs=[0.0] * len(ids), finish_reason="stop", weight_version="v0",
                          latency=0.0, server="scripted")


def rollout_sequences(tokenizer, task) -> dict[str, tuple[list[int], list[int]]]:
    """(token ids, loss mask) of each role in a rollout whose generations are the scripted moves."""
    from agentrl_cli.model.chat import chat_format

    traj, _, _ = play_scripted(GuessNumber(), task)
    player = ScriptedPlayer(tokenizer, [a.text for a in traj.actions], chat_format(tokenizer).end_of_turn)
    seats = {role: Seat(role, "policy", player) for role in GuessNumber.roles}
    with ThreadPoolExecutor(1) as ex:
        result = asyncio.run(run_multi_episode(GuessNumber(), task, seats, tokenizer, ex, max_steps=40, step_timeout_s=30,
                                               max_new_tokens=64, temperature=1.0, seed=0, context_limit=4096))
    assert result.termination == "done" and not player.moves
    return {role: (s.token_ids, s.loss_mask) for role, s in result.seats.items()}


def test_demonstrations_cover_every_training_task_for_both_roles_with_each_roles_own_view():
    demos = demonstrations(cfg(), HarnessConfig(name="guess_number"))
    tasks = GuessNumber.task_set().select("train")
    assert sorted((d["task_id"], d["role"]) for d in demos) == sorted((t.task_id, r) for t in tasks for r in ("guesser", "holder"))
    every = demonstrations(cfg(), HarnessConfig(name="guess_number"), split="all")
    assert len(every) == 2 * len(GuessNumber.task_set().tasks) > len(demos)  # the evaluation tasks only on request
    for d in demos:
        roles = [m["role"] for m in d["messages"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant" and d["tools"] == []
        shown = " ".join(m["content"] for m in d["messages"] if m["role"] in ("user", "tool"))
        assert ("You hold the secret" in shown) == (d["role"] == "holder")  # the guesser never sees the secret
        moves = [m["content"] for m in d["messages"] if m["role"] == "assistant"]
        assert all(m.startswith("GUESS: ") for m in moves) if d["role"] == "guesser" else set(moves) <= {"HIGHER", "LOWER", "CORRECT"}


def test_a_scripted_seat_is_played_but_never_demonstrated():
    demos = demonstrations(cfg(), HarnessConfig(name="guess_number", roles={"guesser": "scripted"}))
    assert demos and {d["role"] for d in demos} == {"holder"}


@pytest.mark.parametrize("task_index", [0, 17, 39])
def test_each_roles_demonstration_is_token_for_token_the_rollouts_sequence(tok, task_index):
    task = GuessNumber.task_set().tasks[task_index]
    rolled = rollout_sequences(tok, task)
    demos = {d["role"]: d for d in demonstrations(cfg(), HarnessConfig(name="guess_number"), split="all")
             if d["task_id"] == task.task_id}
    assert set(demos) == set(rolled) == {"guesser", "holder"}
    from agentrl_cli.model.chat import chat_format

    eos = chat_format(tok).end_of_turn
    for role, (ids, mask) in rolled.items():
        demo_ids, demo_mask = tokenize(tok, demos[role], 4096)
        assert demo_ids == ids and demo_mask == mask, role
        # the trained tokens are exactly this role's moves, each closed by the end-of-turn token
        trained, run = [], []
        for i, m in zip(demo_ids, demo_mask):
            if m:
                run.append(i)
            elif run:
                trained.append(run)
                run = []
        trained += [run] if run else []
        moves = [m["content"] for m in demos[role]["messages"] if m["role"] == "assistant"]
        assert [tok.decode(t[:-1]) for t in trained] == moves and all(t[-1] == eos for t in trained)


def test_a_warm_start_on_guess_number_trains_both_roles_and_imports_the_model(cli, random_model_dir, isolated):
    result, record = cli.json("model", "sft", "--harness", "guess_number", "--name", "tiny-guess-ci", "--steps", "2",
                              "--batch-size", "4", "--set", f"model.path={random_model_dir}",
                              "--set", f"model.cache_dir={isolated / 'models'}")
    assert result.exit_code == 0, result.stdout
    assert record["roles"] == {"guesser": 28, "holder": 28} and record["demonstrations"] == 56  # the training split
    assert record["split"] == "train" and record["sft"]["steps"] == 2 and record["sft"]["examples"] == 56
    saved = json.loads((Path(record["directory"]) / "warm_start.json").read_text())
    assert saved["roles"] == record["roles"] and Path(record["directory"]).is_relative_to(isolated / "models")
