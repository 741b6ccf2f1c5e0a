"""How loaded the inference servers were during a loop: busy fraction (seconds inside a batch, from
the engine's server-info route, over wall time) and the mean waiting-queue length (the engine's queue
gauge on its metrics route, sampled twice a second; SGLang's `sglang:num_queue_reqs` on `/metrics`).
Routes and names are the engine's (`InferenceEngine.metrics`). Figures a server does not expose stay None.
With `mark()` after each step, the servers' phase counters (`acceptance/phases.py` SERVER_COUNTERS:
prefill and decode seconds and tokens, decode steps and rows, busy seconds; the embedded engine
reports them) grow by `steps`: one (wall seconds, summed growth or None) per mark.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from agentrl_cli.acceptance.phases import server_counters, server_delta
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.engines.registry import engine_named


def _busy_seconds(engine, client: httpx.Client, url: str) -> float | None:
    try:
        return engine.busy_seconds(client.get(url + engine.routes.server_info).json())
    except (httpx.HTTPError, ValueError, AttributeError, IndexError, TypeError):
        return None


def _counters(engine, client: httpx.Client, url: str) -> dict | None:
    try:
        return server_counters(client.get(url + engine.routes.server_info).json())
    except (httpx.HTTPError, ValueError):
        return None


def _queue(engine, client: httpx.Client, url: str) -> float | None:
    try:
        return engine.queue_length(client.get(url + engine.routes.metrics).text)
    except httpx.HTTPError:
        return None


class ServerLoad:
    """`start(urls)`, run the loop, `stop()` -> {"server_busy_fraction", "inference_queue_len_mean"}.
    `engine`: the servers' (the run client's `engine`); SGLang's protocol when None."""

    def __init__(self, interval_s: float = 0.5, engine=None) -> None:
        self.engine = engine if engine is not None else engine_named("sglang")
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._queue: list[float] = []
        self._thread: threading.Thread | None = None

    def start(self, urls: list[str]) -> "ServerLoad":
        self.urls = [u.rstrip("/") for u in urls]
        self._client = http_client(timeout=2.0)
        self._t0 = time.monotonic()
        self._busy0 = [_busy_seconds(self.engine, self._client, u) for u in self.urls]
        self._last = (time.monotonic(), [_counters(self.engine, self._client, u) for u in self.urls])
        self.steps: list[tuple[float, dict | None]] = []
        self._thread = threading.Thread(target=self._poll, daemon=True, name="server-load")
        self._thread.start()
        return self

    def mark(self) -> None:
        """The servers' counter growth since the last mark (or the start), as one more of `steps`."""
        now = (time.monotonic(), [_counters(self.engine, self._client, u) for u in self.urls])
        self.steps.append((now[0] - self._last[0], server_delta(self._last[1], now[1])))
        self._last = now

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            values = [q for q in (_queue(self.engine, self._client, u) for u in self.urls) if q is not None]
            if values:
                self._queue.append(sum(values))

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        wall = time.monotonic() - self._t0
        fractions = []
        for u, b0 in zip(self.urls, self._busy0):
            b1 = _busy_seconds(self.engine, self._client, u)
            if b0 is not None and b1 is not None and wall > 0:
                fractions.append(min(1.0, (b1 - b0) / wall))
        self._client.close()
        return {"server_busy_fraction": statistics.fmean(fractions) if fractions else None,
                "inference_queue_len_mean": statistics.fmean(self._queue) if self._queue else None}
