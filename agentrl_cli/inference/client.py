"""The async inference client the rollout uses (DESIGN §3). It speaks SGLang's native HTTP API, so
the same code drives SGLang servers, the SGLang router and the embedded server.

Token ids in, token ids + log-probs + finish reason + weight version out. Connection errors and
5xx answers are retried with exponential backoff, on another server when there are several;
every request has a deadline. Without a router, requests are spread round-robin or to the server
with the fewest requests in flight (`least_loaded`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import httpx

from agentrl_cli.errors import AgentrlError

RETRYABLE_STATUS = {500, 502, 503, 504}


class InferenceError(AgentrlError):
    """A request failed for good (after retries, or with a 4xx that retrying cannot fix)."""

    exit_code = 1


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None  # sent as SGLang's sampling_seed
    ignore_eos: bool = False

    def to_sglang(self) -> dict:
        d = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
             "top_k": self.top_k, "no_stop_trim": True, "skip_special_tokens": False}
        if self.stop:
            d["stop"] = self.stop
        if self.stop_token_ids:
            d["stop_token_ids"] = self.stop_token_ids
        if self.seed is not None:
            d["sampling_seed"] = self.seed
        if self.ignore_eos:
            d["ignore_eos"] = True
        return d


@dataclass
class Generation:
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: str
    latency: float
    text: str = ""
    prompt_tokens: int = 0
    server: str = ""
    retries: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def parse_generation(data: dict, latency: float, server: str, retries: int) -> Generation:
    meta = data.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = data.get("output_ids") or [p[1] for p in pairs]
    logprobs = [float(p[0]) if p[0] is not None else float("nan") for p in pairs]
    reason = (meta.get("finish_reason") or {}).get("type", "stop") if isinstance(meta.get("finish_reason"), dict) else "stop"
    return Generation(output_ids=list(ids), output_logprobs=logprobs, finish_reason=reason,
                      weight_version=str(meta.get("weight_version", "default")), latency=latency, text=data.get("text", ""),
                      prompt_tokens=int(meta.get("prompt_tokens", 0) or 0), server=server, retries=retries, meta=meta)


class InferenceClient:
    def __init__(self, urls: list[str] | str, api_key: str | None = None, timeout_s: float = 120.0, max_retries: int = 3,
                 backoff_s: float = 0.2, policy: str = "round_robin", max_connections: int = 512) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("InferenceClient needs at least one server URL")
        if policy not in ("round_robin", "least_loaded"):
            raise ValueError(f"unknown policy {policy!r}; use round_robin or least_loaded")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                       limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
        self.timeout_s, self.max_retries, self.backoff_s, self.policy = timeout_s, max_retries, backoff_s, policy
        self._rr = itertools.cycle(range(len(self.urls)))
        self.in_flight = {u: 0 for u in self.urls}
        self.stats = {"requests": 0, "retries": 0, "failures": 0}

    def _pick(self, exclude: set[str]) -> str:
        candidates = [u for u in self.urls if u not in exclude] or self.urls
        if self.policy == "least_loaded":
            return min(candidates, key=lambda u: self.in_flight[u])
        for _ in range(len(self.urls)):
            u = self.urls[next(self._rr)]
            if u in candidates:
                return u
        return candidates[0]

    async def generate(self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None) -> Generation:
        body = {"input_ids": list(input_ids), "sampling_params": sampling.to_sglang(), "return_logprob": True}
        if rid:
            body["rid"] = rid
        data, server, latency, retries = await self._post_with_retries("/generate", body)
        return parse_generation(data, latency, server, retries)

    async def _post_with_retries(self, path: str, body: dict) -> tuple[dict, str, float, int]:
        self.stats["requests"] += 1
        tried: set[str] = set()
        last = ""
        for attempt in range(self.max_retries + 1):
            server = self._pick(tried)
            self.in_flight[server] += 1
            t0 = time.perf_counter()
            try:
                r = await self._http.post(server + path, json=body)
            except httpx.TransportError as exc:  # connection refused/reset, timeouts
                last = f"{server}: {type(exc).__name__}: {exc}"
            else:
                if r.status_code < 400:
                    return r.json(), server, time.perf_counter() - t0, attempt
                last = f"{server}: HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code not in RETRYABLE_STATUS:
                    self.stats["failures"] += 1
                    raise InferenceError(f"inference request rejected: {last}", "fix the request (see the message)")
            finally:
                self.in_flight[server] -= 1
            tried.add(server)
            if attempt < self.max_retries:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        self.stats["failures"] += 1
        raise InferenceError(f"inference request failed after {self.max_retries + 1} attempts: {last}",
                             "check that the inference servers are up (`agentrl stage run 4`)")

    async def update_weights_from_disk(self, path: str, weight_version: str, abort_all_requests: bool = False) -> None:
        """Load new weights on every server; raise InferenceError naming the servers that failed."""
        body = {"model_path": str(path), "weight_version": str(weight_version), "abort_all_requests": abort_all_requests}

        async def one(url: str) -> str | None:
            try:
                r = await self._http.post(url + "/update_weights_from_disk", json=body)
            except httpx.TransportError as exc:
                return f"{url}: {exc}"
            ok = r.status_code == 200 and r.json().get("success", False)
            return None if ok else f"{url}: {r.text[:300]}"

        errors = [e for e in await asyncio.gather(*(one(u) for u in self.urls)) if e]
        if errors:
            raise InferenceError("weight update failed on " + "; ".join(errors), "check the checkpoint path and the server logs")

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> dict[str, list]:
        """Every server's first `truncate_size` rows of parameter `name` (weight-sync verification)."""
        async def one(url: str):
            r = await self._http.post(url + "/get_weights_by_name", json={"name": name, "truncate_size": truncate_size})
            if r.status_code != 200:
                raise InferenceError(f"{url}: get_weights_by_name({name!r}) failed: {r.text[:200]}",
                                     "use a parameter name from the model's state dict")
            return url, r.json()
        return dict(await asyncio.gather(*(one(u) for u in self.urls)))

    async def health(self) -> bool:
        """True when every server answers /health with 200."""
        async def one(url: str) -> bool:
            try:
                return (await self._http.get(url + "/health", timeout=5)).status_code == 200
            except httpx.TransportError:
                return False
        return all(await asyncio.gather(*(one(u) for u in self.urls)))

    async def wait_healthy(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if await self.health():
                return
            await asyncio.sleep(0.1)
        raise InferenceError(f"inference servers not healthy within {deadline_s:.0f} s: {', '.join(self.urls)}",
                             "see the server log in the run directory; raise inference.startup_timeout_s for big models")

    async def close(self) -> None:
        await self._http.aclose()
