"""When and to whom a run's weights go, through any `WeightTransport`.

- `sync(backend, version)`: prepare, publish, verify; the history row. Raises on failure.
- `sync_retrying(...)`: the run's blocking sync; a failure (a server restarting mid-sync) waits for
  the servers (`rollout.resume_deadline_s`) and tries once more.
- `start(backend, version)` / `wait()`: async mode's overlap. The weights are read off the trainer
  now; the servers load and verify them while the trainer steps on. A publish that failed makes
  the next step sync in full.
- `before_step(backend, version)`: a server that serves another version than the last published
  (it restarted with its launch weights) gets the current weights again (`transport.resend`, else a
  full sync) before generating resumes; also the rollout's `on_recovered` hook (`resync_servers`).
- `bring_up(url, join)`: one server outside the rotation (restarted by the run's supervisor, or
  joining with `agentrl run servers add`) gets the current weights alone, is verified (its weight
  version, and the sampled tensors read back when the transport replaced the full weights), and
  `join()` puts it into rotation under the same lock, so no publish can slip in between. A transport
  that cannot reload one server alone (`distributed`) gets it as a held member of the client (weight
  updates, no requests) and a full sync at the next step; it joins once that publish is verified.

Every publish is verified: a few sampled tensors are read back from every server with
`get_weights_by_name` and compared with the trainer's values taken when the weights were read; a
difference fails loudly (`WeightSyncError`) instead of letting the rollout sample from weights
nobody trained. A transport whose publish leaves the servers' weights as they were (a LoRA adapter
beside the base) verifies it its own way: its `verify(prepared, published, tolerance)` returns the
tensors it checked, or None for this read-back. One lock keeps a re-sync from interleaving with a
publish. Counters (into the rollout's): `weight_sync_retries`, `weight_resyncs`,
`weight_resync_failures`, `weight_sync_lora_fallbacks` (publishes a transport made as a full sync
because a server refused the adapter: the history row's `fallback` says why).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from agentrl_cli.core.httpclient import async_http_client
from agentrl_cli.engines.inference.client import TRANSPORT_ERRORS, InferenceError
from agentrl_cli.weightsync.base import (
    Prepared,
    Published,
    WeightSyncError,
    WeightTransport,
)
from agentrl_cli.weightsync.servers import flatten_rows, load_from_disk, server_weight_version, stale_servers, wire

if TYPE_CHECKING:
    from agentrl_cli.learner.backend import TrainingBackend

log = logging.getLogger(__name__)

VERIFY_NAMES = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")
SYNC_ERRORS = (InferenceError, WeightSyncError, *TRANSPORT_ERRORS)


class WeightPublisher:
    def __init__(self, transport: WeightTransport, client, *, launch_path: str | Path | None = None,
                 counters: Counter | None = None, watchdog=None, resume_deadline_s: float = 300.0,
                 verify_names: tuple[str, ...] = VERIFY_NAMES, sample: int = 16, tolerance: float = 1e-6) -> None:
        self.transport, self.client = transport, client
        self.launch_path = None if launch_path is None else str(launch_path)
        self.counters = counters if counters is not None else Counter()
        self.watchdog, self.resume_deadline_s = watchdog, resume_deadline_s
        self.verify_names, self.sample, self.tolerance = verify_names, sample, tolerance
        self.history: list[dict] = []
        self.last: Published | None = None  # the newest version every server loaded and verified
        self.full_sync_due = False  # a server needs weights the transport cannot re-send to it alone
        self.reference: dict[str, list[float]] | None = None  # the verified values of `last`, for `bring_up`
        self._joining: dict[str, tuple[asyncio.Future, Callable[[], None]]] = {}  # held until the next full publish
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    @property
    def _engine(self):
        """The client's engine (its routes and bodies); None for a client without one: SGLang's protocol."""
        return getattr(self.client, "engine", None)

    def _busy(self):
        return self.watchdog.busy("weight_sync") if self.watchdog is not None else nullcontext()

    # ---- one version ------------------------------------------------------------------------------

    async def prepare(self, backend: TrainingBackend, version: int) -> Prepared:
        """Read `version`'s weights off the trainer and the values to verify them by."""
        t0 = time.perf_counter()
        with self._busy():
            prepared = await self.transport.prepare(backend, version)
            prepared.reference = await asyncio.to_thread(self._reference, backend)
        prepared.read_s = time.perf_counter() - t0
        return prepared

    async def publish(self, prepared: Prepared) -> dict:
        """Every server loads `prepared`; the read-back is checked; returns the history row."""
        t0 = time.perf_counter()
        with self._busy():
            published = await self.transport.publish(prepared)
            loaded = time.perf_counter()
            own = getattr(self.transport, "verify", None)
            checked = await own(prepared, published, self.tolerance) if own is not None else None
            published.verified_tensors = checked if checked is not None else await self.verify(prepared.reference)
            if not published.verified_tensors:
                published.verified_versions = await self.verify_versions(str(published.version))
        self.reference = None if checked is not None else prepared.reference
        joining, self._joining = self._joining, {}
        for url, (waiting, join) in joining.items():  # held servers: verified with the others just now
            if url in self.client.urls and not waiting.done():
                join()
                waiting.set_result(str(published.version))
        if published.details.get("fallback"):
            self.counters["weight_sync_lora_fallbacks"] += 1
        done = time.perf_counter()
        published.timings = {"export_s": prepared.read_s, **published.timings, "verify_s": done - loaded}
        published.seconds = prepared.read_s + done - t0
        self.last = published
        entry = published.as_entry()
        self.history.append(entry)
        return entry

    async def sync(self, backend: TrainingBackend, version: int) -> dict:
        return await self.publish(await self.prepare(backend, version))

    async def sync_retrying(self, backend: TrainingBackend, version: int) -> dict:
        async with self._lock:
            try:
                return await self.sync(backend, version)
            except SYNC_ERRORS as exc:
                log.error("weight sync to version %s failed (%s); waiting for the servers and retrying", version, exc)
                self.counters["weight_sync_retries"] += 1
            await self.client.wait_healthy(self.resume_deadline_s)
            return await self.sync(backend, version)

    # ---- overlap with training (async mode) -------------------------------------------------------

    @property
    def publishing(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, backend: TrainingBackend, version: int) -> None:
        prepared = await self.prepare(backend, version)

        async def publish() -> dict:
            async with self._lock:
                return await self.publish(prepared)
        self._task = asyncio.create_task(publish())

    async def wait(self) -> dict | None:
        """The publish in flight, if any: its history row, or None when there was none or it failed
        (then the next step syncs in full)."""
        task, self._task = self._task, None
        if task is None:
            return None
        try:
            return await task
        except SYNC_ERRORS as exc:
            log.error("publishing weights to the servers failed (%s); the next step syncs again", exc)
            self.counters["weight_sync_retries"] += 1
            self.full_sync_due = True
            return None

    # ---- servers that restarted -------------------------------------------------------------------

    async def before_step(self, backend: TrainingBackend, version: int) -> dict | None:
        """Bring restarted servers up to date, with a full sync when one is due; returns the row of
        a publish that finished meanwhile (the full sync waits for it first)."""
        if not self.publishing:  # a publish in flight brings every server up to date itself
            await self.resync_servers()
        if not self.full_sync_due:
            return None
        self.full_sync_due = False
        finished = await self.wait()
        await self.sync_retrying(backend, version)
        self.counters["weight_resyncs"] += 1
        return finished

    async def resync_servers(self) -> None:
        """Give every server that serves another version than the last published the current weights
        again; counted as `weight_resyncs`."""
        async with self._lock:
            last = self.last or Published(0, "launch", path=self.launch_path)
            try:
                stale = await stale_servers(self.client.urls, str(last.version), headers=self.client.headers,
                                            engine=self._engine)
                if not stale:
                    return
                if self.last is None:
                    resent = bool(last.path) and bool(await load_from_disk(list(stale), last.path, "0",
                                                                           headers=self.client.headers, engine=self._engine))
                else:
                    resent = await self.transport.resend(list(stale), last)
            except InferenceError as exc:
                log.error("re-syncing weights failed: %s", exc.message)
                self.counters["weight_resync_failures"] += 1
                return
        if resent:
            self.counters["weight_resyncs"] += len(stale)
        else:
            self.full_sync_due = True

    async def bring_up(self, url: str, join: Callable[[], None] = lambda: None) -> str:
        """Give the server at `url` (not in the client's rotation) the run's current weights, verify
        them, then `join()` it; returns the version it serves. A transport that cannot reload it alone
        holds it for the next full publish (see the module's docstring). Raises WeightSyncError when
        it does not serve the run's weights after the load."""
        async with self._lock:
            version, loaded, waiting = await self._bring_up_locked(url, join)
        if waiting is not None:
            return await self._held_until_published(url, waiting)
        self.counters["weight_resyncs"] += int(loaded)
        return version

    async def _bring_up_locked(self, url: str, join: Callable[[], None]) -> tuple[str, bool, asyncio.Future | None]:
        """(version, whether weights were loaded, the future of a held server or None)."""
        last = self.last or Published(0, "launch", path=self.launch_path)
        version, headers = str(last.version), self.client.headers
        async with async_http_client(headers=headers) as http:
            loaded = await server_weight_version(http, url, engine=self._engine) != version
            if loaded and self.last is None:
                if not last.path:
                    raise WeightSyncError(f"{url} does not serve the launch weights and the run knows no launch path "
                                          "to load", "start the server from the run's model")
                await load_from_disk([url], last.path, version, headers=headers, engine=self._engine)
            elif loaded and not await self.transport.resend([url], last):
                waiting = asyncio.get_running_loop().create_future()
                self._joining[url] = (waiting, join)
                self.client.add_url(url, serve=False)
                self.full_sync_due = True
                return version, loaded, waiting
            serving = await server_weight_version(http, url, engine=self._engine)
            if serving != version:
                raise WeightSyncError(f"{url} serves weight version {serving} after the sync, not {version}",
                                      "see the server's log")
            if self.reference:
                await self._verify_one(http, url, self.reference)
        join()
        return version, loaded, None

    async def _held_until_published(self, url: str, waiting: asyncio.Future) -> str:
        """Wait for the full publish that includes held server `url` (at the next step); past
        `resume_deadline_s` it leaves the client again and WeightSyncError is raised."""
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), self.resume_deadline_s)
        except BaseException as exc:
            self._joining.pop(url, None)
            if url in self.client.held:
                self.client.remove_url(url)
            if isinstance(exc, asyncio.TimeoutError):
                raise WeightSyncError(f"{url} was not synced by a full publish within {self.resume_deadline_s:.0f} s",
                                      "see the weight sync errors in the run's log") from None
            raise

    # ---- verification -----------------------------------------------------------------------------

    async def _verify_one(self, http, url: str, ours: dict[str, list[float]]) -> None:
        """`verify` for one server outside the rotation (its weight version only, when the engine
        cannot read a parameter back)."""
        engine = wire(self._engine)
        if not engine.routes.get_weights_by_name:
            return
        for name, values in ours.items():
            r = await http.post(url + engine.routes.get_weights_by_name, json=engine.weights_by_name_body(name, 1))
            theirs = flatten_rows(r.json())[: self.sample] if r.status_code == 200 else []
            worst = max((abs(a - b) for a, b in zip(values, theirs)), default=float("inf"))
            if not theirs or worst > self.tolerance:
                raise WeightSyncError(f"weights on {url} differ from the run's after bringing it up ({name}: max diff "
                                      f"{worst:.3g})", "the server did not load the run's weights; check its log")

    def _reference(self, backend: TrainingBackend) -> dict[str, list[float]]:
        names = dict(backend.parameter_names())
        picked = [n for n in self.verify_names if n in names] or list(names)[:1]
        return backend.named_parameter_sample(picked, self.sample)

    async def verify(self, ours: dict[str, list[float]]) -> int:
        """Compare the first values of a few parameters on every server with `ours`; the count checked
        (0 when the engine has no route to read a parameter back: vLLM's, whose weight version is checked instead)."""
        if not wire(self._engine).routes.get_weights_by_name:
            return 0
        names = list(ours)
        answers = await asyncio.gather(*(self.client.get_weights_by_name(name, 1) for name in names))
        for name, answer in zip(names, answers):
            for url, rows in answer.items():
                theirs = flatten_rows(rows)[: self.sample]
                mine = ours[name][: len(theirs)]
                worst = max((abs(a - b) for a, b in zip(mine, theirs)), default=float("inf"))
                if not theirs or worst > self.tolerance:
                    hint = getattr(self.transport, "hint", "")
                    raise WeightSyncError(f"weights on {url} differ from the trainer's after {self.transport.name} sync "
                                          f"({name}: max diff {worst:.3g})",
                                          f"the server did not load the trainer's weights; check its log ({hint})")
        return len(names)

    async def verify_versions(self, version: str) -> int:
        """Where no parameter can be read back: every server must report `version`; the count checked."""
        urls = list(self.client.urls)
        stale = await stale_servers(urls, version, headers=self.client.headers, engine=self._engine)
        if stale:
            raise WeightSyncError(f"after the {self.transport.name} sync to version {version}, " +
                                  ", ".join(f"{u} serves {v}" for u, v in stale.items()),
                                  "the server did not finish the update; check its log")
        return len(urls)

    async def close(self) -> None:
        """Wait for a publish in flight, then release what the transport holds."""
        await self.wait()
        await self.transport.close()
