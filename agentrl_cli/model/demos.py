"""Demonstrations for the warm start: the tasks of a split of the given harnesses and/or
`practice_per_family` practice tasks of every family (`harnesses.tasks.practice_tasks`), played by
the scripted solutions through the real harness (real sandboxes, real observations), turned into
chat messages and then into token ids with a loss mask over the assistant's own tokens only.

The built-in model is warm-started on practice tasks only: with 90 tasks a family it memorises
the prompts, and only with many fresh ones did it start to copy a number from a tool's output
into its answer; and a warm start that never saw the training split leaves reinforcement learning
tasks it cannot answer from memory.

One task in TERSE_EVERY (chosen by a hash of its id, so the set is fixed) is played in the harness's
terser style where it has one (`harnesses.oracle.terse_action`: code written without echoing the file
back). The warm-started policy therefore knows both styles and prefers the common one; which one fits
the turn budget (`inference.max_new_tokens`) is left for reinforcement learning to find out.

The demonstrator is also imperfect on purpose: SLIP_IN of every SLIP_OF tasks (another fixed,
hash-chosen set) are played with the harness's one slip (`harnesses.oracle.SLIPS`: solution.py saved
under the wrong name; the upper-cased text printed but never written). Imitation learns the slip at
that rate, so greedy decoding makes it every time, while sampling still finds the right form in one
to two episodes of five. Only the hidden tests tell the two apart: unlearning the slip from reward is the
improvement stage 8 short measures. A model this small does not learn a new skill (copying a word or
an expression it was never shown how to find) in minutes on a CPU; it does learn which of the
behaviours it already has pays.
"""

from __future__ import annotations

import itertools
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from harnesses.contract import play
from harnesses.oracle import oracle_action, slip_action, terse_action, terse_slip_action
from harnesses.registry import resolve
from harnesses.tasks import load_tasks, practice_tasks

TERSE_EVERY = 4
SLIP_IN, SLIP_OF = 3, 5


def demo_policy(task):
    """The scripted policy a task's demonstration is played with: style and slip chosen by two hashes of its id."""
    terse = zlib.crc32(task.task_id.encode()) % TERSE_EVERY == 0
    slip = zlib.crc32(f"slip/{task.task_id}".encode()) % SLIP_OF < SLIP_IN
    return {(False, False): oracle_action, (True, False): terse_action,
            (False, True): slip_action, (True, True): terse_slip_action}[terse, slip]


def episode_messages(harness, task, policy=None) -> list[dict]:
    """Play the scripted solution of `task` (`demo_policy` unless given); return system/user/assistant/tool messages."""
    traj, _ = play(harness, task, policy=policy or demo_policy(task))
    messages = [{"role": "system", "content": harness.system_prompt()}, {"role": "user", "content": traj.observations[0].text}]
    for action, obs in zip(traj.actions, traj.observations[1:]):
        messages.append({"role": "assistant", "content": action.text})
        if not obs.done:
            messages.append({"role": "tool", "content": obs.text})
    return messages


def collect(harness_names: list[str], split: str | None = "train", workers: int = 4,
            progress: Callable[[int, int], None] = lambda done, total: None, make=None,
            practice_per_family: int = 0) -> list[dict]:
    """[{"harness", "task_id", "messages", "tools"}] for every task of `split` (None: none) of each
    harness, and its practice tasks when `practice_per_family` > 0."""
    jobs = [(name, t) for name in harness_names
            for t in (load_tasks(name, split) if split else []) + (practice_tasks(name, practice_per_family) if practice_per_family else [])]
    make = make or (lambda name: resolve(name)())
    out: list[dict] = []
    done = itertools.count(1)

    def run(chunk: list) -> list[dict]:
        instances: dict = {}
        rows = []
        try:
            for name, task in chunk:
                h = instances.get(name) or instances.setdefault(name, make(name))
                rows.append({"harness": name, "task_id": task.task_id, "messages": episode_messages(h, task), "tools": h.tools()})
                progress(next(done), len(jobs))
        finally:
            for h in instances.values():
                h.close()
        return rows

    chunks = [jobs[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as ex:
        for rows in ex.map(run, chunks):
            out.extend(rows)
    return sorted(out, key=lambda r: r["task_id"])


def tokenize(tokenizer, demo: dict, max_len: int) -> tuple[list[int], list[int]] | None:
    """(input_ids, loss_mask) built as rollouts build an episode (`model.chat.ChatRenderer`: the
    model's own template, tools natively or by the fallback, token deltas per turn): the mask is 1
    on each assistant turn's content and its end-of-turn token. None when longer than `max_len`."""
    from agentrl_cli.model.chat import ChatRenderer

    messages, tools = demo["messages"], demo.get("tools")
    roles = [m["role"] for m in messages]
    if roles[:2] != ["system", "user"] or any(r != ("assistant" if i % 2 == 0 else "tool") for i, r in enumerate(roles[2:])):
        raise ValueError(f"demonstration {demo.get('task_id')}: expected system, user, then assistant/tool turns, got {roles}")
    chat = ChatRenderer(tokenizer, messages[0]["content"], tools)
    ids = chat.first_prompt(messages[1]["content"])
    mask = [0] * len(ids)
    for i in range(2, len(messages), 2):
        text = messages[i]["content"]
        own = tokenizer.encode(text, add_special_tokens=False) + [chat.eos]
        ids += own
        mask += [1] * len(own)
        if i + 1 < len(messages):
            env = chat.reply(text, messages[i + 1]["content"])
            ids += env
            mask += [0] * len(env)
        if len(ids) > max_len:
            return None
    return ids, mask
