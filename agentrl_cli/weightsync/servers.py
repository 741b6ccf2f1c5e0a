"""What the publisher asks of each inference server by URL, outside the load-balanced client: the
weight version it serves, and loading a model directory on one server alone (a server that
restarted comes back with its launch weights and is brought up to date without touching the others);
and reading the numbers out of a `get_weights_by_name` answer.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from agentrl_cli.core.httpclient import async_http_client
from agentrl_cli.engines.inference.client import InferenceError

log = logging.getLogger(__name__)


async def server_weight_version(http: httpx.AsyncClient, url: str, timeout_s: float = 5.0) -> str | None:
    """The weight version `url` serves (/get_weight_version, else /model_info); None when it does not
    answer within `timeout_s` (down or hung: left for the rollout's resume path and the watchdog)."""
    for path in ("/get_weight_version", "/model_info"):
        try:
            r = await http.get(url + path, timeout=timeout_s)
        except httpx.TransportError:
            return None
        if r.status_code == 200 and "weight_version" in r.json():
            return str(r.json()["weight_version"])
    return None


async def stale_servers(urls: list[str], version: str, *, headers: dict | None = None) -> dict[str, str]:
    """The reachable servers that serve another weight version than `version`: url -> theirs."""
    async with async_http_client(headers=headers or {}) as http:
        serving = await asyncio.gather(*(server_weight_version(http, u) for u in urls))
    return {u: v for u, v in zip(urls, serving) if v is not None and v != str(version)}


async def load_from_disk(urls: list[str], path: str, version: str, *, headers: dict | None = None,
                         timeout_s: float = 600.0) -> list[str]:
    """Load the model directory `path` as `version` on each of `urls`, one by one; returns them. A
    load that fails, or a server that then reports another version, raises InferenceError."""
    async with async_http_client(timeout=timeout_s, headers=headers or {}) as http:
        for url in urls:
            log.warning("re-syncing inference server %s to weight version %s from %s", url, version, path)
            r = await http.post(url + "/update_weights_from_disk", json={"model_path": str(path), "weight_version": str(version)})
            now = await server_weight_version(http, url)
            if r.status_code != 200 or not r.json().get("success", False) or now != str(version):
                raise InferenceError(f"re-syncing weights on {url} failed ({r.status_code}: {r.text[:300]}; serving {now})",
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
