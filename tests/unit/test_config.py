"""Config: defaults work, precedence holds, and every mistake names the key path and the fix."""

from __future__ import annotations

import pytest

from agentrl_cli.config import PlatformConfig, load_config
from agentrl_cli.config.explain import describe_keys
from agentrl_cli.config.template import render_template
from agentrl_cli.core.errors import ConfigError

from importlib import resources


def test_defaults_validate_and_have_descriptions():
    loaded = load_config(None, env={})
    assert loaded.source == "built-in defaults"
    assert loaded.config == PlatformConfig()
    rows = describe_keys()
    missing = [key for key, _, desc, _ in rows if not desc]
    assert not missing, f"fields without a description: {missing}"
    assert {"rollout.concurrency", "rollout.max_steps_per_trajectory", "rollout.step_timeout_seconds",
            "rollout.allow_partial_resume", "rollout.weight_sync_interval_steps", "harnesses[].image_tag",
            "harnesses[].memory_gb", "harnesses[].network", "training.seq_len_limit",
            "training.checkpoint_interval_steps", "training.resume_from_latest"} <= {r[0] for r in rows}


def test_committed_template_matches_the_models():
    committed = resources.files("templates").joinpath("platform.yaml").read_text(encoding="utf-8")
    assert committed == render_template(), "regenerate: python -m agentrl_cli.config.template > templates/platform.yaml"


def test_template_loads_to_the_defaults(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(render_template())
    assert load_config(path, env={}).config == PlatformConfig()


def test_precedence_file_then_env_then_set(write_yaml):
    path = write_yaml("rollout:\n  concurrency: 3\n  max_staleness: 5\n")
    assert load_config(path, env={}).config.rollout.concurrency == 3
    env = {"AGENTRL_ROLLOUT__CONCURRENCY": "7"}
    assert load_config(path, env=env).config.rollout.concurrency == 7
    both = load_config(path, ["rollout.concurrency=9"], env=env).config
    assert both.rollout.concurrency == 9 and both.rollout.max_staleness == 5


def test_set_addresses_list_items_and_parses_scalars():
    cfg = load_config(None, ["harnesses.0.cpu=2.5", "rollout.allow_partial_resume=false"], env={}).config
    assert cfg.harnesses[0].cpu == 2.5
    assert cfg.rollout.allow_partial_resume is False


def test_file_list_replaces_default_list(write_yaml):
    path = write_yaml("harnesses:\n  - name: terminal_like\n    cpu: 2\n")
    cfg = load_config(path, env={}).config
    assert [h.name for h in cfg.harnesses] == ["terminal_like"]


def test_config_hash_changes_with_content():
    a = load_config(None, env={}).hash
    b = load_config(None, ["rollout.concurrency=8"], env={}).hash
    assert a != b and len(a) == 16


def test_secret_never_appears_in_resolved_config():
    loaded = load_config(None, ["inference.api_key=sk-very-secret"], env={})
    assert loaded.config.inference.api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in str(loaded.resolved())


def _error(**kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(env=kwargs.pop("env", {}), **kwargs)
    return info.value


def test_wrong_type_names_key_value_rule_and_fix(write_yaml):
    e = _error(path=write_yaml("rollout:\n  concurrency: lots\n"))
    assert "rollout.concurrency" in e.message and "'lots'" in e.message
    assert "valid integer" in e.message
    assert "rollout.concurrency" in e.hint and "integer" in e.hint


def test_unknown_key_suggests_the_right_one(write_yaml):
    e = _error(path=write_yaml("rollout:\n  concurency: 8\n"))
    assert "unknown key rollout.concurency" in e.message
    assert "did you mean concurrency" in e.message
    assert "rename rollout.concurency to rollout.concurrency" in e.hint


def test_unknown_section_is_an_error(write_yaml):
    e = _error(path=write_yaml("rolout:\n  concurrency: 8\n"))
    assert "unknown key rolout" in e.message and "did you mean rollout" in e.message


def test_missing_file_says_how_to_create_one(tmp_path):
    e = _error(path=tmp_path / "nope.yaml")
    assert "not found" in e.message and "agentrl init" in e.hint


def test_malformed_yaml_gives_line_and_column(write_yaml):
    e = _error(path=write_yaml("rollout:\n  concurrency: 8\n bad: [1, 2\n"))
    assert "malformed YAML" in e.message and "line" in e.message


def test_non_mapping_file_is_rejected(write_yaml):
    e = _error(path=write_yaml("- just\n- a list\n"))
    assert "must hold a mapping" in e.message


def test_out_of_range_value_names_the_bound(write_yaml):
    e = _error(path=write_yaml("rollout:\n  max_staleness: -1\n"))
    assert "rollout.max_staleness" in e.message and "greater than or equal to 0" in e.message
    assert ">= 0" in e.hint


def test_literal_value_lists_the_choices():
    e = _error(overrides=["inference.engine=tgi"])
    assert "inference.engine" in e.message and "one of hf, sglang, vllm" in e.hint


@pytest.mark.parametrize("item", ["no-equals-sign", "=5", "rollout..concurrency=1"])
def test_bad_set_is_explained(item):
    e = _error(overrides=[item])
    assert item.split("=")[0] in e.message or "--set" in e.message
    assert e.hint


def test_set_index_outside_list():
    e = _error(overrides=["harnesses.9.cpu=1"])
    assert "harnesses.9" in e.message and "index" in e.hint


def test_env_override_error_names_the_variable():
    e = _error(env={"AGENTRL_ROLLOUT__CONCURRENCY": "zero"})
    assert "environment variable AGENTRL_ROLLOUT__CONCURRENCY" in e.message


def test_duplicate_harness_names_rejected(write_yaml):
    e = _error(path=write_yaml("harnesses:\n  - name: a\n  - name: a\n"))
    assert "harnesses" in e.message and "unique" in e.message
