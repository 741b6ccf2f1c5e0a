"""`agentrl model sft`: a warm start on a harness's scripted solutions, imported as a new model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

TASKS = Path(__file__).resolve().parents[2] / "templates" / "smollm2" / "warm_start_tasks.jsonl"


def test_the_warm_started_model_is_imported_with_its_record_and_differs_from_the_base(cli, isolated, random_model_dir):
    from transformers import AutoModelForCausalLM

    cache = isolated / "cache"
    result, record = cli.json("model", "sft", "--harness", "reasoning_gym", "--tasks", str(TASKS), "--base", str(random_model_dir),
                              "--name", "warm", "--steps", "2", "--batch-size", "4", "--lr", "1e-3",
                              "--set", f"model.cache_dir={cache}")
    assert result.exit_code == 0
    lines = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    assert record["name"] == "warm" and record["demonstrations"] == len(lines) and record["sft"]["steps"] == 2
    assert record["split"] == "train" and {line["split"] for line in lines} == {"train"}
    assert record["sft"]["examples"] > 0 and torch.isfinite(torch.tensor(record["sft"]["final_loss"]))
    directory = Path(record["directory"])
    assert json.loads((directory / "warm_start.json").read_text()) == record
    base = AutoModelForCausalLM.from_pretrained(random_model_dir).state_dict()
    warm = AutoModelForCausalLM.from_pretrained(directory).state_dict()
    assert base.keys() == warm.keys() and any(not torch.equal(base[k], warm[k]) for k in base)
    _, info = cli.json("model", "info", "--set", "model.path=warm", "--set", f"model.cache_dir={cache}")
    assert info["directory"] == str(directory)


@pytest.mark.parametrize("harness, words", [("openenv", "no scripted solutions"), ("no_such_harness", "unknown harness")])
def test_a_harness_with_nothing_to_demonstrate_is_refused_with_the_fix(cli, isolated, random_model_dir, harness, words):
    result = cli("model", "sft", "--harness", harness, "--base", str(random_model_dir), "--name", "warm",
                 "--set", f"model.cache_dir={isolated / 'cache'}")
    assert result.exit_code == 2 and words in result.stderr and "fix:" in result.stderr
    assert not (isolated / "cache" / "models" / "imported" / "warm").exists()


def test_evaluation_tasks_are_never_demonstrated_unless_asked(cli, isolated, random_model_dir):
    """The default demonstrates the training split only: a tasks file of evaluation tasks is refused
    naming the split it has and the fix, and nothing is imported."""
    held_out = isolated / "eval_tasks.jsonl"
    held_out.write_text("".join(json.dumps({**json.loads(line), "split": "eval"}) + "\n"
                                for line in TASKS.read_text().splitlines()[:4]))
    result = cli("model", "sft", "--harness", "reasoning_gym", "--tasks", str(held_out), "--base", str(random_model_dir),
                 "--name", "warm", "--set", f"model.cache_dir={isolated / 'cache'}")
    assert result.exit_code == 2 and "no tasks of split 'train' (it has eval)" in result.stderr and "--split all" in result.stderr
    assert not (isolated / "cache" / "models" / "imported" / "warm").exists()
