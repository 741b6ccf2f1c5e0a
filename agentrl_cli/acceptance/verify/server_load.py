"""How loaded the inference servers were during a loop: busy fraction (seconds inside a batch, from
`/server_info`'s `busy_seconds_total`, over wall time) and the mean waiting-queue length (SGLang's
`sglang:num_queue_reqs` gauge on `/metrics`, sampled twice a second). Figures a server does not
expose stay None.
"""

from __future__ import annotations

import re
import statistics
import threading
import time

import httpx

from agentrl_cli.core.httpclient import http_client

QUEUE_RE = re.compile(r"^sglang:num_queue_reqs(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


def _busy_seconds(client: httpx.Client, url: str) -> float | None:
    try:
        states = client.get(url + "/server_info").json().get("internal_states") or [{}]
        value = states[0].get("busy_seconds_total")
        return float(value) if value is not None else None
    except (httpx.HTTPError, ValueError, AttributeError, IndexError):
        return None


def _queue(client: httpx.Client, url: str) -> float | None:
    try:
        m = QUEUE_RE.search(client.get(url + "/metrics").text)
        return float(m.group(1)) if m else None
    except httpx.HTTPError:
        return None


class ServerLoad:
    """`start(urls)`, run the loop, `stop()` -> {"server_busy_fraction", "inference_queue_len_mean"}."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._queue: list[float] = []
        self._thread: threading.Thread | None = None

    def start(self, urls: list[str]) -> "ServerLoad":
        self.urls = [u.rstrip("/") for u in urls]
        self._client = http_client(timeout=2.0)
        self._t0 = time.monotonic()
        self._busy0 = [_busy_seconds(self._client, u) for u in self.urls]
        self._thread = threading.Thread(target=self._poll, daemon=True, name="server-load")
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            values = [q for q in (_queue(self._client, u) for u in self.urls) if q is not None]
            if values:
                self._queue.append(sum(values))

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        wall = time.monotonic() - self._t0
        fractions = []
        for u, b0 in zip(self.urls, self._busy0):
            b1 = _busy_seconds(self._client, u)
            if b0 is not None and b1 is not None and wall > 0:
                fractions.append(min(1.0, (b1 - b0) / wall))
        self._client.close()
        return {"server_busy_fraction": statistics.fmean(fractions) if fractions else None,
                "inference_queue_len_mean": statistics.fmean(self._queue) if self._queue else None}
