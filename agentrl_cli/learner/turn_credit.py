"""Per-turn credit (`training.advantage: turn`): turn-level advantages from the stored step rewards and
the episode's outcome, and each model turn's tokens trained on its own turn's advantage.

The formula. Episode i of a GRPO group g has turns t = 0 .. T_i - 1 (its own model turns: the steps
of its role in a multi-agent episode, every step otherwise), a stored step reward r_{i,t}
(`StepRecord.reward`: a gateway call's posted reward, an OpenEnv server's step reward) and the
episode reward R_i after shaping and `reward.normalization`, exactly as `episode` mode reads it.

    A_out_i    = (R_i - mean_g R) / (std_g R + eps)        today's GRPO advantage, unchanged
    G_{i,t}    = sum_{k >= t} gamma^(k - t) r_{i,k}          the step-reward return from turn t
    A_step_i,t = (G_{i,t} - mean_{g,t} G) / (std_{g,t} G + eps)
    A_{i,t}    = A_out_i + A_step_i,t

mean_{g,t} and std_{g,t} are over the episodes of the group (and role) that reached turn t:
episodes shorter than t + 1 turns are left out of turn t's baseline. Both parts follow
`training.advantage_std_scale` (without it, no division) and `group_advantages`' rules: the sample
std (ddof 1), a masked episode (reward None) in neither baseline, and a turn index with fewer than
two episodes, or all their returns equal, gives A_step 0. gamma = `training.turn_discount`: with 0
(the default) G_{i,t} = r_{i,t} and a step reward credits its own turn alone; with gamma > 0 later
step rewards flow back to earlier turns, a change d at turn k moving turn j <= k's return by
gamma^(k - j) d.

What the outcome part is: R_i, the episode reward as configured. The step rewards are added on top
of it, never subtracted out of it: for a harness whose episode reward is separate from its step
rewards (an agent's gateway: `POST /sessions/{id}/reward` with and without `call_id`) nothing counts
twice. A harness whose episode reward is built from its step rewards (OpenEnv's `episode_reward:
last | sum`) counts a step reward in both parts: in R_i on every turn, and in its own turn's A_step.

Turns in the tokens (`turn_spans`): each model turn's generated tokens are one run of loss-mask
ones (the prompt, tool output and chat-template tokens between turns are zeros), in turn order
across the episode's segments, so run j is turn j. An episode whose runs do not number its turns
(an empty generation, an agent whose segments repeat or drop calls) cannot be split honestly: its
tokens train on A_out_i alone and the step's row counts it (`rollout/turn_unmapped`).

Belongs here: these functions of rewards and masks. Not here: which episodes train and the
shaping of R (`run/loop/samples.py`, `run/loop/shaping.py`).
"""

from __future__ import annotations

import statistics
from typing import Sequence

import numpy as np

from agentrl_cli.learner.grpo import group_advantages


def turn_spans(loss_mask) -> list[tuple[int, int]]:
    """(start, end) of each run of loss-mask ones: one per model turn, in order."""
    mask = np.asarray(loss_mask, dtype=np.int8) > 0
    if not mask.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def step_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = sum over k >= t of gamma^(k - t) r_k (gamma 0: each turn its own reward)."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + (gamma * running if gamma else 0.0)
        out[t] = running
    return out


def turn_step_advantages(returns: list[list[float] | None], groups: list[str], scale: bool = True) -> list[list[float]]:
    """A_step per episode and turn: each turn index's returns baselined within its group
    (`group_advantages`), the episodes that did not reach that turn left out; None (masked) gives []."""
    keys, values, where = [], [], []
    for i, (ret, group) in enumerate(zip(returns, groups)):
        for t, g in enumerate(ret or ()):
            keys.append(f"{group}\x00{t}")
            values.append(g)
            where.append((i, t))
    flat = group_advantages(values, keys, scale=scale) if values else []
    out = [[0.0] * len(ret or ()) for ret in returns]
    for (i, t), a in zip(where, flat):
        out[i][t] = a
    return out


def token_advantages(loss_mask, outcome: float, step: list[float]) -> np.ndarray | None:
    """Per-token advantages of one episode: turn t's tokens outcome + step[t], the others `outcome`
    (never in the loss); None when its loss-mask runs do not number its turns."""
    spans = turn_spans(loss_mask)
    if len(spans) != len(step):
        return None
    out = np.full(len(loss_mask), outcome, dtype=np.float32)
    for (a, b), s in zip(spans, step):
        out[a:b] = outcome + s
    return out


def credit_stats(outcome: list[float], step: list[list[float]]) -> tuple[float | None, float | None]:
    """(mean over episodes of the population std of their turn advantages A_out + A_step, the share
    sum|A_step| / (sum|A_step| + sum|A_out|) over turns): the per-turn spread and the share of the
    advantage the step rewards carry; None without turns."""
    spreads = [statistics.pstdev([o + s for s in steps]) for o, steps in zip(outcome, step) if steps]
    a_step = sum(abs(s) for steps in step for s in steps)
    a_out = sum(abs(o) * len(steps) for o, steps in zip(outcome, step))
    return (statistics.fmean(spreads) if spreads else None,
            a_step / (a_step + a_out) if a_step + a_out > 0 else (0.0 if spreads else None))
