"""Stage 8 short's entropy judgement: medians of the first and last tenth of the steps, so one noisy
step (the curriculum's draw) neither fails a stable run nor hides a collapse."""

from __future__ import annotations

from stages.s8_training import entropy_trend


def test_a_stable_but_noisy_run_passes_where_two_single_steps_would_not():
    noisy = [0.22, 0.08, 0.16, 0.18, 0.10] + [0.05, 0.09, 0.04, 0.07, 0.23] * 15 + [0.06, 0.09, 0.04, 0.10, 0.019]
    assert noisy[-1] < 0.1 * noisy[0]  # what the old single-step comparison failed
    ok, measured = entropy_trend(noisy)
    assert ok and measured["window_steps"] == 8 and measured["first"] > measured["last"] > 0


def test_a_collapse_and_an_explosion_fail():
    assert not entropy_trend([0.2] * 10 + [0.2 * 0.9 ** k for k in range(1, 91)])[0]
    assert not entropy_trend([0.2] * 10 + [0.2 * 1.1 ** k for k in range(1, 91)])[0]


def test_the_window_is_a_tenth_of_the_steps_at_least_five_and_no_entropy_fails():
    assert entropy_trend([1.0] * 200)[1]["window_steps"] == 20
    assert entropy_trend([1.0] * 30)[1]["window_steps"] == 5
    assert entropy_trend([1.0] * 3) == (True, {"first": 1.0, "last": 1.0, "window_steps": 3})
    assert entropy_trend([]) == (False, {"first": None, "last": None, "window_steps": 0})
