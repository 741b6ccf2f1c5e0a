"""The reward model's parts without a model (issue 37): its metrics, one rendering for training and
serving, the split by task, Platt scaling and the `reward.reward_model` config key."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.schema import StepRecord, TrajectoryRecord
from agentrl_cli.core.errors import AgentrlError, UsageError
from agentrl_cli.runtime.reward import rm_metrics
from agentrl_cli.runtime.reward.models import ScoreRequest, StepIn, TaskIn
from agentrl_cli.runtime.reward.reward_model import render_request
from agentrl_cli.runtime.reward.rm_train import Example, examples_of, fit_platt, split_by_task


def test_auc_is_the_mann_whitney_statistic_with_ties_counting_half():
    assert rm_metrics.auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert rm_metrics.auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert rm_metrics.auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    # pairs (pos, neg): 0.4 > 0.3, 0.4 < 0.6, 0.6 > 0.3, 0.6 = 0.6 -> (1 + 0 + 1 + 0.5) / 4, counted by hand
    assert rm_metrics.auc([0.3, 0.6, 0.4, 0.6], [0, 0, 1, 1]) == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    assert rm_metrics.auc([0.1, 0.2], [1, 1]) is None


def test_the_bootstrap_interval_resamples_tasks_and_brackets_the_auc():
    rng = np.random.default_rng(0)
    labels = np.tile([0, 1], 40)
    scores = labels + rng.normal(0, 1.0, len(labels))
    groups = [f"t{i // 4}" for i in range(len(labels))]
    ci = rm_metrics.auc_ci(scores, labels, groups, resamples=500)
    value = rm_metrics.auc(scores, labels)
    assert ci["low"] < value < ci["high"] and ci["resamples"] == 500
    # one task: every resample is that task, so the interval collapses onto its AUC
    one = rm_metrics.auc_ci(scores[:8], labels[:8], ["t"] * 8, resamples=50)
    assert one["low"] == one["high"] == rm_metrics.auc(scores[:8], labels[:8])


def test_ece_is_zero_when_each_bin_observes_what_it_predicts_and_the_table_counts_every_item():
    probs = [0.25] * 4 + [0.75] * 4
    labels = [1, 0, 0, 0, 1, 1, 1, 0]
    assert rm_metrics.ece(probs, labels) == 0.0
    assert rm_metrics.ece([0.9] * 4, [0] * 4) == pytest.approx(0.9)
    rows = rm_metrics.reliability(probs, labels)
    assert [(r["count"], r["observed"]) for r in rows] == [(4, 0.25), (4, 0.75)]


def test_platt_scaling_moves_overconfident_logits_towards_the_observed_rate():
    logits = np.array([4.0] * 10 + [-4.0] * 10)
    labels = np.array([1] * 6 + [0] * 4 + [1] * 4 + [0] * 6)  # 60% / 40% observed, sigmoid(±4) = 98% / 2%
    c = fit_platt(logits, labels)
    p_high = 1 / (1 + np.exp(-(c["a"] * 4 + c["b"])))
    assert 0.5 < p_high < 0.7 and 0 < c["a"] < 1


def _pair(prompt: str = "What is 6 times 7?"):
    steps = [("python -c 'print(6*7)'", "42", "ok"), ("SUBMIT 42", "submitted", "ok")]
    record = TrajectoryRecord(run_id="r", task_id="t1", harness="terminal_like", harness_version="1",
                              initial_observation=prompt + "\nFiles in the working directory: a.txt",
                              steps=[StepRecord(index=i, action=a, observation=o, observation_status=s)
                                     for i, (a, o, s) in enumerate(steps)],
                              final_answer="42", outcome="success", reward_status="ok")
    request = ScoreRequest(task=TaskIn(task_id="t1", harness="terminal_like", prompt=prompt), trajectory_id="x",
                           steps=[StepIn(action=a, observation=o, status=s) for a, o, s in steps], final_answer="42")
    return record, request


def test_training_and_serving_render_a_trajectory_the_same_way():
    record, request = _pair()
    counts = Counter()
    [example] = examples_of([record], {("terminal_like", "t1"): "What is 6 times 7?"}, counts)
    assert example.text == render_request(request) and example.label == 1 and example.task == "terminal_like/t1"
    assert not counts  # the task set's prompt was used, nothing left out
    # without the task in a task set the stored first observation stands in, and that is counted
    [fallback] = examples_of([record], {}, counts)
    assert fallback.text != render_request(request) and counts["prompts_from_observation"] == 1


def test_masked_unscored_and_role_rows_are_left_out_and_counted():
    record, _ = _pair()
    rows = [record, TrajectoryRecord(**{**record.__dict__, "reward_status": "infra_error", "trajectory_id": "b"}),
            TrajectoryRecord(**{**record.__dict__, "reward_status": "unscored", "trajectory_id": "c"}),
            TrajectoryRecord(**{**record.__dict__, "role": "guesser", "trajectory_id": "d"}),
            TrajectoryRecord(**{**record.__dict__, "outcome": "partial", "reward_status": "ok", "trajectory_id": "e"})]
    counts = Counter()
    got = examples_of(rows, {}, counts)
    assert [e.label for e in got] == [1, 0]
    assert counts == Counter(left_out_masked=1, left_out_unscored=1, left_out_multi_agent_role_rows=1,
                             prompts_from_observation=2)


def _examples(labels_by_task: dict[str, list[int]]) -> list[Example]:
    return [Example(f"{t}{i}", y, t, "r") for t, ys in labels_by_task.items() for i, y in enumerate(ys)]


def test_the_split_is_by_task_with_both_labels_on_each_side():
    examples = _examples({f"t{i}": [0, 1] if i % 3 == 0 else [0, 0] for i in range(12)})
    train, held = split_by_task(examples, 0.3, seed=0)
    assert not set(train) & set(held) and len(train) + len(held) == 12 and len(held) == 4
    for side in (train, held):
        assert {e.label for e in examples if e.task in side} == {0, 1}
    assert split_by_task(examples, 0.3, seed=0) == (train, held)  # seeded


def test_the_split_refuses_too_few_tasks_or_successes_in_one_task():
    with pytest.raises(UsageError, match="too few tasks to hold out"):
        split_by_task(_examples({"a": [0, 1], "b": [0, 1], "c": [0, 1]}), 0.3, seed=0)
    with pytest.raises(UsageError, match="no split"):
        split_by_task(_examples({"a": [1, 1], **{f"t{i}": [0, 0] for i in range(8)}}), 0.3, seed=0)


def test_reward_model_in_verifiers_needs_reward_reward_model():
    with pytest.raises(AgentrlError, match="reward.reward_model is empty"):
        load_config(None, ["reward.verifiers=[reward_model]"], env={})
    cfg = load_config(None, ["reward.verifiers=[reward_model]", "reward.reward_model=/x/rm"], env={}).config
    assert cfg.reward.reward_model == "/x/rm"
    assert load_config(None, [], env={}).config.reward.reward_model == ""


def test_a_missing_reward_model_directory_is_refused_at_load_with_the_fix(tmp_path):
    from agentrl_cli.core.errors import ConfigError
    from agentrl_cli.runtime.reward.reward_model import RewardModelVerifier

    cfg = load_config(None, [f"reward.reward_model={tmp_path / 'nope'}", f"model.cache_dir={tmp_path}"], env={}).config
    with pytest.raises(ConfigError, match="no reward-model directory") as info:
        RewardModelVerifier(cfg)
    assert "agentrl reward train" in info.value.hint


def test_one_episode_renders_the_same_from_its_stored_record_and_from_its_scoring_request():
    """The rollout builds both from the same episode (record_from_episode, request_from_episode)."""
    from agentrl_cli.runtime.data.record_from_episode import record_from_episode
    from agentrl_cli.core.episode import Action, Evidence, Observation, TaskSpec, Trajectory
    from agentrl_cli.runtime.reward.request_from_episode import request_from_episode

    task = TaskSpec("t7", "terminal_like", "Write 42 to out.txt.", "42", 1, "train", {"files": {"a.txt": "x"}})
    traj = Trajectory(task, [Action("echo 42 > out.txt"), Action("bad {")],
                      [Observation(task.prompt + "\nFiles in the working directory: a.txt"), Observation("done"),
                       Observation("cannot parse", status="invalid_action")])
    evidence = Evidence(final_answer="42")
    record = record_from_episode(traj, run_id="r", harness_version="1", evidence=evidence)
    request = request_from_episode(traj, evidence, trajectory_id="x")
    [example] = examples_of([TrajectoryRecord(**{**record.__dict__, "reward_status": "ok"})],
                            {("terminal_like", "t7"): task.prompt}, Counter())
    assert example.text == render_request(request)
    assert "[observation 2: invalid_action]" in example.text and "Files in the working directory" not in example.text
