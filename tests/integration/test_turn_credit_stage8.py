"""`training.advantage: turn` end to end: stage 8 smoke trains on the random tiny model with a harness
that reports step rewards (the learner benchmark's middle-turn harness), and its rows carry the
per-turn metrics. `min_chars: 45` splits the random tiny model's middle replies (39 to 51 characters
under quick_sets' seeds) so that its groups are not all flat, which stage 8's reward-spread check needs."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # ~30 s: past what CI has room for

HARNESS = "benchmarks.middle_turn_harness:MiddleTurn"


def test_a_turn_credit_run_trains_through_stage_8_smoke_with_its_per_turn_metrics(cli, write_yaml, quick_sets, tmp_path):
    write_yaml(f"harnesses:\n  - name: {json.dumps(HARNESS)}\n    options: {{min_chars: 45}}\n"
               f"data:\n  root: {json.dumps(str(tmp_path / 'store'))}\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "rollout.max_steps_per_trajectory=3",
                            "--set", "training.advantage=turn", "--set", "training.turn_discount=0.5")
    report = data["reports"][-1]
    failing = [(c["name"], str(c["detail"])[:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    rows = [json.loads(line) for path in tmp_path.rglob("metrics.jsonl") for line in path.read_text().splitlines() if line.strip()]
    trained = [r for r in rows if "train/loss" in r]
    assert trained and all("rollout/step_advantage_share" in r and r["rollout/turn_unmapped"] == 0 for r in trained)
