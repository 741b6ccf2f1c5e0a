"""Issue 37's offline-to-online loop with the built-in model (whose outcomes are mixed; the random
tiny model of the other tests never succeeds): a stage 8 smoke stores trajectories, `agentrl reward
train` fits a reward model on them, and a second stage 8 smoke with `reward.verifiers:
[reward_model]` passes with the reward model's score as a component of every stored reward. It needs
the built-in model in model.cache_dir (`agentrl model build-tiny`), so it is deselected by default:

    .venv/bin/python -m pytest -m builtin tests/integration/test_reward_model_stage8.py
"""

from __future__ import annotations

import shutil

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.writer import open_writer, read_records
from agentrl_cli.model.resolve import builtin_dir
from agentrl_cli.model.tiny import is_complete
from tests.conftest import free_port

pytestmark = [pytest.mark.builtin, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
              pytest.mark.skipif(not is_complete(builtin_dir(load_config(None, [], env={}).config.model.cache_dir)),
                                 reason="the built-in model is not built (`agentrl model build-tiny`)")]


def test_a_reward_model_trained_on_a_stage8_run_serves_a_stage8_smoke(cli, isolated):
    common = ["--set", "model.path=builtin:tiny-agent", "--set", f"observe.runs_dir={isolated / 'runs'}"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", "--run-id", "source", *common,
                            "--set", f"inference.port={free_port()}", "--set", f"data.root={isolated / 'store'}",
                            "--set", "stages.smoke_steps=16")
    assert data["reports"][0]["status"] == "pass", data["reports"][0]["checks"]
    base = builtin_dir(load_config(None, [], env={}).config.model.cache_dir)
    result, record = cli.json("reward", "train", "--from", "source", "--name", "rm-stage8", "--base", str(base), *common,
                              "--set", f"data.root={isolated / 'store'}", "--set", f"model.cache_dir={isolated / 'cache'}")
    assert result.exit_code == 0, result.stderr
    held = record["metrics"]["held_out"]
    assert held["auc"] is not None and held["auc_ci95"]["low"] <= held["auc"] <= held["auc_ci95"]["high"]
    assert record["counts"]["successes"] and record["counts"]["failures"]

    served = isolated / "store-served"
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", "--run-id", "served", *common,
                            "--set", f"inference.port={free_port()}", "--set", f"data.root={served}",
                            "--set", "stages.smoke_steps=4", "--set", "reward.verifiers=[reward_model]",
                            "--set", f"reward.reward_model={record['path']}", "--set", "reward.weights.reward_model=0.1")
    assert data["reports"][0]["status"] == "pass", data["reports"][0]["checks"]
    cfg = load_config(None, [f"data.root={served}"], env={}).config
    stored = read_records(open_writer(cfg.data).store)
    assert stored and all(0.0 <= r.reward_components["reward_model"] <= 1.0 for r in stored if r.reward_status != "infra_error")
