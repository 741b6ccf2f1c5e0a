"""Helpers of the live-streaming tests (the embedded server's and the gateway's): the inference
server's own counters, polling with a deadline, and a client that leaves after the first content."""

from __future__ import annotations

import json
import time

import httpx

HELLO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def engine_counters(url: str) -> dict[str, float]:
    """The embedded server's own counters (its /metrics): requests, aborted requests, generated tokens."""
    wanted = {"sglang:num_requests_total": "requests", "sglang:num_aborted_requests_total": "aborted",
              "sglang:generation_tokens_total": "tokens"}
    found = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            found[wanted[name]] = float(line.rsplit(" ", 1)[1])
    return found


def until(check, what: str, deadline_s: float = 60.0):
    """Poll `check()` until it returns something truthy, failing after the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {deadline_s:g} s")


# a generation a client leaves: long enough to be still running when the client has read its first
# content and gone (the tiny random model decodes 64 tokens in about 30 ms, which a client reading the
# first event, closing and the server noticing may not beat); stopped there, it costs nothing more
LEAVE_TOKENS = 1500

LONG = {"model": "m", "messages": HELLO, "max_tokens": 64, "ignore_eos": True, "temperature": 0, "stream": True,
        "logprobs": True}


def first_content_then_leave(url: str, body: dict, headers: dict | None = None) -> dict:
    """Stream `body`, read up to the first content event, then close the connection (the client goes away)."""
    with httpx.stream("POST", url, json=body, headers=headers or {}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    return chunk
    raise AssertionError("the stream ended without a content event")
