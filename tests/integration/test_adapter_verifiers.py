"""A verifiers v1 taskset through agentrl as the `verifiers` harness (real package, real processes):
reward parity with verifiers' own rubric (50 generated episodes through agentrl's scorer, and 50
episodes played by a real training run and read back from the store), stage 5's contract checks and
training-path episode, stage 8 smoke on the random tiny model, and the options' checks.

The expected scores are computed here with verifiers alone: the test builds the `vf.Trace` node by
node (`vf.MessageNode`, not the adapter's `prepare_turn` path) and awaits the task's own
`Task.score`; the adapter never computes them.

Why a random model's rewards vary (stage 8 needs that, honestly): its replies never hold an
`ANSWER:` line, so each episode runs to the turn limit and the example's rubric scores its last
reply: `correct_answer` is 0, but `digit_credit` gives the digits the reply's last number shares
with the expected answer over the longer digit count. The tiny tokenizer's many number tokens put
long numbers in most replies, sharing a digit or two with the answer, so the scores are small and
differ between the samples of a group.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers (v1 API) is not importable: it needs Python >= 3.11 and "
                                                "`pip install verifiers==0.3.1`")

import pyarrow.dataset as pads  # noqa: E402

from agentrl_cli.config import load_config  # noqa: E402
from agentrl_cli.core.errors import ConfigError  # noqa: E402
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode  # noqa: E402
from agentrl_cli.runtime.reward.scorer import Scorer  # noqa: E402
from agentrl_cli.run.training_run import TrainingRun  # noqa: E402
from harnesses.adapters.verifiers_env import VerifiersHarness  # noqa: E402
from harnesses.adapters.verifiers_example import ArithmeticConfig, ArithmeticTaskset  # noqa: E402
from harnesses.base import Action, HarnessReward, Observation, Trajectory  # noqa: E402
from harnesses.contract import play  # noqa: E402
from tests.conftest import free_port  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
HERE = __name__


# -- tasksets of the options tests ------------------------------------------------------------------
class WordData(vf.TaskData):
    answer: str
    split: str


class WordTask(vf.Task[WordData]):
    @vf.reward(weight=1.0)
    async def says_word(self, trace: vf.Trace) -> float:
        return float(self.data.answer in trace.last_reply)

    @vf.reward(weight=1.0)
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class WordTaskset(vf.Taskset[WordTask, vf.TasksetConfig]):
    """Its own splits (`data.split`, "test" for every third task); rewards weighing 2 in all."""

    def load(self):
        words = ["apple", "river", "stone", "cloud", "ember", "maple"]
        return [WordTask(WordData(idx=i, prompt=f"Say {w}.", answer=w, split="test" if i % 3 == 0 else "train"))
                for i, w in enumerate(words)]


class RuntimeTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def file_written(self, trace: vf.Trace, runtime) -> float:
        return 1.0


class RuntimeTaskset(vf.Taskset[RuntimeTask, vf.TasksetConfig]):
    def load(self):
        return [RuntimeTask(vf.TaskData(prompt="write a file"))]


def not_a_taskset():
    return ["What is 1 + 1?"]


def six_sums(num_tasks: int = 6):
    """A factory: the example taskset, smaller."""
    return ArithmeticTaskset(ArithmeticConfig(num_tasks=num_tasks, seed=11))


# -- verifiers alone ------------------------------------------------------------------------------------
def verifiers_score(task, actions: list[str], feedback: list[str | None]) -> float:
    """verifiers' own `trace.reward` for the conversation: the task's prompt, each reply, and after
    it the harness's answer when the episode went on (`feedback[i]`, None when it ended there)."""
    messages = [vf.UserMessage(content=task.data.prompt)]
    for text, answer in zip(actions, feedback):
        messages.append(vf.AssistantMessage(content=text))
        if answer is not None:
            messages.append(vf.UserMessage(content=answer))
    nodes = [vf.MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
             for i, m in enumerate(messages)]
    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes, ok=True)
    asyncio.run(task.score(trace))
    return trace.reward


def example_tasks_by_key() -> dict:
    return {t.key: t for t in ArithmeticTaskset(ArithmeticConfig())}


def failing(report: dict) -> list:
    return [(c["name"], str(c["detail"])[:300]) for c in report["checks"] if c["status"] == "fail"]


# -- reward parity --------------------------------------------------------------------------------------
def generated_replies(answer: str, i: int, rng: random.Random) -> list[str]:
    """Right, boxed, partly right (a digit more, a digit only, reversed), wrong, a random number,
    and a reply with no answer (the turn limit, scored on its last number)."""
    kinds = [[f"ANSWER: {answer}"], [f"Adding up: \\boxed{{{answer}}}"], [f"ANSWER: {answer}{i % 10}"],
             [f"ANSWER: {answer[0]}"], ["let me think", f"ANSWER: {answer[::-1]}"], ["ANSWER: none"],
             [f"ANSWER: {rng.randint(0, 200)}"], [f"maybe {rng.randint(0, 200)}", f"or {rng.randint(0, 200)}?"]]
    return kinds[i % len(kinds)]


def test_fifty_generated_episodes_get_the_score_verifiers_rubric_gives_through_agentrls_scorer():
    harness, scorer = VerifiersHarness(), Scorer()
    by_key, rng = example_tasks_by_key(), random.Random(4)
    tasks = VerifiersHarness.task_set({}).tasks
    outcomes, expected = [], []
    try:
        for i in range(50):
            spec = tasks[i % len(tasks)]
            replies = generated_replies(spec.answer, i, rng)
            traj, last = play(harness, spec, policy=lambda task, turn: replies[turn] if turn < len(replies) else None)
            reward = HarnessReward.of(harness.compute_reward(traj))
            req = request_from_episode(traj, harness.evidence(traj), trajectory_id=f"parity-{i}",
                                       termination="done" if last.done else "truncated", reward_source="harness",
                                       harness_reward=reward)
            result = scorer.score(req)
            assert result.verifier == "harness" and result.status != "infra_error", result.detail
            feedback = [None if o.done else o.text for o in traj.observations[1:]]
            expected.append(verifiers_score(by_key[spec.meta["key"]], [a.text for a in traj.actions], feedback))
            outcomes.append(result.components["outcome"])
            assert json.loads(reward.detail)["reward"] == expected[-1]
    finally:
        harness.close()
        scorer.close()
    assert outcomes == expected
    assert {0.0, 1.0} <= set(expected) and len(set(expected)) >= 5  # right, wrong and several partial scores


def stored_rows(root) -> list[dict]:
    table = pads.dataset(str(root), format="parquet", partitioning="hive").to_table(
        columns=["trajectory_id", "task_id", "reward_components", "reward_status", "steps"])
    return table.to_pylist()


def test_fifty_trained_episodes_store_the_outcome_verifiers_rubric_gives_their_conversation(tmp_path, random_model_dir):
    """A short real training run (sync, 2 steps of 25 episodes, `reward: harness` from the class);
    every stored episode's replies are re-scored here by verifiers alone."""
    sets = {"inference.port": free_port(), "inference.max_new_tokens": 16, "rollout.concurrency": 8, "rollout.group_size": 5,
            "rollout.max_steps_per_trajectory": 2, "rollout.mode": "sync", "training.micro_batch_size": 25,
            "training.checkpoint_interval_steps": 100, "data.root": str(tmp_path / "store"), "model.path": str(random_model_dir)}
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "verifiers"}]'], env={}).config

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="parity")
        try:
            await run.start()
            return await run.run(2)
        finally:
            await run.close()
    assert asyncio.run(go()).steps == 2
    rows = stored_rows(tmp_path / "store")
    assert len(rows) >= 50
    by_key = example_tasks_by_key()
    specs = {t.task_id: t for t in VerifiersHarness.task_set({}).tasks}
    recomputed = []
    for row in rows:
        steps = row["steps"]  # an accepted reply (status ok) ended the episode; the model saw every other answer
        feedback = [None if s["observation_status"] == "ok" else s["observation"] for s in steps]
        expected = verifiers_score(by_key[specs[row["task_id"]].meta["key"]], [s["action"] for s in steps], feedback)
        assert dict(row["reward_components"])["outcome"] == expected, row["trajectory_id"]
        recomputed.append(expected)
    assert len(set(recomputed)) > 2 and max(recomputed) > 0  # not a parity of constants


# -- stages ---------------------------------------------------------------------------------------------
def test_the_verifiers_harness_passes_stage_5_with_an_episode_scored_by_its_rubric(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n  - name: verifiers\n")
    result, data = cli.json("stage", "run", "5", *quick_sets)
    report = data["reports"][0]
    assert result.exit_code == 0, failing(report)
    checks = {c["name"]: c for c in report["checks"]}
    for check in ("loads", "clean reset", "scripted episodes", "invalid actions", "one episode through the training path"):
        assert checks[f"harness verifiers: {check}"]["status"] == "pass", check
    assert checks["harness verifiers: scripted episodes"]["measured"]["mean_reward"] == 1.0
    episode = checks["harness verifiers: one episode through the training path"]["measured"]
    assert episode["reward_source"] == "harness" and episode["verifier"] == "harness"


def test_the_verifiers_harness_trains_through_stage_8_smoke_on_the_random_tiny_model(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n  - name: verifiers\n")
    result, data = cli.json("stage", "run", "8", *quick_sets)
    report = data["reports"][-1]
    assert result.exit_code == 0 and report["status"] == "pass", failing(report)
    spread = next(c for c in report["checks"] if c["name"] == "reward distribution not degenerate")
    assert spread["measured"]["max_group_std"] > 0


# -- options ---------------------------------------------------------------------------------------------
def test_a_tasksets_own_splits_are_kept_and_the_version_names_the_package_and_contents():
    tasks = VerifiersHarness.task_set({"taskset": f"{HERE}:WordTaskset"})
    assert [t.split for t in tasks.tasks] == ["eval", "train", "train", "eval", "train", "train"]
    assert tasks.version.startswith(f"verifiers-{__import__('verifiers').__version__}-")
    assert VerifiersHarness.task_set({"taskset": f"{HERE}:six_sums"}).version != tasks.version


def test_the_example_is_split_deterministically_with_both_splits_present():
    first, again = VerifiersHarness.task_set({}), VerifiersHarness.task_set({"eval_fraction": 0.25})
    assert [(t.task_id, t.split) for t in first.tasks] == [(t.task_id, t.split) for t in again.tasks]
    assert {"train", "eval"} == {t.split for t in first.tasks} and len(first.tasks) == 32


def test_a_factory_is_called_with_the_config_as_keyword_arguments():
    assert len(VerifiersHarness.task_set({"taskset": f"{HERE}:six_sums", "config": {"num_tasks": 4}}).tasks) == 4


def test_a_weighted_sum_outside_reward_range_is_an_error_and_inside_it_is_mapped_to_0_1():
    spec = next(t for t in VerifiersHarness.task_set({"taskset": f"{HERE}:WordTaskset"}).tasks if t.split == "train")
    traj = Trajectory(task=spec, actions=[Action(text=f"{spec.answer}!")],
                      observations=[Observation(text=spec.prompt), Observation(text="reply recorded", done=True)])
    with pytest.raises(ValueError, match="reward_range"):
        VerifiersHarness(taskset=f"{HERE}:WordTaskset").compute_reward(traj)
    assert VerifiersHarness(taskset=f"{HERE}:WordTaskset", reward_range=[0, 2]).compute_reward(traj).score == 1.0


@pytest.mark.parametrize("options, says", [
    ({"tasket": "x"}, "unknown key"),
    ({"taskset": f"{HERE}:RuntimeTaskset"}, "need a runtime: file_written"),
    ({"taskset": f"{HERE}:not_a_taskset"}, "not a verifiers v1 Taskset"),
    ({"taskset": "no_such_module:Taskset"}, "cannot be loaded"),
    ({"config": {"num_tasks": "many"}}, "does not fit"),
    ({"eval_fraction": 1.5}, "eval_fraction"),
    ({"submit_pattern": "("}, "not a regular expression"),
])
def test_options_the_adapter_cannot_use_are_refused_naming_the_key(options, says):
    with pytest.raises(ConfigError, match=says):
        VerifiersHarness(**options)
