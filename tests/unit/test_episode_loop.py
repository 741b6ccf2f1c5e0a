"""The one episode loop (`agentrl_cli.runtime.rollout.episode_loop`): a harness receives the same
`Action` for the same model reply, its text and the tool calls the chat renderer parsed from it,
whether it is played alone (`run_episode`) or as the roles of a multi-agent harness
(`run_multi_episode`). The model's side is an inference client that answers every generation with
one scripted reply as token ids; the harness, the chat template and the loop are the real ones."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from agentrl_cli.core.episode import Observation, TaskSpec, ToolCall
from agentrl_cli.engines.inference.client import Generation
from agentrl_cli.model.chat import chat_format
from agentrl_cli.envs.sandbox.remote import SandboxLost
from agentrl_cli.runtime.rollout.episode_scaffold import score
from agentrl_cli.runtime.rollout.harness_errors import HarnessErrors
from agentrl_cli.runtime.rollout.multi_episode import Seat, run_multi_episode
from agentrl_cli.runtime.rollout.run_episode import run_episode

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up in a table.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                          "required": ["key"]}}}]
REPLY = 'I will look it up.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "france"}}\n</tool_call>'
TASK = TaskSpec(task_id="t0", harness="recording", prompt="The capital of France?", answer="Paris", difficulty=1,
                split="train")
MOVES = 2


@pytest.fixture(scope="module")
def tok(random_model_dir):
    return AutoTokenizer.from_pretrained(random_model_dir)


class ScriptedReply:
    """An inference client that answers every generation with REPLY and the end-of-turn token."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer.encode(REPLY, add_special_tokens=False) + [chat_format(tokenizer).end_of_turn]
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, sampling) -> Generation:
        self.prompts.append(list(prompt_ids))
        return Generation(output_ids=list(self.ids), output_logprobs=[-0.1] * len(self.ids), finish_reason="stop",
                          weight_version="v1", latency=0.0, server="scripted")


class Recording:
    """A single-agent harness with one tool that records every Action it is given; MOVES moves end it."""

    name, version = "recording", "0.1"

    def __init__(self) -> None:
        self.actions = []

    def reset(self, task):
        self.actions = []
        return Observation(text=task.prompt)

    def system_prompt(self) -> str:
        return "Answer with the lookup tool."

    def tools(self) -> list[dict]:
        return TOOLS

    def step(self, action):
        self.actions.append(action)
        return Observation(text="Paris", done=len(self.actions) == MOVES)

    def close(self) -> None:
        pass


class RecordingSolo(Recording):
    """The same harness as a multi-agent harness with one role."""

    name, roles = "recording_solo", ("solo",)

    def to_move(self):
        return None if len(self.actions) == MOVES else self.roles[len(self.actions) % len(self.roles)]

    def observe(self, role):
        return Observation(text="Paris" if self.actions else TASK.prompt)

    def role_rewards(self, trajectory):
        return {r: 1.0 for r in self.roles}


class RecordingPair(RecordingSolo):
    """The same harness with two roles taking turns."""

    name, roles = "recording_pair", ("asker", "checker")


def _single(tok) -> tuple[list, list]:
    """The actions the harness received and the prompts the model was asked, played alone."""
    harness, client = Recording(), ScriptedReply(tok)
    with ThreadPoolExecutor(1) as ex:
        result = asyncio.run(run_episode(harness, TASK, client, tok, ex, max_steps=4, step_timeout_s=10,
                                         max_new_tokens=128, context_limit=4096))
    assert result.termination == "done" and result.harness_error is None, result.error
    return harness.actions, client.prompts


def _multi(tok, harness) -> tuple[list, list]:
    """The same, played as the roles of a multi-agent harness, every role seated `policy`."""
    client = ScriptedReply(tok)
    seats = {role: Seat(role, "policy", client) for role in harness.roles}
    with ThreadPoolExecutor(1) as ex:
        result = asyncio.run(run_multi_episode(harness, TASK, seats, tok, ex, max_steps=4, step_timeout_s=10,
                                               max_new_tokens=128, context_limit=4096))
    assert result.termination == "done" and result.harness_error is None, result.error
    return harness.actions, client.prompts


@pytest.mark.parametrize("harness", [RecordingSolo, RecordingPair], ids=["one-role", "two-roles"])
def test_a_harness_gets_the_same_action_with_its_parsed_tool_calls_alone_and_as_roles(tok, harness):
    alone, _ = _single(tok)
    assert [(a.text, a.tool_calls) for a in alone] == [(REPLY, [ToolCall("lookup", {"key": "france"}, "call_0")])] * MOVES
    as_roles, _ = _multi(tok, harness())
    assert [(a.text, a.tool_calls) for a in as_roles] == [(a.text, a.tool_calls) for a in alone]


def test_a_one_role_game_shows_the_model_what_the_single_agent_episode_shows_it(tok):
    """Its system prompt, the harness's tools and each observation: the model is asked the very same
    token ids in both modes, so a role offered no tools (or another prompt) would differ here."""
    _, alone = _single(tok)
    _, as_role = _multi(tok, RecordingSolo())
    assert len(alone) == MOVES and as_role == alone
    assert "lookup" in tok.decode(alone[0])  # the tool's schema is in the prompt


class FlakyCreation(RecordingSolo):
    """Its first creation fails, as an environment that is not up yet."""

    failures = 1

    def reset(self, task):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("sandbox not ready")
        return super().reset(task)

    def scripted_move(self, role):
        return REPLY


class SlowStep(FlakyCreation):
    """Created at once; its second step outlasts the step deadline."""

    failures = 0

    def step(self, action):
        if self.actions:
            time.sleep(0.6)
        return super().step(action)


def _scripted(harness, **kwargs):
    seats = {role: Seat(role, "scripted") for role in harness.roles}
    with ThreadPoolExecutor(2) as ex:
        return asyncio.run(run_multi_episode(harness, TASK, seats, None, ex, max_steps=4, max_new_tokens=8, **kwargs))


def test_a_multi_agent_harness_gets_the_creation_retries_a_single_agent_one_gets():
    played = _scripted(FlakyCreation(), step_timeout_s=10, create_retries=1, create_backoff_s=0.01)
    assert played.termination == "done" and played.counters["env_create_retries"] == 1
    assert played.role_rewards["solo"].score == 1.0
    failed = _scripted(FlakyCreation(), step_timeout_s=10)  # no retry: masked, naming the creation
    assert failed.termination == "infra_error" and failed.harness_error[0] == "reset"
    assert "environment creation failed 1 times: ConnectionError: sandbox not ready" in failed.error


def test_a_step_past_the_deadline_ends_a_multi_agent_episode_timeout_and_its_roles_are_still_scored():
    played = _scripted(SlowStep(), step_timeout_s=0.3)
    assert played.termination == "timeout" and played.harness_error is None
    last = played.trajectory.observations[-1]
    assert last.status == "timeout" and last.done and "step took longer than 0.3 s" in last.text
    assert played.role_rewards["solo"].score == 1.0 and played.step_roles == ["solo", "solo"]


class LostSandbox(FlakyCreation):
    """Created at once; by its second step its sandbox's service replica is gone."""

    failures = 0

    def step(self, action):
        if self.actions:
            raise SandboxLost("sandbox r1.7-1-ab on replica r1 at http://r1:8700 could not be reached (ConnectError)",
                              "check the sandbox service's replicas")
        return super().step(action)


class LostAtCreation(FlakyCreation):
    """Its sandbox is gone before the task's files are written (the replica restarted meanwhile)."""

    def reset(self, task):
        raise SandboxLost("sandbox r0.7-1-ab on replica r0 at http://r0:8700 answered 404: no sandbox", "a new one next time")


def test_a_lost_sandbox_ends_the_episode_masked_as_sandbox_lost_at_once_and_not_as_a_harness_bug():
    played = _scripted(LostSandbox(), step_timeout_s=10)
    assert played.termination == "infra_error" and played.infra_flag == "sandbox_lost" and played.harness_error is None
    assert len(played.trajectory.observations) == 3  # the first, one answered step, the step that found it lost: no loop
    last = played.trajectory.observations[-1]
    assert last.done and last.status == "error" and "could not be reached" in last.text and "harness error" not in last.text
    errors = HarnessErrors(limit=1)  # one harness failure would stop the run: a lost sandbox is none
    errors.record("recording_solo", played, Counter())
    assert errors.failed is None and not errors.consecutive["recording_solo"]
    scored = asyncio.run(score(SimpleNamespace(timers=Counter()), played.role_result("solo"), "t-1", "verifiers", None))
    assert scored.status == "infra_error" and scored.flags == ["infra_error", "sandbox_lost"]  # masked, saying why


def test_a_sandbox_lost_at_creation_is_retried_then_masked_as_sandbox_lost():
    played = _scripted(LostAtCreation(), step_timeout_s=10, create_retries=1, create_backoff_s=0.01)
    assert played.termination == "infra_error" and played.infra_flag == "sandbox_lost" and played.harness_error is None
    assert played.counters["env_create_retries"] == 1
    assert "environment creation failed 2 times: reset(): sandbox r0.7-1-ab on replica r0" in played.error
