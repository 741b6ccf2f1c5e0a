"""Sample shaping (run/loop/shaping.py): dynamic sampling as the step loop applies it (what reaches the
trainer), the soft overlong penalty's values, overlong filtering, and the loss aggregations'
golden values on small tensors."""

from __future__ import annotations

import asyncio
import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.run.loop.samples import SampleBuilder
from agentrl_cli.run.loop.shaping import has_signal, overlong_penalty
from agentrl_cli.run.loop.steps import RunSummary, StepLoop
from agentrl_cli.run.parts import RunParts, RunState
from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.outcomes import Outcome
from agentrl_cli.runtime.rollout.buffer import Episode, TrajectoryBuffer
from agentrl_cli.learner.grpo import aggregation_weights, ppo_clip_loss


def cfg_with(**sets):
    base = {"rollout.group_size": 2, "training.micro_batch_size": 4, "rollout.mode": "sync",
            "rollout.weight_sync_interval_steps": 1, "training.checkpoint_interval_steps": 1000, **sets}
    return load_config(None, [f"{k}={v}" for k, v in base.items()], env={}).config


_ids = iter(range(10**6))


def episode(reward, *, length: int = 6, outcome: str = Outcome.FAIL, group: str | None = None) -> Episode:
    first = next(_ids) * 1000  # every record's tokens differ: a sample says which episode it came from
    record = SimpleNamespace(token_ids=list(range(first, first + length)), loss_mask=[0, 0] + [1] * (length - 2),
                             logprobs=[0.0] * length, segment_starts=None, outcome=outcome,
                             harness="terminal_like", task_id=f"t{first}")
    return Episode(group or f"g{next(_ids)}", record, version=0, reward=reward, tokens=length - 2)


def group(*rewards, **kw) -> list[Episode]:
    gid = f"g{next(_ids)}"
    return [episode(r, group=gid, **kw) for r in rewards]


class FakeRun:
    """What `StepLoop._step` reads of a run's parts and state (run/parts.py): the buffer is real; the
    rollout puts scripted groups in it, one list per call (sync mode); the backend records what it is handed."""

    def __init__(self, cfg, script: list[list[list[Episode]]]) -> None:
        self.cfg, self.script, self.trained = cfg, list(script), []
        self.state = RunState()
        controller = SimpleNamespace(run=self._generate, counters={}, timers={}, in_flight=0,
                                     harness_errors=SimpleNamespace(raise_if_failed=lambda: None),
                                     harness_stats=SimpleNamespace(snapshot=dict))
        self.parts = RunParts(buffer=TrajectoryBuffer(256, 10, cfg.rollout.group_size), samples=SampleBuilder(cfg),
                              controller=controller, backend=SimpleNamespace(train_step=self._train),
                              publisher=SimpleNamespace(before_step=self._none, wait=self._none, sync_retrying=self._sync),
                              watchdog=SimpleNamespace(busy=lambda name: contextlib.nullcontext(), stuck=list, report=dict),
                              sandboxes=SimpleNamespace(metrics=dict))

    async def _generate(self, stop, max_groups):
        for g in (self.script.pop(0) if self.script else [])[:max_groups]:
            for e in g:
                await self.parts.buffer.put(e)

    def _train(self, samples):
        self.trained.append(list(samples))
        return {"loss": 0.0}

    async def _none(self, *args):
        return None

    async def _sync(self, backend, version):
        return {"version": version, "seconds": 0.0}


def one_step(run: FakeRun) -> dict:
    loop = StepLoop(run.parts, run.state, run.cfg.rollout, run.cfg.training, run.cfg.observe)
    return asyncio.run(loop._step(10, True, RunSummary(steps=0, start_step=0, version=0), 0.0))


def test_flat_groups_are_dropped_refilled_and_counted():
    signal_a, signal_b = group(1.0, 0.0), group(0.0, 0.5)
    run = FakeRun(cfg_with(**{"rollout.dynamic_sampling": "true"}), [[group(1.0, 1.0), signal_a], [signal_b]])
    row = one_step(run)
    assert len(run.trained) == 1
    with_signal = {e.record.token_ids[0] for e in signal_a + signal_b}
    assert len(run.trained[0]) == 4 and {s.token_ids[0] for s in run.trained[0]} == with_signal
    assert all(s.advantage != 0 for s in run.trained[0])
    assert row[keys.ROLLOUT_DROPPED_FLAT_GROUPS] == 1 and row[keys.ROLLOUT_REFILL_ROUNDS] == 1
    assert row[keys.ROLLOUT_SKIPPED_STEPS] == 0 and row[keys.REWARD_STD] > 0


def test_a_batch_of_only_flat_groups_is_never_trained_and_the_step_is_counted_skipped():
    flat = [[group(0.0, 0.0), group(1.0, 1.0)], [group(0.0, None), group(None, None)], [group(0.5, 0.5), group(0.0, 0.0)]]
    run = FakeRun(cfg_with(**{"rollout.dynamic_sampling": "true", "rollout.max_refill_rounds": 2}), flat)
    row = one_step(run)
    assert run.trained == []  # the trainer was handed nothing
    assert run.state.step == 1 and keys.TRAIN_LOSS not in row
    assert row[keys.ROLLOUT_SKIPPED_STEPS] == 1 and row[keys.ROLLOUT_REFILL_ROUNDS] == 2
    assert row[keys.ROLLOUT_DROPPED_FLAT_GROUPS] == 6


def test_past_max_refill_rounds_the_step_trains_the_groups_with_signal_it_has():
    keep = group(1.0, 0.0)
    run = FakeRun(cfg_with(**{"rollout.dynamic_sampling": "true", "rollout.max_refill_rounds": 1}),
                  [[group(0.0, 0.0), keep], [group(1.0, 1.0)], [group(1.0, 0.0)]])
    row = one_step(run)
    assert [len(b) for b in run.trained] == [2]
    assert sorted(s.advantage for s in run.trained[0])[0] < 0 < sorted(s.advantage for s in run.trained[0])[1]
    assert row[keys.ROLLOUT_REFILL_ROUNDS] == 1 and row[keys.ROLLOUT_DROPPED_FLAT_GROUPS] == 2


def test_by_default_flat_groups_are_trained_as_before_and_the_row_has_no_shaping_keys():
    run = FakeRun(cfg_with(), [[group(0.0, 0.0), group(1.0, 1.0)]])
    row = one_step(run)
    assert [len(b) for b in run.trained] == [4] and all(s.advantage == 0.0 for s in run.trained[0])
    assert not {keys.ROLLOUT_DROPPED_FLAT_GROUPS, keys.ROLLOUT_REFILL_ROUNDS, keys.ROLLOUT_SKIPPED_STEPS,
                keys.ROLLOUT_OVERLONG_FILTERED} & set(row)


def test_signal_needs_two_unmasked_rewards_that_differ():
    assert has_signal([1.0, 0.0]) and has_signal([None, 1.0, 0.0])
    assert not has_signal([1.0, 1.0]) and not has_signal([1.0, None]) and not has_signal([None, None])


@pytest.mark.parametrize("length, max_len, buffer, penalty, expected", [
    (80, 100, 20, 1.0, 0.0),      # at max_len - buffer: none
    (85, 100, 20, 1.0, 0.25),     # 1.0 * (85 - 80) / 20
    (90, 100, 20, 0.5, 0.25),     # 0.5 * (90 - 80) / 20
    (100, 100, 20, 1.0, 1.0),     # at the limit: the whole penalty
    (130, 100, 20, 1.0, 1.0),     # held there beyond it
    (99, 100, 0, 1.0, 0.0),       # buffer 0: off
])
def test_overlong_penalty_values(length, max_len, buffer, penalty, expected):
    assert math.isclose(overlong_penalty(length, max_len, buffer, penalty), expected)


def test_soft_overlong_penalty_is_the_reward_the_advantages_see():
    cfg = cfg_with(**{"training.seq_len_limit": 100, "training.overlong_buffer_tokens": 20})
    short, long = episode(1.0, length=60, group="g"), episode(1.0, length=90, group="g")  # 90: 1 - 10/20 = 0.5
    samples, stats = SampleBuilder(cfg)([[short, long]], version=0)
    assert math.isclose(stats[keys.REWARD_MEAN], 0.75)
    assert samples[0].advantage > 0 > samples[1].advantage  # equal raw rewards, a signal once shaped


def test_overlong_filter_masks_episodes_cut_at_the_length_limit_only():
    cfg = cfg_with(**{"training.seq_len_limit": 100, "training.overlong_filter": "true"})
    cut = episode(0.0, length=95, outcome=Outcome.TRUNCATED, group="g")       # no room left: overlong
    turns = episode(0.0, length=40, outcome=Outcome.TRUNCATED, group="g")     # turn limit: trained
    ok = episode(1.0, length=40, outcome=Outcome.SUCCESS, group="g")
    samples, stats = SampleBuilder(cfg)([[cut, turns, ok]], version=0)
    assert [len(s.token_ids) for s in samples] == [40, 40]
    assert stats[keys.ROLLOUT_OVERLONG_FILTERED] == 1 and stats[keys.ROLLOUT_EPISODES_TRAINED] == 2
    assert samples[0].advantage < 0 < samples[1].advantage  # the cut episode still counts in the baseline
    unfiltered, _ = SampleBuilder(cfg_with(**{"training.seq_len_limit": 100}))([[cut, turns, ok]], version=0)
    assert len(unfiltered) == 3


def test_overlong_buffer_must_be_below_the_sequence_limit():
    with pytest.raises(ConfigError, match="overlong_buffer_tokens"):
        cfg_with(**{"training.seq_len_limit": 100, "training.overlong_buffer_tokens": 100})


# loss aggregation: two sequences, ratio 1.1 at one token of the first (A = 1) and 0.9 at one of the
# second (A = -2); per-token losses -max(A r, A clip(r)): row 0: -1, -1.1, -1 (sum -3.1, 3 tokens);
# row 1: 1.8 (1 token)
MASK = torch.tensor([[0.0, 1, 1, 1], [0.0, 1, 0, 0]])
OLD = torch.zeros(2, 4)
NEW = torch.tensor([[0.0, 0.0, math.log(1.1), 0.0], [0.0, math.log(0.9), 0.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])
GOLDEN = {"token_mean": (-3.1 + 1.8) / 4, "seq_mean_token_sum": (-3.1 + 1.8) / 2, "seq_mean": (-3.1 / 3 + 1.8) / 2}


@pytest.mark.parametrize("mode", sorted(GOLDEN))
def test_loss_aggregation_golden_values(mode):
    loss, _ = ppo_clip_loss(NEW, OLD, ADV, MASK, 0.2, token_weights=aggregation_weights(mode, MASK, 2))
    assert math.isclose(loss.item(), GOLDEN[mode], rel_tol=1e-6)


@pytest.mark.parametrize("mode", sorted(GOLDEN))
def test_loss_aggregation_over_micro_batches_sums_to_the_whole(mode):
    parts = [ppo_clip_loss(NEW[i:i + 1], OLD[i:i + 1], ADV[i:i + 1], MASK[i:i + 1], 0.2, num_tokens=4,
                           token_weights=aggregation_weights(mode, MASK[i:i + 1], 2))[0].item() for i in range(2)]
    assert math.isclose(sum(parts), GOLDEN[mode], rel_tol=1e-6)


def test_unknown_loss_aggregation_names_the_choices():
    with pytest.raises(ValueError, match="seq_mean_token_sum"):
        aggregation_weights("sum", MASK, 2)
