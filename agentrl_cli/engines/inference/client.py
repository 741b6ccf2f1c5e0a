"""The async inference client the rollout uses. Its engine (`InferenceEngine`, engines/engine.py;
SGLang's native HTTP API when none is given, which SGLang servers, the SGLang router and the embedded
server all speak) supplies the routes, request bodies and answer parsing; the client adds what every
engine needs alike: retries, rotation, deadlines and LoRA adapter bookkeeping.

Token ids in, token ids + log-probs + finish reason + weight version out. Connection errors and
5xx answers are retried with exponential backoff, on another server when there are several;
every request has a deadline. Without a router, requests are spread round-robin or to the server
with the fewest requests in flight (`least_loaded`). With one (`router`: SGLang's or vLLM's, in
front of `urls`), every generation request goes to the router, which spreads them, while weight
updates, pauses, version and health checks still go to each of `urls`: a router forwards requests,
not weight updates.

Rotation: `remove_url` / `add_url` change the servers requests go to while requests are in flight
(the run's supervisor takes a dead server out at once and puts it back once it serves the run's
weights; `agentrl run servers add|remove`). Requests already sent to a removed server finish there or
fail over as any failure does. With no server in rotation a request fails as unreachable, and the
rollout waits for one to come back (`engines/resume.py`). A server added with `serve=False` is held:
it is one of `urls` (weight updates reach it) but gets no requests until `add_url` releases it.
`answered` counts each server's answered /generate requests.

LoRA: `load_lora_adapter` / `unload_lora_adapter` on every server, and the policy's adapter
(`PolicyAdapter`): once weight sync names one, every /generate carries it as `lora_path`. Clients
built by `client_from_config` for the same servers share one `PolicyAdapter` in this process, so the
rollout's client and the agent gateway's follow the adapter the run's weight sync publishes.

Transport: aiohttp, one session per event loop (made on first use), keep-alive connections
closed after 4 s idle, before the servers' 5 s (uvicorn's default) can close them under a request.
httpx costs several times more client CPU per request; with 64 episodes answering at once
that delayed the server's batch by 100-300 ms (measured for benchmarks/inference.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import AsyncIterator

import aiohttp

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.security.keys import client_key
from agentrl_cli.engines.engine import answer_ok, disk_update_calls, distributed_update_calls, pause_call
from agentrl_cli.engines.generation import Generation, SamplingParams
from agentrl_cli.engines.inference.awaiting import Stream
from agentrl_cli.engines.sglang_dialect import ADAPTER_NOT_LOADED, parse_generation

RETRYABLE_STATUS = {500, 502, 503, 504}
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)  # refused, reset, timed out
KEEPALIVE_S = 4.0
__all__ = ["ADAPTER_NOT_LOADED", "Generation", "InferenceClient", "InferenceError", "InferenceUnreachable", "LoraRefused",
           "PolicyAdapter", "SamplingParams", "client_from_config", "parse_generation"]


@dataclass
class Reply:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


class InferenceError(AgentrlError):
    """A request failed for good (after retries, or with a 4xx that retrying cannot fix)."""

    exit_code = 1


class InferenceUnreachable(InferenceError):
    """Every attempt failed on the way (connection refused or reset, timeout, 5xx): the request may
    succeed once a server is back (`engines/resume.py` waits for that and resumes)."""


class LoraRefused(InferenceError):
    """A server answered a LoRA load or unload with success false; `answers` holds every server's
    answer (url -> {"success", "error_message", "loaded_adapters"})."""

    def __init__(self, message: str, hint: str, answers: dict[str, dict]) -> None:
        super().__init__(message, hint)
        self.answers = answers


@dataclass
class PolicyAdapter:
    """The LoRA adapter the servers serve the policy with: its name on the servers (sent as
    `lora_path`), or None for the servers' base weights."""

    name: str | None = None


class InferenceClient:
    def __init__(self, urls: list[str] | str, api_key: str | None = None, timeout_s: float = 120.0, max_retries: int = 3,
                 backoff_s: float = 0.2, policy: str = "round_robin", max_connections: int = 512,
                 adapter: PolicyAdapter | None = None, engine=None, router: str | None = None) -> None:
        if engine is None:  # SGLang's protocol, which the SGLang router and the embedded server speak too
            from agentrl_cli.engines.registry import engine_named

            engine = engine_named("sglang")
        self.engine = engine  # routes, request bodies, answer parsing (engines/engine.py)
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("InferenceClient needs at least one server URL")
        if policy not in ("round_robin", "least_loaded"):
            raise ValueError(f"unknown policy {policy!r}; use round_robin or least_loaded")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._session_loop = None
        self.timeout_s, self.max_retries, self.backoff_s, self.policy = timeout_s, max_retries, backoff_s, policy
        self._next = 0  # round-robin position
        self.router = router.rstrip("/") if router else None  # generation goes here when set; the rest to `urls`
        self.in_flight = {u: 0 for u in self.urls}
        self.answered: Counter = Counter()  # url -> /generate requests it answered
        self.held: frozenset[str] = frozenset()  # in `urls` for weight updates, but sent no requests yet
        self.stats = {"requests": 0, "retries": 0, "failures": 0}
        self.watchdog = None  # optional observe.watchdog.Watchdog: per-server progress ("inference URL")
        self.adapter = adapter if adapter is not None else PolicyAdapter()

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request carries (the bearer token when the servers require one)."""
        return dict(self._headers)

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=KEEPALIVE_S)
            self._session, self._session_loop = aiohttp.ClientSession(connector=connector, headers=self._headers), loop
        return self._session

    async def _send(self, method: str, url: str, body: dict | None = None, timeout_s: float | None = None,
                    query: dict | None = None) -> Reply:
        """One HTTP exchange; raises one of TRANSPORT_ERRORS when no answer came back in time."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        async with self._http().request(method, url, json=body, params=query, timeout=timeout) as r:
            return Reply(r.status, await r.read())

    # ---- rotation -------------------------------------------------------------------------------
    # `urls` is replaced, never changed in place: another thread (the agent gateway's) may be reading it

    def remove_url(self, url: str) -> bool:
        """Send no new requests to `url`; False when it was not in rotation."""
        url = url.rstrip("/")
        if url not in self.urls:
            return False
        self.urls = [u for u in self.urls if u != url]
        self.held = self.held - {url}
        return True

    def add_url(self, url: str, *, serve: bool = True) -> bool:
        """Send requests to `url` too (`serve=False`: hold it, a member for weight updates only);
        False when nothing changed."""
        url = url.rstrip("/")
        if url in self.urls:
            if serve and url in self.held:
                self.held = self.held - {url}
                return True
            return False
        self.in_flight.setdefault(url, 0)
        if not serve:
            self.held = self.held | {url}
        self.urls = [*self.urls, url]
        return True

    def _pick(self, exclude: set[str]) -> str | None:
        held = self.held
        urls = [u for u in self.urls if u not in held]
        candidates = [u for u in urls if u not in exclude] or urls
        if not candidates:
            return None
        if self.router is not None:  # the router spreads requests over the servers in rotation
            return self.router
        if self.policy == "least_loaded":
            return min(candidates, key=lambda u: self.in_flight.get(u, 0))
        for _ in range(len(urls)):
            u = urls[self._next % len(urls)]
            self._next += 1
            if u in candidates:
                return u
        return candidates[0]

    async def generate(self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None) -> Generation:
        body = self.engine.generate_body(input_ids, sampling, rid, self.adapter.name)
        data, server, latency, retries = await self._post_with_retries(self.engine.routes.generate, body)
        return self.engine.parse_generation(data, latency, server, retries)

    @property
    def streams(self) -> bool:
        """Whether `generate_stream` works: the engine's generate route streams (`Capabilities.generate_stream`)."""
        capabilities = getattr(self.engine, "capabilities", None)
        return bool(getattr(capabilities, "generate_stream", False))

    async def generate_stream(self, input_ids: list[int], sampling: SamplingParams,
                              rid: str) -> AsyncIterator[tuple[list[int], list[float], str, Generation | None]]:
        """One generation streamed (SGLang's `/generate` with `stream: true`): awaiting it sends the
        request and waits for the answer's headers, on another server when one fails or answers 5xx
        (InferenceError for a refusal, InferenceUnreachable when none answers); the iterator yields
        (new ids, their log-probs, weight version, None) as they arrive, then ([], [], weight version,
        the whole Generation). Closing it early closes the connection and asks the server to abort
        `rid` (`/abort_request`). Servers may send ids cumulatively (SGLang's default) or
        incrementally (`--incremental-streaming-output`, the embedded server); both are read."""
        if not self.streams:
            title = getattr(self.engine, "title", "this engine")
            raise InferenceError(f"streamed generation needs SGLang's /generate stream; {title}'s protocol has none "
                                 "here, so its client generates whole turns", "send stream=false")
        body = {**self.engine.generate_body(input_ids, sampling, rid, self.adapter.name), "stream": True}
        self.stats["requests"] += 1
        tried: set[str] = set()
        last = ""
        for attempt in range(self.max_retries + 1):
            server = self._pick(tried)
            if server is None:
                last = "no inference server in rotation (all are down or were removed)"
                break
            tried.add(server)
            try:
                response = await self._http().post(server + self.engine.routes.generate, json=body,
                                                   timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s))
            except TRANSPORT_ERRORS as exc:
                last = f"{server}: {type(exc).__name__}: {exc}"
                continue
            if response.status < 400:
                self.in_flight[server] = self.in_flight.get(server, 0) + 1
                return Stream(self._stream(server, response, rid, time.perf_counter(), attempt),
                              lambda: self._stream_closed(server, response, rid))
            text = (await response.read()).decode("utf-8", "replace")
            response.release()
            last = f"{server}: HTTP {response.status}: {text[:300]}"
            if response.status not in RETRYABLE_STATUS:
                self.stats["failures"] += 1
                raise InferenceError(f"inference request rejected: {last}", "fix the request (see the message)")
        self.stats["failures"] += 1
        raise InferenceUnreachable(f"streamed inference request failed on every server tried: {last}",
                                   "check that the inference servers are up (`agentrl stage run 4`)")

    async def _stream(self, server: str, response, rid: str, t0: float, retries: int):
        ids: list[int] = []
        logprobs: list[float] = []
        finished = False
        try:
            async for data in _sse_data(response):
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise InferenceError(f"{server}: the generation failed mid-stream: {chunk['error']}",
                                         "see the inference server's log")
                meta = chunk.get("meta_info") or {}
                new, new_lp = _new_tokens(chunk, len(ids))
                ids += new
                logprobs += new_lp
                version = str(meta.get("weight_version", "default"))
                if meta.get("finish_reason") is None:
                    yield new, new_lp, version, None
                    continue
                finished = True
                self.answered[server] += 1
                whole = {**chunk, "output_ids": ids,
                         "meta_info": {**meta, "output_token_logprobs": [[lp, t] for lp, t in zip(logprobs, ids)]}}
                yield new, new_lp, version, self.engine.parse_generation(whole, time.perf_counter() - t0, server, retries)
                return
            if not finished:
                raise InferenceUnreachable(f"{server}: the stream ended before the generation finished",
                                           "check the inference server's log")
        except TRANSPORT_ERRORS as exc:
            raise InferenceUnreachable(f"{server}: the stream broke: {type(exc).__name__}: {exc}",
                                       "check that the inference server is up") from None
        finally:
            if not finished:  # the reader went away (or the stream broke): the server need not go on
                await self._stream_closed(server, response, rid)
            else:
                self.in_flight[server] -= 1
                response.close()

    async def _stream_closed(self, server: str, response, rid: str) -> None:
        """A stream closed before its end: release the connection, ask the server to abort `rid`."""
        self.in_flight[server] -= 1
        response.close()
        try:
            await self._send("POST", server + "/abort_request", {"rid": rid}, timeout_s=5.0)
        except TRANSPORT_ERRORS:
            pass

    async def _post_with_retries(self, path: str, body: dict) -> tuple[dict, str, float, int]:
        self.stats["requests"] += 1
        tried: set[str] = set()
        last = ""
        for attempt in range(self.max_retries + 1):
            server = self._pick(tried)
            if server is None:
                last = "no inference server in rotation (all are down or were removed)"
                if attempt < self.max_retries:
                    self.stats["retries"] += 1
                    await asyncio.sleep(self.backoff_s * (2 ** attempt))
                continue
            self.in_flight[server] = self.in_flight.get(server, 0) + 1
            t0 = time.perf_counter()
            answered = False
            if self.watchdog is not None:
                self.watchdog.begin(f"inference {server}")
            try:
                r = await self._send("POST", server + path, body)
            except TRANSPORT_ERRORS as exc:  # connection refused/reset, timeouts
                last = f"{server}: {type(exc).__name__}: {exc}"
            else:
                missing = self.engine.adapter_missing(r.status_code, r.text)
                answered = r.status_code not in RETRYABLE_STATUS
                if r.status_code < 400:
                    self.answered[server] += 1
                    return r.json(), server, time.perf_counter() - t0, attempt
                last = f"{server}: HTTP {r.status_code}: {r.text[:300]}"
                if r.status_code not in RETRYABLE_STATUS and not missing:
                    self.stats["failures"] += 1
                    raise InferenceError(f"inference request rejected: {last}", "fix the request (see the message)")
            finally:
                self.in_flight[server] -= 1
                if self.watchdog is not None:
                    self.watchdog.end(f"inference {server}", ok=answered)
            tried.add(server)
            if attempt < self.max_retries:
                self.stats["retries"] += 1
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        self.stats["failures"] += 1
        raise InferenceUnreachable(f"inference request failed after {self.max_retries + 1} attempts: {last}",
                                   "check that the inference servers are up (`agentrl stage run 4`)")

    async def _post_everywhere(self, path: str, bodies: dict[str, dict], what: str, hint: str,
                               timeout_s: float | None = None, query: dict | None = None) -> None:
        """POST `bodies[url]` to each of those servers at once; raise InferenceError naming those that failed."""
        async def one(url: str) -> str | None:
            try:
                r = await self._send("POST", url + path, bodies[url], timeout_s, query)
            except TRANSPORT_ERRORS as exc:
                return f"{url}: {type(exc).__name__}: {exc}"
            try:
                answer = r.json()
            except ValueError:
                answer = None
            return None if answer_ok(self.engine, r.status_code, answer) else f"{url}: HTTP {r.status_code}: {r.text[:300]}"

        errors = [e for e in await asyncio.gather(*(one(u) for u in bodies)) if e]
        if errors:
            raise InferenceError(f"{what} failed on " + "; ".join(errors), hint)

    async def _lora_call(self, path: str, body: dict, urls: list[str] | None, what: str) -> dict[str, dict]:
        """POST `body` to each server (all by default) at once: url -> its answer. A server not
        answering raises InferenceUnreachable; one answering success false, LoraRefused."""
        async def one(url: str) -> tuple[str, dict]:
            try:
                r = await self._send("POST", url + path, body)
            except TRANSPORT_ERRORS as exc:
                raise InferenceUnreachable(f"{what} on {url}: {type(exc).__name__}: {exc}",
                                           "check that the inference server is up") from exc
            try:
                answer = r.json()
            except ValueError:
                answer = None
            if not isinstance(answer, dict) or "success" not in answer:  # vLLM answers a sentence
                ok = answer_ok(self.engine, r.status_code, answer)
                if not ok and r.status_code in RETRYABLE_STATUS:
                    raise InferenceUnreachable(f"{what} on {url}: HTTP {r.status_code}: {r.text[:300]}",
                                               "check the server log")
                answer = {"success": ok, "error_message": "" if ok else f"HTTP {r.status_code}: {r.text[:300]}",
                          "message": answer}
            return url, answer

        answers = dict(await asyncio.gather(*(one(u) for u in (urls or self.urls))))
        refused = {u: a for u, a in answers.items() if not a.get("success")}
        if refused:
            raise LoraRefused(f"{what} refused on " + "; ".join(f"{u}: {a.get('error_message') or a}"
                                                                 for u, a in refused.items()),
                              "see the message; the servers must be started for adapters that size (SGLang: "
                              "--enable-lora with a --max-lora-rank and --lora-target-modules that cover the adapter, "
                              "which training.lora sets)", answers)
        return answers

    async def load_lora_adapter(self, name: str, path: str, *, urls: list[str] | None = None) -> dict[str, dict]:
        """Every server (or `urls`) loads the adapter directory `path` as `name`; returns each one's
        answer ({"success", "error_message", "loaded_adapters"}). Raises LoraRefused when a server
        refuses it (the others may have loaded it), InferenceUnreachable when one does not answer."""
        return await self._lora_call(self.engine.routes.load_lora_adapter, self.engine.adapter_load_body(name, path), urls,
                                     f"loading LoRA adapter {name!r} from {path}")

    async def unload_lora_adapter(self, name: str, *, urls: list[str] | None = None) -> dict[str, dict]:
        """Every server (or `urls`) unloads the adapter `name`; as `load_lora_adapter` for failures."""
        return await self._lora_call(self.engine.routes.unload_lora_adapter, self.engine.adapter_unload_body(name), urls,
                                     f"unloading LoRA adapter {name!r}")

    def use_adapter(self, name: str | None) -> None:
        """Send `lora_path: name` with every /generate from now on (None: the base weights)."""
        self.adapter.name = name

    async def update_weight_version(self, version: str, *, urls: list[str] | None = None,
                                    abort_all_requests: bool = False) -> None:
        """Relabel the weights every server (or `urls`) serves as `version`, loading nothing."""
        body = self.engine.version_update_body(version, abort_all_requests)
        await self._post_everywhere(self.engine.routes.update_weight_version, dict.fromkeys(urls or self.urls, body),
                                    "update_weight_version", "see the server log")

    async def update_weights_from_disk(self, path: str, weight_version: str, abort_all_requests: bool = False) -> None:
        """Load new weights on every server; raise InferenceError naming the servers that failed."""
        await self._run_calls(disk_update_calls(self.engine, path, weight_version, abort_all_requests), self.urls,
                              "weight update", "check the checkpoint path and the server logs")

    async def _run_calls(self, calls, urls: list[str], what: str, hint: str, timeout_s: float | None = None) -> None:
        """Each of `calls` (engines/engine.py WireCall) on every one of `urls` at once, in order; after
        a failure only the calls marked `always` (a resume) are still sent, then the first failure is raised."""
        failure: InferenceError | None = None
        for call in calls:
            if failure is not None and not call.always:
                continue
            try:
                await self._post_everywhere(call.route, dict.fromkeys(urls, call.body), f"{what} ({call.what})",
                                            hint, timeout_s, call.query)
            except InferenceError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    async def init_weights_update_group(self, master_address: str, master_port: int, world_size: int, *,
                                        group_name: str = "weight_update_group", backend: str = "gloo",
                                        ranks_per_server: int = 1, timeout_s: float | None = None) -> None:
        """Every server joins the trainer's weight-update group: server i takes ranks from
        rank_offset = 1 + i * ranks_per_server (the trainer is rank 0). Each call returns only when the
        whole group has met, so the trainer must join it concurrently (see weightsync/distributed.py)."""
        bodies = {url: self.engine.group_init_body(master_address, master_port, 1 + i * ranks_per_server, world_size,
                                                   group_name, backend) for i, url in enumerate(self.urls)}
        await self._post_everywhere(self.engine.routes.init_weights_update_group, bodies, "init_weights_update_group",
                                    "give every server's own URL (not a router's), a world size of 1 + servers x ranks "
                                    "per server, and a backend both sides have (gloo on CPU)", timeout_s)

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              weight_version: str | None, *, group_name: str = "weight_update_group",
                                              load_format: str | None = None, abort_all_requests: bool = False,
                                              flush_cache: bool = False, timeout_s: float | None = None) -> None:
        """Every server receives the tensors the trainer broadcasts (concurrently with this call) and
        loads them; raise InferenceError naming the servers that failed."""
        calls = distributed_update_calls(self.engine, names, dtypes, shapes, weight_version, group_name=group_name,
                                         load_format=load_format, abort_all_requests=abort_all_requests,
                                         flush_cache=flush_cache)
        await self._run_calls(calls, self.urls, "update_weights_from_distributed",
                              "check the parameter names against the served model and the server logs", timeout_s)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        await self._post_everywhere(self.engine.routes.destroy_weights_update_group,
                                    dict.fromkeys(self.urls, self.engine.group_destroy_body(group_name)),
                                    "destroy_weights_update_group", "see the server logs")

    async def get_weights_by_name(self, name: str, truncate_size: int = 100) -> dict[str, list]:
        """Every server's first `truncate_size` rows of parameter `name` (weight-sync verification)."""
        async def one(url: str):
            try:
                r = await self._send("POST", url + self.engine.routes.get_weights_by_name,
                                     self.engine.weights_by_name_body(name, truncate_size))
            except TRANSPORT_ERRORS as exc:
                raise InferenceUnreachable(f"{url}: get_weights_by_name({name!r}): {type(exc).__name__}: {exc}",
                                           "check that the inference server is up") from exc
            if r.status_code != 200:
                raise InferenceError(f"{url}: get_weights_by_name({name!r}) failed: {r.text[:200]}",
                                     "use a parameter name from the model's state dict")
            return url, r.json()
        return dict(await asyncio.gather(*(one(u) for u in self.urls)))

    async def pause_generation(self, mode: str = "abort", *, urls: list[str] | None = None) -> None:
        """Hold generation on every server (or `urls`): "abort" hands back the requests in flight,
        "retract" queues them again, "in_place" keeps them mid-batch (the engine's `pause_modes`)."""
        modes = self.engine.capabilities.pause_modes
        if mode not in modes:
            raise InferenceError(f"pause mode {mode!r} is not one the {self.engine.title} engine takes",
                                 f"use one of {', '.join(modes) or '(none: it cannot pause)'}")
        call = pause_call(self.engine, mode)
        await self._send_everywhere(call.route, dict.fromkeys(urls or self.urls, call.body), "pause_generation", call.query)

    async def continue_generation(self, *, urls: list[str] | None = None) -> None:
        """Generate again on every server (or `urls`) after `pause_generation`."""
        await self._send_everywhere(self.engine.routes.resume, dict.fromkeys(urls or self.urls, {}), "continue_generation")

    async def _send_everywhere(self, path: str, bodies: dict[str, dict], what: str, query: dict | None = None) -> None:
        """POST to each server at once; raise InferenceError naming those that did not answer 200."""
        async def one(url: str) -> str | None:
            try:
                r = await self._send("POST", url + path, bodies[url], query=query)
            except TRANSPORT_ERRORS as exc:
                return f"{url}: {type(exc).__name__}: {exc}"
            return None if r.status_code == 200 else f"{url}: HTTP {r.status_code}: {r.text[:300]}"

        errors = [e for e in await asyncio.gather(*(one(u) for u in bodies)) if e]
        if errors:
            raise InferenceError(f"{what} failed on " + "; ".join(errors), "see the server log")

    async def health(self) -> bool:
        """True when every server in rotation answers /health with 200 (False with none in rotation)."""
        async def one(url: str) -> bool:
            try:
                return (await self._send("GET", url + self.engine.routes.health, timeout_s=5)).status_code == 200
            except TRANSPORT_ERRORS:
                return False
        urls = self.urls
        return bool(urls) and all(await asyncio.gather(*(one(u) for u in urls)))

    async def healthy_urls(self, timeout_s: float = 5.0) -> list[str]:
        """The servers answering /health with 200 within `timeout_s` (the resume path polls this)."""
        async def one(url: str) -> bool:
            try:
                return (await self._send("GET", url + self.engine.routes.health, timeout_s=timeout_s)).status_code == 200
            except TRANSPORT_ERRORS:
                return False
        urls = self.urls
        return [u for u, ok in zip(urls, await asyncio.gather(*(one(u) for u in urls))) if ok]

    async def wait_healthy(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if await self.health():
                return
            await asyncio.sleep(0.1)
        raise InferenceError(f"inference servers not healthy within {deadline_s:.0f} s: {', '.join(self.urls)}",
                             "see the server log in the run directory; raise inference.startup_timeout_s for big models")

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


# The SGLang router's policies that spread load by the servers' queues map to the client's least_loaded;
# the rest (round_robin, random, cache_aware) to round_robin, the client's only other policy.
CLIENT_POLICY = {"least_loaded": "least_loaded", "power_of_two": "least_loaded"}


_POLICY_ADAPTERS: dict[tuple[str, ...], PolicyAdapter] = {}


async def _sse_data(response) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent-event stream, read in whatever pieces arrive (an event
    of SGLang's cumulative stream outgrows any line limit as the generation grows)."""
    buffer = b""
    async for piece in response.content.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if line.startswith(b"data:"):
                    yield line[5:].strip()


def _new_tokens(chunk: dict, have: int) -> tuple[list[int], list[float]]:
    """The ids (and log-probs) a `/generate` stream chunk adds to the `have` already read: its
    `output_ids` are all so far (SGLang's default) when they number `completion_tokens`, else the new ones."""
    meta = chunk.get("meta_info") or {}
    ids = list(chunk.get("output_ids") or [])
    pairs = meta.get("output_token_logprobs") or []
    total = meta.get("completion_tokens")
    cumulative = total is not None and len(ids) == total and have > 0
    new = ids[have:] if cumulative else ids
    pairs = pairs[len(pairs) - len(new):] if len(pairs) >= len(new) else []
    lps = [float(p[0]) if p[0] is not None else float("nan") for p in pairs] or [float("nan")] * len(new)
    return new, lps


def policy_adapter(urls: list[str]) -> PolicyAdapter:
    """The one PolicyAdapter of this process for the servers at `urls`."""
    key = tuple(sorted(u.rstrip("/") for u in urls))
    return _POLICY_ADAPTERS.setdefault(key, PolicyAdapter())


def client_from_config(config, urls: list[str], router: str | None = None) -> InferenceClient:
    """The client a run uses: `inference.engine` (its routes and wire), `inference.api_key`,
    `request_timeout_s`, `max_retries` and, over several servers with no router in front,
    `router_policy`; the servers' shared PolicyAdapter. `router`: the router the run started in
    front of `urls`, else `inference.router_url` (when set, `urls` are the servers behind it)."""
    from agentrl_cli.engines.registry import engine_for

    inf = config.inference
    return InferenceClient(urls, api_key=client_key(inf.api_key),
                           timeout_s=inf.request_timeout_s, max_retries=inf.max_retries,
                           policy=CLIENT_POLICY.get(inf.router_policy, "round_robin"), adapter=policy_adapter(urls),
                           engine=engine_for(config), router=router or inf.router_url or None)
