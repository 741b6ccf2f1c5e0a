"""Every key `agentrl config show --describe` lists can be set with `--set KEY=<its listed default>`,
and the config loads with that value there.

The keys come from `describe_keys()`, the rows `config show --describe` prints. A key of a list of
sections (`harnesses[].cpu`) is set on the list's first item (`harnesses.0.cpu`): every such list is
non-empty by default. A key of an optional section that is off by default (training.lora,
reward.judge) turns the section on with its defaults.

Skipped, and only these: keys that are required (harnesses[].name, controlplane.pools[].name,
controlplane.priorities[].name and .value). They have no default — the listed None stands for
"none" — so there is nothing to write; setting one to null is rightly refused."""

from __future__ import annotations

import pytest
import yaml

from agentrl_cli.config.explain import describe_keys, field_at
from agentrl_cli.config.load import load_config
from agentrl_cli.core.errors import ConfigError


def as_set_value(value) -> str:
    """`value` written as a --set value (YAML flow style, which --set parses back)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    return text.removesuffix("...").strip()


def settable() -> list[tuple[str, tuple, object]]:
    rows = []
    for key, _allowed, _meaning, default in describe_keys():
        loc = tuple(int(p) if p.isdigit() else p for p in key.replace("[]", ".0").split("."))
        if not field_at(loc).is_required():
            rows.append((key, loc, default))
    return rows


SETTABLE = settable()


def test_only_the_required_keys_are_left_out():
    left_out = {key for key, *_ in describe_keys()} - {key for key, *_ in SETTABLE}
    assert left_out == {"harnesses[].name", "controlplane.pools[].name", "controlplane.priorities[].name",
                        "controlplane.priorities[].value"}
    assert {"training.lora.rank", "reward.judge.mode"} <= {key for key, *_ in SETTABLE}


@pytest.mark.parametrize("key, loc, default", SETTABLE, ids=[key for key, *_ in SETTABLE])
def test_every_described_key_takes_its_listed_default_by_set(key, loc, default):
    item = ".".join(map(str, loc)) + "=" + as_set_value(default)
    node = load_config(None, [item], env={}).config.model_dump(mode="python")
    for part in loc:
        node = node[part]  # a section still off (None) would raise here
    assert node == default, item


def test_a_key_of_an_optional_section_turns_it_on_with_its_defaults():
    off = load_config(None, env={}).config
    assert off.training.lora is None and off.reward.judge is None
    cfg = load_config(None, ["training.lora.rank=16", "reward.judge.mode=group"], env={}).config
    assert cfg.training.lora.rank == 16 and cfg.training.lora.alpha == 16.0  # alpha: LoraConfig's default
    assert cfg.reward.judge.mode == "group" and cfg.reward.judge.max_tokens == 512
    env = load_config(None, env={"AGENTRL_TRAINING__LORA__DROPOUT": "0.1"}).config
    assert env.training.lora.dropout == 0.1 and env.training.lora.rank == 8
    assert load_config(None, ["training.lora.rank=16", "training.lora=null"], env={}).config.training.lora is None


def test_a_key_below_a_plain_value_is_still_refused():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["training.learning_rate.x=1"], env={})
    assert "training.learning_rate is a value, not a section" in err.value.message


def test_config_show_sets_a_lora_key(cli):
    result, data = cli.json("config", "show", "--set", "training.lora.rank=8")
    assert result.exit_code == 0, result.stderr
    assert data["config"]["training"]["lora"]["rank"] == 8 and data["overrides"] == ["training.lora.rank=8"]
