"""`with_overrides`: the stage 8 short recipe and other programmatic overrides go through the same
validation as the config file and --set, and name their origin when wrong."""

from __future__ import annotations

import pytest

from agentrl_cli.config.load import load_config, with_overrides
from agentrl_cli.config.models import SHORT_RECIPE
from agentrl_cli.core.errors import ConfigError


def test_dotted_and_nested_keys_set_single_values_and_leave_the_rest():
    base = load_config(None, ["training.seed=7"], env={}).config
    cfg = with_overrides(base, {"training.learning_rate": 3e-4, "rollout": {"group_size": 8}}, "test")
    assert cfg.training.learning_rate == 3e-4 and cfg.rollout.group_size == 8
    assert cfg.training.seed == 7 and cfg.rollout.mode == base.rollout.mode  # not replaced wholesale
    assert base.training.learning_rate != 3e-4  # the original is untouched


@pytest.mark.parametrize("overrides, words", [({"training.learning_rat": 1e-3}, "learning_rat"),
                                              ({"training.learning_rate": 5}, "learning_rate")])
def test_a_bad_key_or_value_names_it_and_the_origin(overrides, words):
    with pytest.raises(ConfigError) as err:
        with_overrides(load_config(None, env={}).config, overrides, "stages.short_recipe")
    assert words in str(err.value) and "stages.short_recipe" in str(err.value)


def test_the_short_recipe_is_valid_and_null_turns_it_off():
    cfg = load_config(None, env={}).config
    assert cfg.stages.short_recipe == SHORT_RECIPE
    tuned = with_overrides(cfg, cfg.stages.short_recipe, "stages.short_recipe")
    assert tuned.rollout.mode == "sync" and tuned.rollout.curriculum is True
    assert load_config(None, ["stages.short_recipe=null"], env={}).config.stages.short_recipe is None
