"""Where the time goes (`acceptance/phases.py`): lower bounds, ratios, the phases of one step from a
metrics row and the servers' counters, and their mean; the learner's step clock."""

from __future__ import annotations

import pytest

from agentrl_cli.acceptance import phases
from agentrl_cli.acceptance.phases import Rates

FLOPS = {"per_generated_token": 200, "per_trained_token": 600}  # N = 100, full fine-tuning


def test_lower_bound_and_ratio():
    assert phases.lower_bound_s(1e9, 2e9) == 0.5
    assert phases.lower_bound_s(1e9, None) is None and phases.lower_bound_s(1e9, 0.0) is None
    assert phases.ratio(2.0, 0.5) == 4.0
    assert phases.ratio(2.0, None) is None and phases.ratio(None, 0.5) is None and phases.ratio(1.0, 0.0) is None


def test_rates_bound_each_phase_by_its_flops_and_decode_by_the_lower_of_two():
    rates = Rates(gemm_flops=1000.0, flops=FLOPS, decode_rate=lambda batch: 10.0 * batch)
    assert rates.tokens(5, "per_generated_token") == 1.0  # 5 x 200 FLOP at 1000 FLOP/s
    assert rates.backward(5) == 2.0  # (600 - 200) x 5 / 1000
    assert rates.decode(40, rows=4) == 1.0  # 40 tokens at 40 tokens/s, below the flat 8 s
    slow = Rates(gemm_flops=1e6, flops=FLOPS, decode_rate=lambda batch: 1.0)
    assert slow.decode(40, rows=4) == 40 * 200 / 1e6  # the timed multiplies slower than the FLOPs: the flat bound
    assert Rates(1000.0, FLOPS).decode(5, rows=None) == 1.0
    assert Rates(None, None).tokens(5, "per_generated_token") is None and Rates(None, None).decode(5, 2) is None


def test_server_delta_sums_the_growth_of_every_server_and_needs_all_of_them():
    zero = dict.fromkeys(phases.SERVER_COUNTERS, 0)
    one = {**zero, "decode_tokens_total": 10, "busy_seconds_total": 1.5}
    two = {**zero, "decode_tokens_total": 4, "busy_seconds_total": 0.5}
    delta = phases.server_delta([zero, zero], [one, two])
    assert delta["decode_tokens_total"] == 14 and delta["busy_seconds_total"] == 2.0
    assert phases.server_delta([zero, None], [one, two]) is None and phases.server_delta([], []) is None
    info = {"internal_states": [{**one, "other": 1}]}
    assert phases.server_counters(info) == one
    assert phases.server_counters({"internal_states": [{"busy_seconds_total": 1.0}]}) is None  # another engine's
    assert phases.server_counters({}) is None


ROW = {"time/step_s": 10.0, "time/wait_s": 4.0, "time/train_s": 5.0, "time/sync_s": 0.5, "time/checkpoint_s": 0.2,
       "time/other_s": 0.3, "time/reward_s": 0.1, "train/forward_s": 2.0, "train/backward_s": 2.5,
       "train/optimizer_s": 0.25, "train/sequence_tokens": 5}
SERVER = {"busy_seconds_total": 3.0, "prefill_seconds_total": 0.5, "prefill_tokens_total": 5,
          "decode_seconds_total": 2.0, "decode_tokens_total": 80, "decode_steps_total": 20, "decode_rows_total": 80}


def test_one_steps_phases_add_up_to_its_wall_time_and_carry_their_bounds():
    step = phases.step_phases(ROW, SERVER, 10.0, Rates(1000.0, FLOPS, lambda batch: 10.0 * batch), max_batch_size=64)
    path, beside = step["path"], step["beside"]
    assert set(path) == set(phases.PATH) and set(beside) == set(phases.BESIDE)
    assert sum(p["s"] for p in path.values()) == pytest.approx(step["step_s"])  # train_rest = 5 - 4.75
    assert path["train_rest"]["s"] == pytest.approx(0.25) and step["unaccounted_s"] == 0.3
    assert path["forward"] == {"s": 2.0, "bound_s": 1.0, "ratio": 2.0}
    assert path["backward"] == {"s": 2.5, "bound_s": 2.0, "ratio": 1.25}
    assert "bound_s" not in path["optimizer"] and "bound_s" not in path["trainer_idle"]
    assert beside["prefill"] == {"s": 0.5, "bound_s": 1.0, "ratio": 0.5, "tokens": 5}
    decode = beside["decode"]
    assert (decode["occupancy"], decode["max_batch_size"], decode["bound_s"], decode["ratio"]) == (4.0, 64, 2.0, 1.0)
    assert decode["bound_at_rows_s"] == 2.0  # 80 tokens at 40 tokens/s (4 rows); the flat bound, 16 s, is higher
    assert beside["server_rest"]["s"] == 0.5 and beside["server_idle"]["s"] == 7.0  # 10 s window, 3 s busy
    assert step["tokens"] == {"trained": 5, "prefill": 5, "decode": 80}


def test_a_step_without_server_counters_or_learner_timers_keeps_what_it_has():
    row = {k: v for k, v in ROW.items() if not k.startswith("train/")}
    step = phases.step_phases(row, None, None, Rates(None, None))
    assert set(step["beside"]) == {"scoring"} and step["path"]["forward"]["s"] is None
    assert step["path"]["train_rest"]["s"] == 5.0


def test_mean_phases_averages_seconds_and_bounds_and_prints():
    rates = Rates(1000.0, FLOPS, lambda batch: 10.0 * batch)
    a = phases.step_phases(ROW, SERVER, 10.0, rates)
    b = phases.step_phases({**ROW, "time/step_s": 12.0, "time/other_s": 2.3, "train/forward_s": 4.0}, SERVER, 12.0, rates)
    mean = phases.mean_phases([a, b])
    assert mean["step_s"] == 11.0 and mean["path"]["forward"] == {"s": 3.0, "bound_s": 1.0, "ratio": 3.0}
    assert phases.mean_phases([]) == {}
    text = "\n".join(phases.table(mean, "agentrl"))
    assert "forward" in text and "x3.0" in text and "occupancy 4.0" in text
    assert phases.compact(mean)["forward"] == "3.0000 s, bound 1.0000 s, x3.0"
    c = phases.step_phases(ROW, {**SERVER, "decode_steps_total": 0, "decode_rows_total": 0, "decode_tokens_total": 0}, 10.0, rates)
    decode = phases.mean_phases([a, b, c])["beside"]["decode"]  # c decoded nothing: no occupancy, left out of its mean
    assert decode["occupancy"] == 4.0 and decode["tokens"] == pytest.approx(53.33)
    assert decode["bound_at_rows_s"] == round(4 / 3, 5)  # 2 s, 2 s and, decoding nothing, 0 s


def test_the_step_clock_sums_each_phase_over_its_spans():
    from agentrl_cli.learner.step_clock import StepClock

    clock = StepClock("cpu")
    t = clock.mark()
    t = clock.span("forward", t)
    t = clock.span("backward", t)
    clock.span("forward", t)
    seconds = clock.seconds()
    assert set(seconds) == {"forward_s", "backward_s", "optimizer_s"} and seconds["optimizer_s"] == 0.0
    assert all(v >= 0 for v in seconds.values())
