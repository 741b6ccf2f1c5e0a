"""The recording gateway with the real openai SDK against the embedded server (random tiny model)
through a real InferenceClient: multi-turn tool conversations recorded token-exact and stitched,
history rewrites counted and split, forks, rewards, 429 backpressure the SDK retries, 401s,
idle expiry, streaming, and `agentrl serve gateway` as a process.

The client is tapped (`TappedClient`: the InferenceClient itself, keeping what each /generate was
sent and answered) so the tests compare the record with the ids actually served."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import openai
import pytest

from agentrl_cli.engines.gateway.app import create_app
from agentrl_cli.engines.gateway.backend import ClientBackend
from agentrl_cli.engines.gateway.record import SessionRecord
from agentrl_cli.engines.gateway.service import Gateway
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.core.serving import ServerThread
from tests.conftest import free_port
from tests.integration.streaming import LEAVE_TOKENS, LONG, engine_counters, first_content_then_leave, until

pytestmark = [pytest.mark.integration]

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                          "required": ["word"]}}}]
ADMIN = "admin-key-for-tests"


class TappedClient(InferenceClient):
    """The run's InferenceClient, keeping (input ids, output ids, log-probs) of every /generate."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.served: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, input_ids, sampling, rid=None):
        gen = await super().generate(input_ids, sampling, rid)
        self.served.append((list(input_ids), list(gen.output_ids), list(gen.output_logprobs)))
        return gen

    async def generate_stream(self, input_ids, sampling, rid):
        tokens = await super().generate_stream(input_ids, sampling, rid)

        async def tapped():
            try:
                async for new, logprobs, version, final in tokens:
                    if final is not None:
                        self.served.append((list(input_ids), list(final.output_ids), list(final.output_logprobs)))
                    yield new, logprobs, version, final
            finally:
                await tokens.aclose()
        return tapped()


@dataclass
class Running:
    url: str
    gateway: Gateway
    client: TappedClient

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30, **kwargs)

    def session(self, **meta) -> dict:
        r = self.admin("POST", "/sessions", json={"meta": meta})
        assert r.status_code == 200, r.text
        return r.json()

    def sdk(self, session: dict, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], timeout=60, **kwargs)


@pytest.fixture(scope="module")
def tokenizer(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(random_model_dir))


@contextlib.contextmanager
def gateway_on(server, tokenizer, **kwargs):
    client = TappedClient([server.url], timeout_s=120)
    gw = Gateway(ClientBackend(client, tokenizer, model_name="tiny-random", context_length=2048),
                 retry_after_s=kwargs.pop("retry_after_s", 0.05), **kwargs)
    srv = ServerThread(create_app(gw, admin_key=ADMIN), name="gateway").start()
    try:
        yield Running(srv.url, gw, client)
    finally:
        if client._session_loop is not None:  # the client's connections live on the server's loop
            asyncio.run_coroutine_threadsafe(client.close(), client._session_loop).result(10)
        srv.stop()


@pytest.fixture
def gw(server, tokenizer):
    with gateway_on(server, tokenizer) as running:
        yield running


def tool_turn(sdk: openai.OpenAI, messages: list, seed: int, **kwargs):
    """One agent turn as OpenAI agents write it: call, append the assistant message as returned,
    then a tool message answering each call (or one result when the model called nothing)."""
    resp = sdk.chat.completions.create(model="tiny-random", messages=messages, tools=TOOLS, max_tokens=8, seed=seed,
                                       logprobs=True, **kwargs)
    message = resp.choices[0].message
    messages.append(message)
    for call_id in [c.id for c in message.tool_calls or []] or ["call_none"]:
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"result {seed}: 42"})
    return resp


def first_messages() -> list:
    return [{"role": "system", "content": "You look words up."}, {"role": "user", "content": "What is a gateway?"}]


def mismatches(segment: dict, served: list) -> int:
    """Tokens of the segment that differ from what /generate was sent and answered (the served calls
    being this segment's, in order), plus every length difference; and the loss mask must be 1 on
    exactly the generated positions."""
    ids, bad = segment["token_ids"], 0
    generated = set()
    for input_ids, output_ids, _ in served:
        bad += sum(a != b for a, b in zip(ids, input_ids)) + max(0, len(input_ids) - len(ids))
        part = ids[len(input_ids):len(input_ids) + len(output_ids)]
        bad += sum(a != b for a, b in zip(part, output_ids)) + len(output_ids) - len(part)
        generated |= set(range(len(input_ids), len(input_ids) + len(output_ids)))
    last_in, last_out, _ = served[-1]
    bad += abs(len(ids) - len(last_in) - len(last_out))
    bad += sum(m != (i in generated) for i, m in enumerate(segment["loss_mask"]))
    return bad


def forward_logprobs(model_dir, ids: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_three_turn_tool_conversation_is_one_token_exact_segment_with_its_reward(gw, random_model_dir):
    session = gw.session(task_id="t-1")
    sdk = gw.sdk(session)
    messages = first_messages()
    responses = [tool_turn(sdk, messages, seed) for seed in (1, 2, 3)]
    r = gw.admin("POST", f"/sessions/{session['session_id']}/reward", json={"reward": 1.0})
    assert r.status_code == 200, r.text
    r = gw.admin("POST", f"/sessions/{session['session_id']}/reward", json={"reward": 0.25, "call_id": responses[1].id})
    assert r.status_code == 200, r.text

    record = gw.admin("GET", f"/sessions/{session['session_id']}").json()
    counters = record["counters"]
    print(f"\ntoken-exactness of the template's re-render over 2 continued calls: {counters}")
    assert len(record["segments"]) == 1 and counters["non_prefix_calls"] == 0 and counters["calls"] == 3
    assert counters["rerender_exact_calls"] + counters["rerender_mismatch_calls"] == 2  # every continuation measured
    assert counters["spliced_calls"] == counters["rerender_mismatch_calls"]  # each mismatch spliced, none split
    segment = record["segments"][0]
    assert len(gw.client.served) == 3
    assert mismatches(segment, gw.client.served) == 0
    for input_ids, output_ids, logprobs in gw.client.served:
        assert segment["logprobs"][len(input_ids):len(input_ids) + len(output_ids)] == pytest.approx(logprobs, abs=1e-7)
    forward = forward_logprobs(random_model_dir, segment["token_ids"])
    trained = [i for i, m in enumerate(segment["loss_mask"]) if m]
    assert trained and max(abs(segment["logprobs"][i] - forward[i]) for i in trained) < 1e-3
    assert segment["weight_versions"] == ["3", "3", "3"]

    steps = segment["calls"]
    assert [s["call_id"] for s in steps] == [resp.id for resp in responses]
    assert [s["action_text"] for s in steps] == [resp.choices[0].message.content or "" for resp in responses]
    assert [m["role"] for m in steps[0]["observation"]] == ["tool"] and steps[2]["observation"] == []
    assert steps[1]["observation"][0]["content"] == "result 2: 42"
    assert segment["messages"] == first_messages()
    assert record["rewards"] == {"episode": 1.0, "calls": {responses[1].id: 0.25}}
    assert [s["reward"] for s in steps] == [None, 0.25, None] and record["meta"] == {"task_id": "t-1"}
    again = SessionRecord.from_dict(record)  # what a run reading a gateway in another process gets
    assert again.segments[0].token_ids == segment["token_ids"] and again.rewards.episode == 1.0
    assert again.segments[0].calls[1].observation_text() == "result 2: 42"
    assert again.segments[0].calls[0].action().text == steps[0]["action_text"]


def test_history_rewriting_agent_is_counted_and_split_into_segments(gw):
    session = gw.session()
    sdk = gw.sdk(session)
    messages = first_messages()
    tool_turn(sdk, messages, 1)
    tool_turn(sdk, messages, 2)
    messages[1] = {"role": "user", "content": "What is a gateway, briefly?"}  # edits an earlier message
    tool_turn(sdk, messages, 3)
    del messages[2:4]  # drops the first assistant turn and its tool result
    tool_turn(sdk, messages, 4)

    record = gw.admin("GET", f"/sessions/{session['session_id']}").json()
    assert record["counters"]["non_prefix_calls"] == 2 and record["counters"]["calls"] == 4
    assert gw.admin("GET", "/stats").json()["gateway/non_prefix_calls"] == 2
    segments = record["segments"]
    assert [len(s["calls"]) for s in segments] == [2, 1, 1]
    served = gw.client.served
    assert mismatches(segments[0], served[0:2]) == 0
    assert mismatches(segments[1], served[2:3]) == 0 and mismatches(segments[2], served[3:4]) == 0
    assert segments[1]["messages"][1]["content"] == "What is a gateway, briefly?"


def test_a_fork_keeps_the_continued_choice_and_trains_the_other_alone(gw):
    session = gw.session()
    sdk = gw.sdk(session)
    messages = first_messages()
    first = sdk.chat.completions.create(model="tiny-random", messages=messages, max_tokens=6, n=2, seed=7)
    assert len(first.choices) == 2
    messages += [first.choices[1].message, {"role": "user", "content": "Go on."}]
    sdk.chat.completions.create(model="tiny-random", messages=messages, max_tokens=6, seed=8)

    record = gw.admin("GET", f"/sessions/{session['session_id']}").json()
    assert record["counters"]["non_prefix_calls"] == 0 and record["counters"]["forks"] == 1
    long, alone = sorted(record["segments"], key=lambda s: -len(s["calls"]))
    assert [s["choice"] for s in long["calls"]] == [1, 0] and [s["choice"] for s in alone["calls"]] == [0]
    prompt, out_a, _ = gw.client.served[0]
    _, out_b, _ = gw.client.served[1]
    continued = next(o for o in (out_a, out_b) if long["token_ids"][len(prompt):len(prompt) + len(o)] == o)
    other = out_b if continued is out_a else out_a
    assert alone["token_ids"] == prompt + other and alone["loss_mask"] == [0] * len(prompt) + [1] * len(other)
    assert alone["messages"] == long["messages"] == first_messages()
    assert long["calls"][0]["observation"] == [{"role": "user", "content": "Go on."}]
    assert mismatches(long, [(prompt, continued, []), gw.client.served[2]]) == 0


def test_429_at_the_limit_and_the_sdk_retry_succeeds_once_it_frees(server, tokenizer):
    class Gate:
        """The run's allowance: `script` values first (one per request that asks), then `allowed`."""

        def __init__(self) -> None:
            self.allowed, self.script, self.asked = 1, [], 0

        def __call__(self):
            self.asked += 1
            return self.script.pop(0) if self.script else self.allowed

    gate = Gate()
    with gateway_on(server, tokenizer, limit=gate) as gw:
        session = gw.session()
        refused = gw.admin("POST", "/sessions")  # one session open, one allowed
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["Retry-After"] == "1" and refused.headers["retry-after-ms"] == "50"

        gate.allowed = 0  # the run fell behind: calls of open sessions wait
        with pytest.raises(openai.RateLimitError) as info:
            gw.sdk(session, max_retries=0).chat.completions.create(model="tiny-random", messages=first_messages(), max_tokens=4)
        assert info.value.status_code == 429 and "retry after" in info.value.message

        gate.allowed, gate.script, gate.asked = 1, [0], 0  # refuses the next attempt, then frees
        resp = gw.sdk(session, max_retries=2).chat.completions.create(model="tiny-random", messages=first_messages(),
                                                                      max_tokens=4)
        assert resp.choices[0].finish_reason in ("stop", "length")
        assert gate.asked == 2  # the refused attempt and the SDK's retry, nothing else
        stats = gw.admin("GET", "/stats").json()
        assert stats["gateway/refused_calls"] == 2 and stats["gateway/refused_sessions"] == 1
        assert stats["gateway/calls"] == 1 and len(gw.client.served) == 1

        assert gw.admin("DELETE", f"/sessions/{session['session_id']}").status_code == 200
        assert gw.admin("POST", "/sessions").status_code == 200  # the slot freed


def test_unauthenticated_wrong_and_foreign_keys_get_401(gw):
    mine, theirs = gw.session(), gw.session()
    r = httpx.post(mine["base_url"] + "/chat/completions", json={"model": "m", "messages": first_messages()})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    for key in ("agk-wrong", theirs["api_key"], ADMIN):
        with pytest.raises(openai.AuthenticationError) as info:
            openai.OpenAI(base_url=mine["base_url"], api_key=key, max_retries=0).chat.completions.create(
                model="m", messages=first_messages(), max_tokens=2)
        assert info.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=mine["base_url"], api_key="agk-wrong", max_retries=0).models.list()
    assert [m.id for m in gw.sdk(mine).models.list()] == ["tiny-random"]
    # an agent holding its session key cannot manage sessions or post its own reward
    for method, path in (("POST", "/sessions"), ("POST", f"/sessions/{mine['session_id']}/reward"),
                         ("GET", f"/sessions/{mine['session_id']}")):
        r = httpx.request(method, gw.url + path, json={"reward": 1.0}, headers={"Authorization": f"Bearer {mine['api_key']}"})
        assert r.status_code == 401, (method, path, r.text)
    assert gw.gateway.counters["gateway/calls"] == 0 and gw.client.served == []


def test_idle_sessions_expire_and_hand_over_their_record(server, tokenizer):
    now, expired = [0.0], []
    with gateway_on(server, tokenizer, ttl_s=30, clock=lambda: now[0], on_expire=expired.append) as gw:
        session = gw.session(task_id="t-9")
        gw.sdk(session).chat.completions.create(model="tiny-random", messages=first_messages(), max_tokens=3)
        now[0] = 29.0
        assert gw.admin("GET", f"/sessions/{session['session_id']}").status_code == 200  # reading it is not use
        now[0] = 31.0
        with pytest.raises(openai.AuthenticationError) as info:
            gw.sdk(session, max_retries=0).chat.completions.create(model="tiny-random", messages=first_messages(), max_tokens=3)
        assert "expired" in info.value.message
        assert [(r.session_id, r.meta, r.counters["calls"]) for r in expired] == [(session["session_id"], {"task_id": "t-9"}, 1)]
        assert gw.admin("GET", "/stats").json()["gateway/expired_sessions"] == 1


def test_streaming_through_the_gateway_is_recorded_like_any_call(gw):
    session = gw.session()
    stream = gw.sdk(session).chat.completions.create(model="tiny-random", messages=first_messages(), max_tokens=6,
                                                    seed=5, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    record = gw.admin("DELETE", f"/sessions/{session['session_id']}").json()
    step = record["segments"][0]["calls"][0]
    assert step["action_text"] == text and step["completion_tokens"] == len(gw.client.served[0][1])
    assert gw.admin("GET", f"/sessions/{session['session_id']}").status_code == 404


def test_a_live_stream_through_the_gateway_is_recorded_from_exactly_the_ids_streamed(gw, tokenizer):
    """A 64-token generation streamed through a session token by token: the tokens the agent was
    streamed (their log-prob entries) are the ids the server generated and the ids recorded."""
    session = gw.session()
    stream = gw.sdk(session).chat.completions.create(model="tiny-random", messages=first_messages(), max_tokens=64,
                                                    stream=True, logprobs=True, temperature=0,
                                                    extra_body={"ignore_eos": True})
    pieces, entries, ids = [], [], set()
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            pieces += [choice.delta.content] if choice.delta.content else []
            entries += choice.logprobs.content if choice.logprobs else []
    record = gw.admin("DELETE", f"/sessions/{session['session_id']}").json()
    (segment,) = record["segments"]
    (step,) = segment["calls"]
    (served,) = gw.client.served
    generated = segment["token_ids"][step["prompt_tokens"]:]
    assert generated == served[1] and len(generated) == 64 and segment["loss_mask"].count(1) == 64
    assert [e.token for e in entries] == [tokenizer.decode([t]) for t in generated]
    assert [e.logprob for e in entries] == pytest.approx(segment["logprobs"][step["prompt_tokens"]:], abs=1e-6)
    assert step["action_text"] == "".join(pieces) and len(pieces) > 8 and ids == {step["call_id"]}
    assert gw.gateway.stats()["gateway/calls_in_flight"] == 0


def test_an_agent_that_leaves_mid_stream_aborts_the_generation_and_records_no_half_step(gw, server):
    """The agent reads the first content event of a long generation and goes away: the inference
    server's own counters show the request aborted before its last token, and the session records no
    step of it, only `aborted_calls` (which masks the episode)."""
    session = gw.session()
    before = engine_counters(server.url)
    body = {**LONG, "model": "tiny-random", "messages": first_messages(), "max_tokens": LEAVE_TOKENS}
    first_content_then_leave(f"{session['base_url']}/chat/completions", body,
                             {"Authorization": f"Bearer {session['api_key']}"})
    after = until(lambda: (c := engine_counters(server.url))["requests"] > before["requests"] and c,
                   "the aborted request to finish")
    assert after["aborted"] == before["aborted"] + 1 and 1 <= after["tokens"] - before["tokens"] < LEAVE_TOKENS
    until(lambda: gw.gateway.stats()["gateway/calls_in_flight"] == 0, "the gateway to release the call")
    record = gw.admin("GET", f"/sessions/{session['session_id']}").json()
    assert record["segments"] == [] and record["counters"]["calls"] == 0 and record["counters"]["aborted_calls"] == 1
    assert gw.gateway.stats()["gateway/aborted_calls"] == 1


def test_agentrl_serve_gateway_serves_an_sdk_agent(server, random_model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "AGENTRL_GATEWAY_ADMIN_KEY": ADMIN}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "gateway", "--inference-url", server.url,
                             "--model", str(random_model_dir), "--port", str(port), "--max-sessions", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "gateway not healthy within 120 s"
            time.sleep(0.1)  # poll interval
        headers = {"Authorization": f"Bearer {ADMIN}"}
        session = httpx.post(url + "/sessions", headers=headers, timeout=10).json()
        assert session["base_url"] == f"{url}/s/{session['session_id']}/v1"
        sdk = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], timeout=60)
        resp = sdk.chat.completions.create(model=str(random_model_dir), messages=first_messages(), max_tokens=4)
        record = httpx.get(f"{url}/sessions/{session['session_id']}", headers=headers, timeout=10).json()
        step = record["segments"][0]["calls"][0]
        assert record["counters"]["calls"] == 1 and step["call_id"] == resp.id
        assert step["completion_tokens"] == resp.usage.completion_tokens >= 1
        assert httpx.post(url + "/sessions", timeout=10).status_code == 401  # management needs the admin key
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_an_echoed_tool_call_continues_its_turn_however_the_sdk_serializes_it(tokenizer):
    """The splice itself, on the real tokenizer and the OpenAI API's own renderer: a turn that called a
    tool, generated with JSON spacing the template does not reproduce, is continued token-exact when
    the agent sends the call back (as the SDK serializes a returned message, or re-serialized), and
    not when the agent changed it."""
    from openai.types.chat import ChatCompletionMessage

    from agentrl_cli.engines.gateway.record import Recorder
    from agentrl_cli.engines.gateway.splice import Plan, plan_call
    from agentrl_cli.model.chat import chat_format
    from agentrl_cli.engines.openai_api import ChatCall, Completion
    from agentrl_cli.engines.openai_api.protocol import parse_chat
    from agentrl_cli.engines.openai_api.render import render_chat

    fmt = chat_format(tokenizer)
    render = lambda body: render_chat(tokenizer, parse_chat({"model": "m", **body})).prompt_ids  # noqa: E731
    first = {"messages": first_messages(), "tools": TOOLS}
    prompt = render(first)
    generated = tokenizer.encode('<tool_call>\n{"name":"lookup","arguments":{"word":"gate"}}\n</tool_call>',
                                 add_special_tokens=False) + [fmt.end_of_turn]
    returned = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "call_0123456789abcdef01234567", "type": "function",
         "function": {"name": "lookup", "arguments": '{"word": "gate"}'}}]}
    recorder = Recorder()
    recorder.record(ChatCall(request=first, prompt_ids=prompt, choices=[Completion(generated, [-0.5] * len(generated), "stop")],
                             response={"id": "chatcmpl-1", "choices": [{"index": 0, "message": returned}]},
                             messages=first["messages"], tools=TOOLS), prompt, prompt, Plan(prompt))
    result = {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "a door"}
    as_sdk = ChatCompletionMessage.model_validate(returned).model_dump(exclude_unset=True, mode="json")
    reserialized = {**returned, "content": "", "tool_calls": [{**returned["tool_calls"][0], "function": {
        "name": "lookup", "arguments": '{"word":"gate"}'}}]}
    for echo in (as_sdk, reserialized):
        body = {"messages": first_messages() + [echo, result], "tools": TOOLS}
        rendered = render(body)
        plan = plan_call(recorder.tips(), body, rendered, tokenizer, fmt.end_of_turn, fmt.stop_ids)
        closing = rendered.index(fmt.end_of_turn, len(prompt))  # the end of the re-rendered assistant turn
        assert plan.spliced and plan.rerender_exact is False and plan.observation == [result]
        assert plan.sent == prompt + generated + rendered[closing + 1:]
    changed = {**returned, "tool_calls": [{**returned["tool_calls"][0], "function": {"name": "lookup",
                                                                                   "arguments": '{"word": "door"}'}}]}
    body = {"messages": first_messages() + [changed, result], "tools": TOOLS}
    plan = plan_call(recorder.tips(), body, render(body), tokenizer, fmt.end_of_turn, fmt.stop_ids)
    assert plan.tip is None and not plan.spliced and plan.sent == render(body)
