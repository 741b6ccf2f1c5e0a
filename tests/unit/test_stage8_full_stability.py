"""Stage 8 full judges a long run as one that kept learning (stages/s8_training.py `_stability`): the last
third of the training harnesses' eval curve within stages.full_max_success_drop of the best third, entropy
above stages.full_min_entropy on every 5-step median, gradient norms bounded, held-out harnesses not below
their start; too short a curve is skipped, naming why."""

from __future__ import annotations

from agentrl_cli.config import load_config
from agentrl_cli.run.loop.steps import RunSummary
from stages.s8_training import _stability, _thirds

HARNESSES = '[{"name": "tool_api_like"}, {"name": "terminal_like", "held_out": true, "weight": 0.0}]'


def _cfg(*sets: str):
    return load_config(None, [f"harnesses={HARNESSES}", *sets], env={}).config


def _run(train: list[float], held: list[float], entropy: list[float], norms: list[float] | None = None) -> RunSummary:
    evals = [{"tool_api_like": {"success_rate": t}, "terminal_like": {"success_rate": h}} for t, h in zip(train, held)]
    norms = norms or [0.5] * len(entropy)
    return RunSummary(steps=len(entropy), start_step=0, version=len(entropy), evals=evals,
                      metrics=[{"train/entropy": e, "train/grad_norm": g} for e, g in zip(entropy, norms)])


def _status(checks) -> dict:
    return {c.name: c.status.value for c in checks}


def test_thirds_split_the_curve_in_order():
    assert _thirds([1, 2, 3]) == [[1], [2], [3]]
    assert _thirds(list(range(8))) == [[0, 1], [2, 3, 4, 5], [6, 7]]


def test_a_run_that_rose_and_held_passes_and_one_that_fell_back_fails():
    cfg = _cfg("stages.full_min_entropy=0.2")
    held_up = _stability(cfg, _run([0.4, 0.5, 0.7, 0.75, 0.7, 0.72], [0.1, 0.1, 0.2, 0.1, 0.1, 0.2], [0.9] * 12))
    assert set(_status(held_up).values()) == {"pass"}, _status(held_up)
    fell = _stability(cfg, _run([0.4, 0.7, 0.8, 0.7, 0.6, 0.6], [0.1] * 6, [0.9] * 12))
    hold = next(c for c in fell if c.name == "eval success holds")
    assert hold.status.value == "fail" and hold.measured["best_third"] == 0.75 and hold.measured["last_third"] == 0.6


def test_entropy_is_judged_against_the_floor_on_five_step_medians():
    cfg = _cfg("stages.full_min_entropy=0.2")
    one_dip = _stability(cfg, _run([0.5] * 3, [0.0] * 3, [0.5, 0.5, 0.05, 0.5, 0.5, 0.5, 0.5]))
    assert _status(one_dip)["entropy stays above its floor"] == "pass"  # one low step is not a collapse
    collapsed = _stability(cfg, _run([0.5] * 3, [0.0] * 3, [0.9, 0.8, 0.5, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]))
    check = next(c for c in collapsed if c.name == "entropy stays above its floor")
    assert check.status.value == "fail" and check.measured["lowest_5_step_median"] == 0.1
    unset = _stability(_cfg(), _run([0.5] * 3, [0.0] * 3, [0.9] * 6 + [0.01] * 6))
    assert _status(unset)["entropy neither collapses nor explodes"] == "fail"  # short's trend rule without a floor


def test_a_held_out_harness_below_its_start_and_a_spiking_gradient_fail():
    checks = _status(_stability(_cfg(), _run([0.5] * 6, [0.3, 0.3, 0.2, 0.2, 0.1, 0.1], [0.9] * 8, [0.5] * 7 + [80.0])))
    assert checks["held-out harness terminal_like not below its start"] == "fail"
    assert checks["gradient norm stable"] == "fail"


def test_too_few_evaluations_are_skipped_with_the_reason():
    checks = _stability(_cfg(), _run([0.5, 0.6], [0.1, 0.1], [0.9] * 3))
    skipped = {c.name: c.detail for c in checks if c.status.value == "skip"}
    assert "2 evaluations" in skipped["eval success holds"]
    assert "need at least 3" in skipped["held-out harness terminal_like not below its start"]
