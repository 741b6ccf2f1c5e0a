"""A tool call the model wrote that the parser refused, through a real gateway session: the real
openai SDK calls the gateway over HTTP; the backend answers with text the test chose (a model's
malformed call, then a plain answer), so the planted call is known. The gateway counts it in
total and for the session's harness, names it on its step, the stored trajectory marks that step
`invalid_action`, and `agentrl troubleshoot --run` on a run whose rows carry the counters names it
with the hint; the run report shows it by harness."""

from __future__ import annotations

import httpx
import openai
import pytest

from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.gateway.app import create_app
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.engines.openai_api import Completion
from tests.integration.test_gateway import ADMIN, TOOLS, first_messages

pytestmark = [pytest.mark.integration]
MALFORMED = '<tool_call>\n{"name": "lookup", "arguments": {"word": \n</tool_call>'  # cut-off JSON, closed


class ScriptedBackend:
    """An openai_api.Backend whose model writes `texts` in turn: each the tokenizer's ids of the text,
    and the end-of-turn token unless `finish` is "length" (cut off by the limit), as a server returns them."""

    def __init__(self, tokenizer, texts: list[str], finish: str = "stop") -> None:
        from agentrl_cli.model.chat import chat_format

        self.tokenizer, self.texts, self.finish = tokenizer, list(texts), finish
        self.end = chat_format(tokenizer).end_of_turn

    def model_name(self) -> str:
        return "scripted"

    async def generate(self, input_ids, sampling, *, n=1, top_logprobs=0):
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        stopped = self.finish == "stop"
        ids += [self.end] if stopped else []
        return [Completion(ids, [-0.5] * len(ids), self.finish, matched_stop=self.end if stopped else None,
                           weight_version="1")]


def play(backend: ScriptedBackend, meta: dict) -> tuple[dict, dict, list]:
    """One session through HTTP with an agent that answers each reply; (the gateway's stats, the
    session's record, the messages the agent received)."""
    gw = Gateway(backend)
    srv = ServerThread(create_app(gw, admin_key=ADMIN), name="gateway").start()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        session = httpx.post(srv.url + "/sessions", json={"meta": meta}, headers=admin, timeout=30).json()
        sdk = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], timeout=60, max_retries=0)
        messages, received = first_messages(), []
        while backend.texts:
            reply = sdk.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, max_tokens=64)
            received.append(reply.choices[0].message)
            messages += [reply.choices[0].message, {"role": "user", "content": "Go on."}]
        record = httpx.delete(srv.url + f"/sessions/{session['session_id']}", headers=admin, timeout=30).json()
        return gw.stats(), record, received
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


def test_a_planted_malformed_call_is_counted_marked_on_its_step_and_named_by_troubleshoot(tokenizer, tmp_path, cli):
    stats, record, received = play(ScriptedBackend(tokenizer, [MALFORMED, "A gateway passes calls on."]),
                                   {"harness": "agent", "task_id": "t/0"})
    assert not received[0].tool_calls and received[0].content == MALFORMED  # the agent sees what went wrong
    assert stats["gateway/malformed_tool_calls"] == 1 and stats["gateway/agent/malformed_tool_calls"] == 1
    assert stats["gateway/calls"] == 2
    steps = sorted((s for seg in record["segments"] for s in seg["calls"]), key=lambda s: s["index"])
    assert ["not valid JSON" in r for r in steps[0]["malformed_tool_calls"]] == [True]
    assert steps[1]["malformed_tool_calls"] == []

    stored = _stored(record)  # the stored trajectory says which step it was
    assert [s.observation_status for s in stored.steps][0] == "invalid_action" and stored.invalid_actions == 1

    from tests.unit.test_verify_faults import loaded_config, make_run, rows

    loaded = loaded_config(tmp_path)
    metrics = rows()
    for r in metrics:  # the counters as the run's rows carry them (the controller mirrors gateway.stats())
        r.update({k: v for k, v in stats.items() if k not in ("gateway/open_sessions", "gateway/calls_in_flight")})
    run = make_run(loaded, metrics=metrics)
    result, found = cli.json("troubleshoot", "--run", run.run_id, "--set", f"observe.runs_dir={tmp_path / 'runs'}",
                             "--set", f"data.root={tmp_path / 'data'}")
    assert result.exit_code == 1 and found["findings"][0]["id"] == "malformed-tool-calls", found
    [evidence] = found["findings"][0]["evidence"]
    assert "the model writes tool calls the agent cannot parse: check the tool-call parser for this model family" \
        in evidence["summary"]
    assert evidence["figures"]["gateway/<harness>/malformed_tool_calls"] == {"agent": 1}

    from agentrl_cli.acceptance.run_report import write_report

    page, _ = write_report(run.path, data_config=loaded.config.data)  # the run report's per-harness table shows it
    assert "<tr><td>agent</td><td>malformed_tool_calls</td><td>1</td></tr>" in page.read_text(encoding="utf-8")


def test_a_well_formed_call_and_a_call_cut_off_by_the_length_limit_are_not_malformed(tokenizer):
    good = '<tool_call>\n{"name": "lookup", "arguments": {"word": "gate"}}\n</tool_call>'
    stats, record, received = play(ScriptedBackend(tokenizer, [good]), {"harness": "agent"})
    assert received[0].tool_calls[0].function.name == "lookup"
    assert stats["gateway/malformed_tool_calls"] == 0 and stats["gateway/agent/malformed_tool_calls"] == 0
    cut = '<tool_call>\n{"name": "lookup", "arguments": {"wo'  # max_tokens ended it, not the model
    stats, record, received = play(ScriptedBackend(tokenizer, [cut], finish="length"), {"harness": "agent"})
    assert received[0].content == cut and stats["gateway/malformed_tool_calls"] == 0


def _stored(record: dict):
    """The session's record as the run stores its episode (agent_episode.fill_from_record, then the writer's record)."""
    from agentrl_cli.core.episode import Observation, TaskSpec, Trajectory
    from agentrl_cli.engines.gateway.record import SessionRecord
    from agentrl_cli.runtime.data.record_from_episode import record_from_episode
    from agentrl_cli.runtime.rollout.agent_episode import fill_from_record
    from agentrl_cli.runtime.rollout.episode_loop import EpisodeResult

    task = TaskSpec("t/0", "agent", "What is a gateway?", None, 1, "train")
    result = EpisodeResult(Trajectory(task, observations=[Observation(task.prompt)]), None, "done")
    fill_from_record(result, SessionRecord.from_dict(record), "A gateway passes calls on.")
    return record_from_episode(result.trajectory, run_id="r", harness_version="1")
