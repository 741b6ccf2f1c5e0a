"""`rollout.max_buffer_mb`: the limit on episodes the rollout holds (in flight plus buffered) derived from
a memory budget, checked against arithmetic done here; the buffer a run builds takes it; `agentrl plan`
prints it; a budget that holds no episode is refused at load (exit 2)."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.config.buffer_budget import buffer_limit
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer


def test_the_default_budget_keeps_the_default_buffer_size():
    cfg = load_config(None, [], env={}).config
    buffer = TrajectoryBuffer.from_config(cfg)
    per = 2048 * (4 + 1 + 4 + 8) + 16 * 1024  # context 2048: ids, mask, log-probs, text; the record
    assert buffer.limit.bytes_per_episode == per and buffer.limit.budget_episodes == 1024 * 2**20 // per
    assert buffer.capacity == cfg.rollout.buffer_size == 256 and buffer.limit.binds == "rollout.buffer_size"


def test_a_small_budget_lowers_the_limit_and_says_it_binds():
    cfg = load_config(None, ["rollout.max_buffer_mb=2", "model.context_length=4096"], env={}).config
    buffer = TrajectoryBuffer.from_config(cfg)
    per = 4096 * 17 + 16384
    assert buffer.capacity == 2 * 2**20 // per == 24 < cfg.rollout.buffer_size
    assert buffer.limit.binds == "rollout.max_buffer_mb" and "rollout.max_buffer_mb binds" in buffer.limit.formula()
    # a longer context holds fewer episodes in the same budget; a smaller buffer_size binds instead
    assert buffer_limit(2, 256, 8192).capacity < buffer.capacity
    assert buffer_limit(2, 10, 4096).capacity == 10 and buffer_limit(2, 10, 4096).binds == "rollout.buffer_size"


def test_a_budget_that_holds_no_episode_is_refused_at_load_naming_the_key(cli):
    with pytest.raises(ConfigError, match=r"rollout.max_buffer_mb 0.01 MiB holds no episode .* raise rollout.max_buffer_mb"):
        load_config(None, ["rollout.max_buffer_mb=0.01"], env={})
    result = cli("plan", "--set", "rollout.max_buffer_mb=0.01")
    assert result.exit_code == 2 and "rollout.max_buffer_mb" in result.output


def test_plan_prints_the_derivation(cli, random_model_dir):
    result, data = cli.json("plan", "--set", f"model.path={random_model_dir}", "--set", "rollout.max_buffer_mb=3",
                            "--set", "model.context_length=1024", "--set", "rollout.concurrency=200")
    assert result.exit_code == 0
    lines = {ln["item"]: ln for ln in data["lines"] if ln["area"] == "rollout"}
    held = lines["episodes held at most (in flight + buffered)"]
    assert held["value"] == 3 * 2**20 // (1024 * 17 + 16384) == 93 and held["inputs"]["binds"] == "rollout.max_buffer_mb"
    assert "rollout.max_buffer_mb 3 MiB" in held["formula"] and "model.context_length 1024" in held["formula"]
    assert lines["episodes in flight at most"]["value"] == 93  # concurrency 200 cannot be reached under this budget
    assert lines["memory per held episode"]["inputs"]["bytes_per_episode"] == 1024 * 17 + 16384
