"""`agentrl reward train` on a small synthetic trajectory store with the random tiny model, its
refusals, and the saved reward model served by `RewardModelVerifier` inside a real Scorer (issue 37).

The store is written by the real writer; a run directory's meta.json points at it, as a stage run's
does. Successful trajectories end with a submitted answer, failed ones with a give-up, so a head on
even a random base separates them; the numbers asserted are the ones the command reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.schema import StepRecord, TrajectoryRecord
from agentrl_cli.runtime.data.writer import open_writer
from agentrl_cli.runtime.reward.models import ScoreRequest, StepIn, TaskIn

pytestmark = pytest.mark.integration


def _record(run_id: str, task: int, j: int, success: bool, status: str | None = None) -> TrajectoryRecord:
    action = f"echo {task * 7} > answer.txt" if success else "ls"
    answer = str(task * 7) if success else None
    steps = [StepRecord(index=0, action=action, observation="ok" if success else "answer.txt not found"),
             StepRecord(index=1, action="SUBMIT" if success else "I give up", observation="submitted")]
    return TrajectoryRecord(run_id=run_id, task_id=f"t{task:02d}", harness="synthetic_like", harness_version="1",
                            initial_observation=f"Compute {task} times 7 and submit it.", steps=steps,
                            final_answer=answer, outcome="success" if success else "fail", reward=float(success),
                            reward_status=status or ("ok" if success else "fail"), seed=j,
                            trajectory_id=f"{run_id}-{task}-{j}")


def make_run(root: Path, run_id: str, tasks: int = 12, per_task: int = 4, success=lambda task, j: j < 2,
             masked: int = 2) -> Path:
    """A run directory under root/runs whose trajectories are in root/store."""
    cfg = load_config(None, [f"data.root={root / 'store'}"], env={}).config
    with open_writer(cfg.data) as writer:
        for task in range(tasks):
            for j in range(per_task):
                writer.write(_record(run_id, task, j, success(task, j)))
        for k in range(masked):
            writer.write(_record(run_id, 0, 100 + k, False, status="infra_error"))
    run = root / "runs" / run_id
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"run_id": run_id, "created_at": "2026-12-03T00:00:00+00:00",
                                               "config": {"data": cfg.data.model_dump(mode="json")}}))
    return run


def _sets(root: Path, model: Path) -> list[str]:
    return ["--set", f"observe.runs_dir={root / 'runs'}", "--set", f"data.root={root / 'store'}",
            "--set", f"model.cache_dir={root / 'cache'}", "--set", f"model.path={model}"]


def test_train_reports_held_out_metrics_and_the_scorer_serves_the_saved_model(cli, isolated, random_model_dir):
    make_run(isolated, "run-a")
    result, record = cli.json("reward", "train", "--from", "run-a", "--name", "rm-test", "--steps", "200",
                              *_sets(isolated, random_model_dir))
    assert result.exit_code == 0, result.stderr
    held = record["metrics"]["held_out"]
    # split by task: disjoint, all 12 tasks used, 30% held out
    train_tasks, held_tasks = record["split"]["train_tasks"], record["split"]["held_out_tasks"]
    assert not set(train_tasks) & set(held_tasks) and len(train_tasks) + len(held_tasks) == 12 and len(held_tasks) == 4
    assert record["counts"]["left_out_masked"] == 2 and record["counts"]["labelled"] == 48
    assert held["trajectories"] == 16 and held["successes"] == 8
    assert held["auc"] > 0.5 and held["auc_ci95"]["low"] <= held["auc"] <= held["auc_ci95"]["high"]
    assert sum(row["count"] for row in held["reliability"]) == 16 and 0 <= held["ece"] <= 1
    assert record["base"]["path"] == str(random_model_dir) and record["base"]["frozen"]
    saved = Path(record["path"])
    assert saved == isolated / "cache" / "reward-models" / "rm-test"
    assert json.loads((saved / "reward_model.json").read_text())["version"] == record["version"]

    # served: a Scorer with reward_model beside the rules, by name and by path
    from agentrl_cli.runtime.reward.reward_model import RewardModelVerifier
    from agentrl_cli.runtime.reward.scorer import Scorer

    cfg = load_config(None, ["reward.verifiers=[reward_model]", "reward.reward_model=rm-test",
                             f"model.cache_dir={isolated / 'cache'}",
                             "reward.weights={outcome: 1.0, reward_model: 0.5}"], env={}).config
    scorer = Scorer.from_config(cfg, provider=object())
    try:
        verifier = scorer.components["reward_model"]
        assert isinstance(verifier, RewardModelVerifier) and verifier.version == record["version"]
        req = ScoreRequest(task=TaskIn(task_id="t03", harness="synthetic_like", prompt="Compute 3 times 7 and submit it.",
                                          answer="21"),
                           trajectory_id="x1", steps=[StepIn(action="echo 21 > answer.txt", observation="ok"),
                                                      StepIn(action="SUBMIT", observation="submitted")],
                           final_answer="21")
        first = scorer.score(req)
        assert first.status == "ok" and first.verifier_versions["reward_model"] == record["version"]
        p = first.components["reward_model"]
        assert 0.0 <= p <= 1.0 and first.reward == pytest.approx(1.0 + 0.5 * p)
        assert scorer.score(req).cached
        # the score is the verifier's own (same rendering as training), not a constant
        bad = req.model_copy(update={"trajectory_id": "x2", "final_answer": None,
                                     "steps": [StepIn(action="ls", observation="answer.txt not found"),
                                               StepIn(action="I give up", observation="submitted")]})
        assert scorer.score(bad).components["reward_model"] != p
    finally:
        scorer.close()
    by_path = RewardModelVerifier(load_config(None, [f"reward.reward_model={saved}"], env={}).config)
    assert by_path.verify(req).score == pytest.approx(p)

    # a base whose weights are not the ones it was trained on is refused at load, with the fix
    from agentrl_cli.core.errors import ConfigError

    meta = json.loads((saved / "reward_model.json").read_text())
    meta["base"]["weights_sha256"] = "0" * 64
    (saved / "reward_model.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="changed since it was trained") as info:
        RewardModelVerifier(load_config(None, [f"reward.reward_model={saved}"], env={}).config)
    assert "agentrl reward train" in info.value.hint


@pytest.mark.parametrize("case, fix", [
    ("empty", "has no stored trajectories"),
    ("one_class", "only one label class"),
    ("few_tasks", "too few tasks to hold out"),
])
def test_train_refuses_with_exit_2_and_a_fix(cli, isolated, random_model_dir, case, fix):
    if case == "empty":
        make_run(isolated, "run-a", tasks=0, masked=0)
    elif case == "one_class":
        make_run(isolated, "run-a", success=lambda task, j: False)
    else:
        make_run(isolated, "run-a", tasks=3)
    result = cli("reward", "train", "--from", "run-a", *_sets(isolated, random_model_dir))
    assert result.exit_code == 2 and fix in result.stderr and "fix:" in result.stderr, result.stderr
    assert not (isolated / "cache" / "reward-models").exists()
