"""Generation that survives an interrupted inference server (docs/security.md row 22,
"Abort / partial rollout" and AReaL's interruption loop).

`generate_resumable` asks for one model turn and does not give up when the server aborts the
request or dies under it:
- an aborted answer (finish_reason "abort") still carries the tokens and log-probs generated so
  far; they are kept and the request is re-sent as `input_ids = prompt + partial` with
  `max_new_tokens -= len(partial)` (`rollout.allow_partial_resume: false` throws them away,
  counted as `wasted_tokens`, and starts the turn again);
- a connection that fails or times out (after the client's own retries over the servers) waits
  for a server to answer /health again, with backoff and a deadline, lets the caller re-sync the
  weights (`on_recovered`), then re-sends the same prefix;
- the attempts are bounded (`rollout.resume_max_attempts`) and so is the time since the first
  failure (`rollout.resume_deadline_s`); past them it raises `GenerationLost` and the episode ends
  as `infra_error` (masked from training, never the agent's failure).
The returned Generation is the concatenation, token for token, so training sees the exact ids the
servers sampled; `meta["pieces"]` says how many tokens each server and weight version produced,
and `weight_version` is the oldest of them (what staleness must be measured by).

Not here: the episode loop (`runtime/rollout/episode_loop.py`, its generations `turns.py`), the HTTP retries (`client.py`), putting the current
weights back on a server that restarted (`weightsync/publisher.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable


from agentrl_cli.engines.inference.client import Generation, InferenceClient, InferenceError, InferenceUnreachable, SamplingParams

log = logging.getLogger(__name__)

COUNTERS = ("aborted_generations", "resumed_generations", "wasted_tokens", "server_retries", "lost_generations")


class GenerationLost(InferenceError):
    """No server completed the generation within the attempts and the deadline."""


@dataclass
class ResumePolicy:
    allow_partial: bool = True  # keep an interrupted generation's tokens and continue from them
    max_attempts: int = 8  # re-sends of one model turn after aborts or failures
    deadline_s: float = 300.0  # from the first failure of this turn to giving up
    backoff_s: float = 0.2  # first wait before polling /health again; doubles up to max_backoff_s
    max_backoff_s: float = 5.0
    health_timeout_s: float = 5.0

    @classmethod
    def from_config(cls, config) -> "ResumePolicy":
        r = config.rollout
        return cls(allow_partial=r.allow_partial_resume, max_attempts=r.resume_max_attempts, deadline_s=r.resume_deadline_s)


def version_key(version: str) -> tuple[int, str]:
    digits = "".join(c for c in str(version) if c.isdigit())
    return (int(digits) if digits else -1, str(version))


async def generate_resumable(client: InferenceClient, input_ids: list[int], sampling: SamplingParams, policy: ResumePolicy,
                             counters: Counter, *, on_recovered: Callable[[], Awaitable[None]] | None = None) -> Generation:
    """One model turn, resumed across aborts and server failures; counts into `counters` (COUNTERS)."""
    prompt = list(input_ids)
    ids: list[int] = []
    logprobs: list[float] = []
    texts: list[str] = []
    pieces: list[dict] = []  # {"tokens", "weight_version", "server"} per answer that contributed tokens
    stops = set(sampling.stop_token_ids or ())
    attempts, retries, latency, first_failure, why = 0, 0, 0.0, None, ""
    last: Generation | None = None

    def lost() -> GenerationLost:
        counters["lost_generations"] += 1
        counters["wasted_tokens"] += len(ids)
        return GenerationLost(f"generation not completed after {attempts} attempts in {time.monotonic() - first_failure:.1f} s: "
                              f"{why}", "check the inference servers (`agentrl stage run 4`); the episode is masked as infra_error")

    def spent() -> bool:
        return attempts > policy.max_attempts or time.monotonic() - first_failure > policy.deadline_s

    while True:
        remaining = sampling.max_new_tokens - len(ids)
        if ids and (remaining <= 0 or ids[-1] in stops):  # the partial already ends the turn
            finish = "length" if remaining <= 0 else "stop"
            break
        try:
            gen = await client.generate(prompt + ids, dataclasses.replace(sampling, max_new_tokens=remaining))
        except InferenceUnreachable as exc:  # every try failed: wait for a server, re-sync, re-send
            counters["server_retries"] += 1
            attempts += 1
            first_failure = first_failure or time.monotonic()
            why = exc.message
            if spent() or not await _wait_for_server(client, policy, first_failure + policy.deadline_s):
                raise lost()
            if on_recovered is not None:
                await on_recovered()
            continue
        retries += gen.retries
        counters["server_retries"] += gen.retries
        latency += gen.latency
        last = gen
        if gen.retries and on_recovered is not None:  # a server failed on the way: it may have restarted
            await on_recovered()
        if not gen.aborted:
            ids += gen.output_ids
            logprobs += gen.output_logprobs
            texts.append(gen.text)
            pieces.append({"tokens": len(gen.output_ids), "weight_version": gen.weight_version, "server": gen.server})
            finish = gen.finish_reason
            break
        counters["aborted_generations"] += 1
        attempts += 1
        first_failure = first_failure or time.monotonic()
        why = f"{gen.server}: aborted ({(gen.meta.get('finish_reason') or {}).get('message', 'abort')})"
        got = list(gen.output_ids)
        if policy.allow_partial and got:
            ids += got
            logprobs += gen.output_logprobs
            texts.append(gen.text)
            pieces.append({"tokens": len(got), "weight_version": gen.weight_version, "server": gen.server})
        else:
            counters["wasted_tokens"] += len(got)
        if spent():
            raise lost()
        if ids:
            counters["resumed_generations"] += 1
        if not got:  # nothing came back: do not hammer a server that aborts at once
            await asyncio.sleep(policy.backoff_s)
    versions = [p["weight_version"] for p in pieces] or [last.weight_version if last else ""]
    return Generation(output_ids=ids, output_logprobs=logprobs, finish_reason=finish, weight_version=min(versions, key=version_key),
                      latency=latency, text="".join(texts), prompt_tokens=len(prompt), server=last.server if last else "",
                      retries=retries, meta={"pieces": pieces, "attempts": attempts + 1})


async def _wait_for_server(client: InferenceClient, policy: ResumePolicy, deadline: float) -> list[str]:
    """Poll /health with backoff until some server answers or the deadline passes; the healthy URLs."""
    delay = policy.backoff_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return []
        await asyncio.sleep(min(delay, left))
        left = deadline - time.monotonic()
        healthy = await client.healthy_urls(timeout_s=max(0.1, min(policy.health_timeout_s, left)))
        if healthy:
            return healthy
        delay = min(delay * 2, policy.max_backoff_s)
