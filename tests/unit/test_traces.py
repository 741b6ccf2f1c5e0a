"""runtime/observe/traces.py: the spans of an episode and a train step, written through OpenTelemetry's SDK and
its OTLP/JSON encoder, read back from the file: roots start traces of their own (an episode played
inside a train step included), children hang off the span current in their task, a span that raises
carries status ERROR and the exception, nothing is traced outside a root or with observe.traces off,
and secrets are redacted from what is written."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import pytest

from agentrl_cli.runtime.observe import traces
from agentrl_cli.core.redaction import protect_process

STATUS_ERROR = 2  # OTLP's Status.code


def read_spans(path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        request = json.loads(line)
        for resource in request["resourceSpans"]:
            service = {a["key"]: a["value"] for a in resource["resource"]["attributes"]}["service.name"]
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    attrs = {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}
                    out.append({**span, "attrs": attrs, "service": service["stringValue"]})
    return out


async def generation():
    await asyncio.sleep(0)
    return SimpleNamespace(output_ids=[5, 6, 7], weight_version="4")


async def env_step(fail: bool = False):
    await asyncio.sleep(0)
    if fail:
        raise TimeoutError("step took longer than 1 s")
    return SimpleNamespace(status="ok", done=True)


async def episode_body(fail_tool: bool):
    action = SimpleNamespace(tool_calls=[SimpleNamespace(name="search")])
    await traces.child("model_call", generation(), {"step": 0}, traces.model_call_attributes)
    try:
        await traces.child("tool_call", env_step(fail_tool), traces.tool_call_attributes(0, action), traces.observation_attributes)
    except TimeoutError:
        pass
    scored = await traces.child("reward", asyncio.sleep(0, SimpleNamespace(reward=1.0, status="ok")),
                                after=traces.reward_attributes)
    return SimpleNamespace(termination="done"), scored, None


def play_step(observe, n_episodes: int = 2):
    async def step():
        await asyncio.gather(*(traces.episode(observe, episode_body(fail_tool=i == 1), trajectory_id=f"r1-train-g0-{i}",
                                              run_id="r1", harness="tool_api_like", task_id=f"t{i}", phase="train")
                               for i in range(n_episodes)))
        return {"train/loss": 0.25, "reward/mean": 1.0}

    async def main():
        await traces.child("model_call", generation())  # outside any root: not traced
        return await traces.train_step(observe, "r1", 1, step())
    return asyncio.run(main())


def test_each_episode_is_a_tree_of_its_own_even_inside_a_train_step(tmp_path):
    observe = SimpleNamespace(traces=str(tmp_path / "traces.jsonl"))
    assert play_step(observe) == {"train/loss": 0.25, "reward/mean": 1.0}
    found = read_spans(tmp_path / "traces.jsonl")
    roots = [s for s in found if "parentSpanId" not in s]
    assert sorted(s["name"] for s in roots) == ["episode", "episode", "train_step"]
    assert len({s["traceId"] for s in roots}) == 3 and all(s["service"] == "agentrl" for s in found)
    assert all(re.fullmatch(r"[0-9a-f]{32}", s["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", s["spanId"]) for s in found)
    step = next(s for s in roots if s["name"] == "train_step")
    assert step["attrs"] == {"agentrl.run_id": "r1", "agentrl.step": "1", "agentrl.loss": 0.25, "agentrl.reward_mean": 1.0}
    for root in (s for s in roots if s["name"] == "episode"):
        children = [s for s in found if s.get("parentSpanId") == root["spanId"]]
        assert sorted(c["name"] for c in children) == ["model_call", "reward", "tool_call"]
        assert all(c["traceId"] == root["traceId"] for c in children)
        assert root["attrs"]["agentrl.trajectory_id"].startswith("r1-train-g0-")
        assert root["attrs"]["agentrl.reward"] == 1.0 and root["attrs"]["agentrl.termination"] == "done"
    assert len(found) == 3 + 2 * 3  # the model call outside a root left no span


def test_a_child_that_raises_has_status_error_and_the_exception(tmp_path):
    observe = SimpleNamespace(traces=str(tmp_path / "traces.jsonl"))
    play_step(observe)
    tools = [s for s in read_spans(tmp_path / "traces.jsonl") if s["name"] == "tool_call"]
    failed = [s for s in tools if s["status"].get("code") == STATUS_ERROR]
    assert len(failed) == 1 and [e["name"] for e in failed[0]["events"]] == ["exception"]
    ok = next(s for s in tools if s not in failed)
    assert ok["attrs"] == {"agentrl.step": "0", "agentrl.tools": {"values": [{"stringValue": "search"}]},
                           "agentrl.status": "ok", "agentrl.done": True}


def test_nothing_is_written_with_traces_off(tmp_path):
    assert play_step(SimpleNamespace(traces="")) == {"train/loss": 0.25, "reward/mean": 1.0}
    assert list(tmp_path.iterdir()) == []


def test_span_text_passes_the_secret_redaction(tmp_path, monkeypatch):
    secret = "tok-3f9a8b7c6d5e4f3a2b1c"
    monkeypatch.setenv("HARNESS_API_TOKEN", secret)
    protect_process()
    observe = SimpleNamespace(traces=str(tmp_path / "traces.jsonl"))

    async def main():
        await traces.episode(observe, asyncio.sleep(0, (SimpleNamespace(termination="done"), None)),
                             trajectory_id="t", run_id="r", harness="h", task_id=f"task-{secret}", phase="train")
    asyncio.run(main())
    text = (tmp_path / "traces.jsonl").read_text()
    assert secret not in text and "[REDACTED:HARNESS_API_TOKEN]" in text


@pytest.mark.parametrize("value, expected", [(None, {}), ([1, "a"], {"agentrl.x": ["1", "a"]}), (object, None)])
def test_attribute_values_are_what_opentelemetry_takes(value, expected):
    got = traces._attrs({"x": value})
    if expected is None:
        assert isinstance(got["agentrl.x"], str)
    else:
        assert got == expected
