"""`agentrl stage run 8 --phase smoke` on the two-role harness (guess_number) with a random tiny
model, as a user runs it: the policy trains the holder against the scripted guesser, the per-role
reward curve is in metrics.jsonl and in the report, and `agentrl replay` replays a stored episode
(every role's moves) without divergence."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.observe import keys

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_the_two_role_harness_trains_through_stage_8_smoke_and_replays(cli, write_yaml, quick_sets, isolated):
    config = write_yaml("harnesses:\n  - name: guess_number\n    roles: {guesser: scripted}\n")
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", "--config", str(config), *quick_sets)
    by_name = {c["name"]: c for c in data["reports"][0]["checks"]}
    for name in ("loss finite", "checkpoint written", "reloaded and resumed", "no trajectory stored twice"):
        assert by_name[name]["status"] == "pass", (name, by_name[name]["detail"][-600:])
    roles = by_name["rewards per role"]
    assert roles["status"] == "info" and list(roles["measured"]) == ["holder"]
    assert [step for step, _ in roles["measured"]["holder"]] == [1, 2]
    [run] = [p for p in (isolated / "runs").iterdir() if (p / "meta.json").exists()]
    rows = [json.loads(line) for line in (run / "stage8" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if keys.is_step_row(r)]
    assert steps and all(isinstance(r.get(keys.reward_role("holder")), float) for r in steps)
    assert all(keys.reward_role("guesser") not in r for r in steps)  # the scripted seat is never trained
    assert all(r[keys.reward_role("holder", "episodes")] == 2 for r in steps[:2])  # one group of group_size

    result, data = cli.json("data", "query", "role == 'holder'", "--config", str(config))
    assert result.exit_code == 0 and data["matched"] >= 4
    tid = data["rows"][0]["trajectory_id"]
    assert tid.endswith("-holder")
    result, report = cli.json("replay", tid, "--config", str(config))
    assert result.exit_code == 0 and report["ok"] and report["role"] == "holder" and report["steps_compared"] == 2
