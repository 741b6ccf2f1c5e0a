"""The reasoning_gym adapter without a model: its task set (deterministic, splits apart, versioned by
its options, difficulty from reasoning-gym's curriculum), its episode (the answer convention) and its
score, always checked against reasoning-gym's own `score_answer` on entries the package regenerates."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
import reasoning_gym

from agentrl_cli.core.errors import ConfigError
from harnesses.adapters.reasoning_gym import EVAL_OFFSET, ReasoningGymHarness, final_answer, score_record
from harnesses.base import Action, TaskSpec, Trajectory

OPTIONS = {"dataset": "letter_counting", "size": 16, "seed": 3, "config": {"max_words": 7}}


def package_entry(task):
    """The task's entry as reasoning-gym itself generates it from the task's stored seed, size and config."""
    m = task.meta
    ds = reasoning_gym.create_dataset(m["dataset"], seed=m["seed"], size=m["size"], **m["config"])
    return ds, ds[m["entry"]["metadata"]["source_index"]]


def episode(task, *texts: str) -> Trajectory:
    return Trajectory(task=task, actions=[Action(text=t) for t in texts])


def as_json(task_set) -> str:
    return json.dumps([task_set.version] + [dataclasses.asdict(t) for t in task_set.tasks], sort_keys=True)


def test_the_task_set_is_the_same_in_another_process_with_another_hash_seed():
    here = as_json(ReasoningGymHarness.task_set(OPTIONS))
    code = ("import json, dataclasses; from harnesses.adapters.reasoning_gym import ReasoningGymHarness as H; "
            f"ts = H.task_set({OPTIONS!r}); "
            "print(json.dumps([ts.version] + [dataclasses.asdict(t) for t in ts.tasks], sort_keys=True))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert there.stdout.strip() == here


def test_train_and_eval_come_from_separate_seeds_and_share_no_question():
    tasks = ReasoningGymHarness.task_set(OPTIONS).tasks
    train, evals = [t for t in tasks if t.split == "train"], [t for t in tasks if t.split == "eval"]
    assert len(train) == 16 and 0 < len(evals) <= 16
    assert {t.meta["seed"] for t in train} == {3} and {t.meta["seed"] for t in evals} == {3 + EVAL_OFFSET}
    assert not {t.prompt for t in train} & {t.prompt for t in evals}
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert train[0].task_id == "reasoning_gym/letter_counting/train/0"


def test_the_version_names_the_package_and_changes_with_every_option_that_changes_the_tasks():
    base = ReasoningGymHarness.task_set(OPTIONS).version
    assert base.startswith(f"reasoning_gym-{metadata.version('reasoning-gym')}-")
    changed = [{**OPTIONS, "config": {"max_words": 9}}, {**OPTIONS, "size": 8}, {**OPTIONS, "seed": 4},
               {**OPTIONS, "dataset": "basic_arithmetic", "config": {}}, {**OPTIONS, "levels": [0]}]
    versions = {ReasoningGymHarness.task_set(o).version for o in changed}
    assert base not in versions and len(versions) == len(changed)
    assert ReasoningGymHarness.task_set(dict(OPTIONS)).version == base


def test_every_task_carries_its_entry_as_json_and_it_is_the_packages_own():
    for task in ReasoningGymHarness.task_set({**OPTIONS, "dataset": "basic_arithmetic", "config": {}}).tasks:
        assert json.loads(json.dumps(task.meta)) == task.meta
        _, entry = package_entry(task)
        assert (task.prompt, task.answer) == (entry["question"], entry["answer"]) == (task.meta["entry"]["question"],
                                                                                       task.meta["entry"]["answer"])
        assert task.meta["family"] == "basic_arithmetic"


def test_scripted_answers_score_1_and_wrong_answers_0_by_the_packages_scorer():
    harness = ReasoningGymHarness(**OPTIONS)
    for task in ReasoningGymHarness.task_set(OPTIONS).tasks:
        ds, entry = package_entry(task)
        right, wrong = ReasoningGymHarness.scripted_action(task, 0), ReasoningGymHarness.wrong_action(task)
        assert ReasoningGymHarness.scripted_action(task, 1) is None
        harness.reset(task)
        assert harness.step(Action(text=right)).done
        assert harness.compute_reward(episode(task, right)) == ds.score_answer(final_answer(episode(task, right)), entry) == 1.0
        assert harness.compute_reward(episode(task, wrong)) == ds.score_answer(final_answer(episode(task, wrong)), entry) == 0.0


def test_a_reply_without_an_answer_is_invalid_and_the_episode_goes_on():
    harness = ReasoningGymHarness(**OPTIONS)
    task = ReasoningGymHarness.task_set(OPTIONS).tasks[0]
    first = harness.reset(task)
    assert first.text.startswith(task.prompt) and "<answer>" in first.text
    obs = harness.step(Action(text=f"I think it is {task.answer}"))
    assert obs.status == "invalid_action" and not obs.done and "<answer>" in obs.text
    obs = harness.step(Action(text=f"Counting.\nANSWER: {task.answer}"))
    assert obs.status == "ok" and obs.done
    assert harness.evidence(episode(task, f"Counting.\nANSWER: {task.answer}")).final_answer == task.answer


def test_an_episode_that_ends_without_an_answer_is_scored_on_its_last_line_with_the_packages_partial_credit():
    harness = ReasoningGymHarness(**OPTIONS)
    task = ReasoningGymHarness.task_set(OPTIONS).tasks[0]
    ds, entry = package_entry(task)
    traj = episode(task, "no idea", f"let me count\nthere are {task.answer} of them\n")
    assert harness.evidence(traj).final_answer == f"there are {task.answer} of them"
    expected = ds.score_answer(f"there are {task.answer} of them", entry)
    assert 0.0 < expected < 1.0  # letter_counting's scorer: len(answer) / len(text) for text holding the answer
    assert harness.compute_reward(traj) == expected == score_record(task.meta, f"there are {task.answer} of them")
    assert harness.compute_reward(episode(task)) == 0.0 and harness.compute_reward(episode(task, " \n ")) == 0.0


def test_an_answer_the_packages_scorer_cannot_read_scores_0():
    options = {"dataset": "prime_factorization", "size": 2}
    task = ReasoningGymHarness.task_set(options).tasks[0]
    ds, entry = package_entry(task)
    with pytest.raises(ValueError):
        ds.score_answer("abc", entry)
    assert ReasoningGymHarness(**options).compute_reward(episode(task, "<answer>abc</answer>")) == 0.0


def test_curriculum_levels_become_difficulties_and_families_the_sampler_buckets():
    tasks = ReasoningGymHarness.task_set({**OPTIONS, "config": {}, "size": 4, "levels": [2, 0]}).tasks
    by_level = {t.meta["level"]: t for t in tasks}
    assert {t.difficulty for t in tasks} == {1, 3} and all(t.difficulty == t.meta["level"] + 1 for t in tasks)
    assert by_level[0].meta["config"] == {"min_words": 5, "max_words": 7}
    assert by_level[2].meta["config"] == {"min_words": 9, "max_words": 11}
    assert by_level[2].task_id.startswith("reasoning_gym/letter_counting/level2/")
    assert {t.meta["family"] for t in tasks} == {"letter_counting"}


def test_without_levels_the_difficulty_is_the_curriculum_level_the_config_reaches():
    def difficulty(options):
        return {t.difficulty for t in ReasoningGymHarness.task_set({"size": 2, **options}).tasks}
    assert difficulty({"config": {"max_words": 7}}) == {1}
    assert difficulty({}) == {5}  # letter_counting's default 5..15 words: the band of level 4 (13..15)
    assert difficulty({"dataset": "acre"}) == {1}  # no curriculum


@pytest.mark.parametrize("options, named", [
    ({"datset": "gcd"}, "datset"), ({"dataset": "no_such"}, "no_such"), ({"config": {"max_wordz": 3}}, "letter_counting"),
    ({"config": {"min_words": 9, "max_words": 3}}, "letter_counting"), ({"size": 0}, "size"), ({"levels": [99]}, "levels"),
    ({"dataset": "acre", "levels": [0]}, "no curriculum"), ({"prompt": "chatty"}, "prompt"), ({"config": {"seed": 2}}, "seed"),
])
def test_bad_options_are_config_errors_naming_what_was_wrong(options, named):
    with pytest.raises(ConfigError) as caught:
        ReasoningGymHarness(**options)
    assert named in str(caught.value) and caught.value.hint and caught.value.exit_code == 2


def test_a_task_not_made_by_the_task_set_is_refused_at_reset_naming_what_it_lacks():
    foreign = TaskSpec(task_id="file/1", harness="reasoning_gym", prompt="2+2?", answer="4", difficulty=1, split="train")
    with pytest.raises(ValueError, match="lacks meta dataset, config, seed, size, entry"):
        ReasoningGymHarness().reset(foreign)


def test_a_task_marked_worked_demonstrates_its_expression_before_the_tag_and_still_scores_1():
    harness = ReasoningGymHarness(**OPTIONS)
    options = {**OPTIONS, "dataset": "products", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    for task in ReasoningGymHarness.task_set(options).tasks[:8]:
        plain = ReasoningGymHarness.scripted_action(task, 0)
        worked_task = dataclasses.replace(task, meta={**task.meta, "demonstration": "worked"})
        worked = ReasoningGymHarness.scripted_action(worked_task, 0)
        expression = task.meta["entry"]["metadata"]["expression"]
        assert plain == f"<answer>{task.answer}</answer>"
        assert worked == f"{expression} = {task.answer}\n{plain}"
        assert harness.compute_reward(episode(worked_task, worked)) == 1.0
    first = ReasoningGymHarness.task_set(OPTIONS).tasks[0]
    letters = dataclasses.replace(first, meta={**first.meta, "demonstration": "worked"})
    assert ReasoningGymHarness.scripted_action(letters, 0).startswith("<answer>")  # no expression: the tag alone
