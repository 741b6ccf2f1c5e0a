"""Stage 8's progress line per trainer step says where the run is and how long is left."""

from __future__ import annotations

from stages.s8_training import _step_line


def test_the_line_shows_step_loss_reward_and_time_left_at_the_pace_so_far():
    line = _step_line({"step": 5, "elapsed_s": 50.0, "train/loss": 0.25, "reward/mean": 0.5}, 20, None)
    assert line == "step 5/20, loss 0.2500, reward 0.500, about 2.5 min left"


def test_a_deadline_that_comes_first_bounds_the_time_left():
    line = _step_line({"step": 5, "elapsed_s": 50.0, "train/loss": 0.25, "reward/mean": None}, 1000, 110.0)
    assert line.endswith("about 1.0 min left") and "reward n/a" in line
