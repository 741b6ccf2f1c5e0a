"""`agentrl stage run 8 --phase smoke` on the two-role harness (guess_number), as a user runs it: with a
random tiny model the policy trains the holder against the scripted guesser; with the built-in
model warm-started on the game (`agentrl model sft`, the documented recipe; behind the builtin marker)
both roles train in self-play. Each trained role's reward curve is in metrics.jsonl and in the
report, and `agentrl replay` replays a stored episode (every role's moves) without divergence."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.runtime.observe import keys

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


SELF_PLAY_SFT = {"steps": 200, "lr": 1e-3}  # the recipe of docs/multi-agent.md
TRAIN_DEMOS = {"guesser": 28, "holder": 28}  # one per role and training task


def warm_started(cli, cache_dir, isolated) -> str:
    """model.path of the built-in model warm-started on guess_number by the docs' recipe: the one
    already imported as `tiny-guess` in `cache_dir` when its warm_start.json says it was built by
    that recipe from the built-in model, else built here (`agentrl model sft`, minutes)."""
    from agentrl_cli.model.importer import imported_root
    from agentrl_cli.model.resolve import builtin_dir

    base = builtin_dir(cache_dir)
    done = imported_root(cache_dir) / "tiny-guess" / "warm_start.json"
    if done.exists():
        record = json.loads(done.read_text())
        if (record.get("base_directory") == str(base) and record.get("roles") == TRAIN_DEMOS and record.get("split") == "train"
                and {k: record["sft"][k] for k in SELF_PLAY_SFT} == SELF_PLAY_SFT):
            return record["directory"]
    result, record = cli.json("model", "sft", "--harness", "guess_number", "--name", "tiny-guess", "--base", str(base),
                              "--steps", str(SELF_PLAY_SFT["steps"]), "--lr", str(SELF_PLAY_SFT["lr"]),
                              "--set", f"model.cache_dir={isolated / 'models'}")
    assert result.exit_code == 0 and record["roles"] == TRAIN_DEMOS  # the 12 evaluation tasks stay unseen
    return record["directory"]


@pytest.mark.builtin
def test_self_play_of_the_warm_started_built_in_model_trains_both_roles_through_stage_8_smoke(cli, write_yaml, isolated):
    """Both roles on the policy (self-play) with the built-in model warm-started on guess_number's
    scripted episodes (`agentrl model sft`: each role's own conversation): every stage 8 smoke check
    passes, both roles' reward curves are in metrics.jsonl and the report, and a stored episode of
    each role replays without divergence. Needs the built-in model (`agentrl model build-tiny`);
    deselected by default: `.venv/bin/python -m pytest -m builtin tests/e2e/test_stage8_multi_agent.py`."""
    from agentrl_cli.config import load_config
    from agentrl_cli.model.resolve import builtin_dir
    from agentrl_cli.model.tiny import is_complete
    from tests.conftest import free_port

    cache_dir = load_config(None, [], env={}).config.model.cache_dir
    if not is_complete(builtin_dir(cache_dir)):
        pytest.skip("the built-in model is not built (`agentrl model build-tiny`)")
    model = warm_started(cli, cache_dir, isolated)
    config = write_yaml(f"model:\n  path: {model}\nharnesses:\n  - name: guess_number\n")
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", "--config", str(config),
                            "--set", f"inference.port={free_port()}")
    report = data["reports"][0]
    assert report["status"] == "pass", [(c["name"], c["status"], c["detail"][-300:]) for c in report["checks"]]
    curves = {c["name"]: c for c in report["checks"]}["rewards per role"]["measured"]
    assert set(curves) == {"guesser", "holder"} and all(curves.values()), curves
    [run] = [p for p in (isolated / "runs").iterdir() if (p / "meta.json").exists()]
    rows = [json.loads(line) for line in (run / "stage8" / "metrics.jsonl").read_text().splitlines()]
    trained = {role: [r for r in rows if keys.is_step_row(r) and isinstance(r.get(keys.reward_role(role)), float)]
               for role in ("guesser", "holder")}
    assert all(trained.values()), {k: len(v) for k, v in trained.items()}
    html = (run / "report.html").read_text()
    assert "rewards per role" in html and "guesser" in html and "holder" in html
    for role in ("guesser", "holder"):
        result, found = cli.json("data", "query", f"role == '{role}' and completion_tokens > 0", "--config", str(config))
        assert result.exit_code == 0 and found["matched"] >= 1, role
        result, replayed = cli.json("replay", found["rows"][0]["trajectory_id"], "--config", str(config))
        assert replayed["ok"] and replayed["role"] == role and replayed["steps_compared"] >= 2, replayed
