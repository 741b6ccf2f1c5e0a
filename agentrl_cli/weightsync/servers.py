"""What the publisher asks of each inference server by URL, outside the load-balanced client: the
weight version it serves, and loading a model directory on one server alone (a server that
restarted comes back with its launch weights and is brought up to date without touching the others);
and reading the numbers out of a `get_weights_by_name` answer. Routes and bodies are the engine's
(`engine`: the client's `InferenceEngine`; SGLang's protocol when None).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from agentrl_cli.core.httpclient import async_http_client
from agentrl_cli.engines.engine import answer_ok, disk_update_calls
from agentrl_cli.engines.inference.client import InferenceError
from agentrl_cli.engines.registry import engine_named

log = logging.getLogger(__name__)


def wire(engine):
    """`engine`, or SGLang's protocol when None."""
    return engine if engine is not None else engine_named("sglang")


async def server_weight_version(http: httpx.AsyncClient, url: str, timeout_s: float = 5.0, engine=None) -> str | None:
    """The weight version `url` serves (the engine's weight-version routes in order: SGLang's
    /get_weight_version, else /model_info); None when it does not answer within `timeout_s` (down
    or hung: left for the rollout's resume path and the watchdog)."""
    engine = wire(engine)
    for path in engine.routes.weight_version:
        try:
            r = await http.get(url + path, timeout=timeout_s)
        except httpx.TransportError:
            return None
        version = engine.parse_weight_version(r.json()) if r.status_code == 200 else None
        if version is not None:
            return version
    return None


async def stale_servers(urls: list[str], version: str, *, headers: dict | None = None, engine=None) -> dict[str, str]:
    """The reachable servers that serve another weight version than `version`: url -> theirs."""
    async with async_http_client(headers=headers or {}) as http:
        serving = await asyncio.gather(*(server_weight_version(http, u, engine=engine) for u in urls))
    return {u: v for u, v in zip(urls, serving) if v is not None and v != str(version)}


async def load_from_disk(urls: list[str], path: str, version: str, *, headers: dict | None = None,
                         timeout_s: float = 600.0, engine=None) -> list[str]:
    """Load the model directory `path` as `version` on each of `urls`, one by one; returns them. A
    load that fails, or a server that then reports another version, raises InferenceError."""
    engine = wire(engine)
    async with async_http_client(timeout=timeout_s, headers=headers or {}) as http:
        for url in urls:
            log.warning("re-syncing inference server %s to weight version %s from %s", url, version, path)
            failed = None
            for call in disk_update_calls(engine, path, version):
                if failed is not None and not call.always:
                    continue
                r = await http.post(url + call.route, json=call.body, params=call.query)
                try:
                    answer = r.json()
                except ValueError:
                    answer = None
                if failed is None and not answer_ok(engine, r.status_code, answer):
                    failed = f"{call.what}: {r.status_code}: {r.text[:300]}"
            now = await server_weight_version(http, url, engine=engine)
            if failed is not None or now != str(version):
                raise InferenceError(f"re-syncing weights on {url} failed ({failed or 'no error'}; serving {now})",
                                     "check the export path and the server log")
    return list(urls)


def flatten_rows(rows) -> list[float]:
    """The numbers of a `get_weights_by_name` answer (nested lists), in order."""
    out: list[float] = []
    stack = [rows]
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(reversed(x))
        else:
            out.append(float(x))
    return out
