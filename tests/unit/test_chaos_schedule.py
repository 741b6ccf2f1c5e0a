"""The chaos plan: a function of the seed, the rank fault first (after the first checkpoint, in the
first quarter), the others after it up to the middle; bounds that follow the config; bad --faults is
a usage error."""

from __future__ import annotations

import pytest

from agentrl_cli.acceptance.chaos.schedule import FAULTS, bounds, parse_faults, plan
from agentrl_cli.config import load_config


def test_the_plan_is_a_function_of_the_seed():
    a = plan(list(FAULTS), 5, 20, servers=2, ranks=2, checkpoint_every=2)
    assert a == plan(list(FAULTS), 5, 20, servers=2, ranks=2, checkpoint_every=2)
    assert any(plan(list(FAULTS), s, 20, servers=2, ranks=2, checkpoint_every=2) != a for s in range(6))


@pytest.mark.parametrize("seed", range(20))
def test_the_rank_fault_comes_first_after_a_checkpoint_and_the_rest_by_the_middle(seed):
    faults = plan(list(FAULTS), seed, 20, servers=2, ranks=2, checkpoint_every=2)
    assert sorted(f.kind for f in faults) == sorted(FAULTS)
    rank, *others = faults  # in the order they are due
    assert rank.kind == "rank" and 2 <= rank.after_step <= 5 and rank.target in (0, 1)
    assert all(rank.after_step < f.after_step <= 10 for f in others)
    assert len({f.after_step for f in faults}) == len(faults)  # room for one per boundary


def test_without_the_rank_fault_the_others_start_at_the_first_boundary():
    faults = plan(["server", "reward"], 1, 8, servers=2, ranks=2, checkpoint_every=2)
    assert all(1 <= f.after_step <= 4 for f in faults)


def test_faults_are_parsed_and_a_wrong_one_is_named():
    assert parse_faults("all") == list(FAULTS)
    assert parse_faults("server, rank") == ["server", "rank"]
    with pytest.raises(ValueError, match="unknown fault.*disk.*choose from"):
        parse_faults("server,disk")
    with pytest.raises(ValueError, match="named twice"):
        parse_faults("rank,rank")


def test_bounds_follow_the_config():
    base = load_config(None, [], env={}).config
    slower = load_config(None, ["inference.startup_timeout_s=600", "reward.max_retries=4"], env={}).config
    assert bounds("server", slower)[1] - bounds("server", base)[1] == 300
    assert bounds("reward", slower)[1] - bounds("reward", base)[1] == pytest.approx(0.1 * (2 ** 3 - 2 ** 1))
    for kind in FAULTS:
        detect, recover = bounds(kind, base)
        assert 0 < detect <= recover


def test_a_rank_faults_detection_bound_is_the_trainers_step_wait_then_the_rank_call():
    base = load_config(None, [], env={}).config
    assert bounds("rank", base)[0] == 600 + 1800  # the bound at the defaults, as before the wait had its own key
    longer = load_config(None, ["training.step_wait_timeout_s=900"], env={}).config
    assert bounds("rank", longer)[0] - bounds("rank", base)[0] == 300
    env_step = load_config(None, ["rollout.step_timeout_seconds=5"], env={}).config
    assert bounds("rank", env_step) == bounds("rank", base)  # an environment step's deadline is not the trainer's wait


def test_an_unknown_fault_is_a_usage_error_before_anything_starts(cli, isolated):
    result = cli("chaos", "--faults", "server,disk")
    assert result.exit_code == 2 and "unknown fault(s) disk" in result.output
    assert not (isolated / "runs").exists()


def test_a_config_under_which_a_fault_cannot_happen_is_a_usage_error(cli, isolated):
    result = cli("chaos", "--faults", "rank", "--set", "training.world_size=1")
    assert result.exit_code == 2 and "training.world_size is 1" in result.output
    result = cli("chaos", "--faults", "sandbox", "--set", "observe.health_interval_s=0")
    assert result.exit_code == 2 and "no supervisor" in result.output
    assert not (isolated / "runs").exists()
