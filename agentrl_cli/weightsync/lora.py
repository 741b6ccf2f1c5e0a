"""`disk` with `training.lora`: the trainer exports its LoRA adapter alone (peft's `save_pretrained`
layout, `backend.export_adapter`) and every server loads it beside its unchanged base weights
(SGLang's `load_lora_adapter`); a few hundred kilobytes to megabytes per version instead of the model.

Publishing version N:
1. every server relabels what it serves as version N (`update_weight_version`, aborting nothing);
2. every server loads the adapter as `policy-<run token>-v00000N` (the token is new for every transport,
   so servers that outlive a run never hold a name of this run's with other weights); the servers'
   answers must list that name;
3. the run's clients send that name as `lora_path` from now on (`InferenceClient.use_adapter`, shared
   by every client of these servers in this process: the rollout's and the agent gateway's);
4. the previous adapter is unloaded everywhere (requests already queued on it finish on it).
The embedded server labels a request with the version its adapter was loaded at, so requests still
decoding with version N-1's adapter keep N-1; SGLang labels every request with its current version.
A restarted server (launch weights, launch version) gets the current adapter alone (`resend`). The
newest `keep` adapter exports stay on disk.

Fallback: when a server refuses the adapter (answers success false: SGLang without --enable-lora, a
rank above its --max-lora-rank, modules outside its --lora-target-modules), this version is synced in
full instead: the launch model with this adapter merged in (peft, on this host) is written as an
ordinary model directory, the clients go back to the base weights, the adapters are unloaded and
every server loads the merged directory (`update_weights_from_disk`, the disk transport). Every later
version is a full sync too (`backend.export_weights`, merged): the servers' base then holds a policy,
and an adapter (the whole change since the launch weights) must not be applied on top of it. The
fallback is logged with the servers' reasons and recorded in the history row (`mode: full`,
`fallback`), which the publisher counts as `weight_sync_lora_fallbacks`.

Verification (`verify`, instead of the publisher's read-back): an adapter publish leaves every
server's base weights as they were, so reading weights back cannot show that it landed. Checked:
every server lists the new name among its loaded adapters (its load answer), and for each weight the
publisher samples, the server's base row (`get_weights_by_name`) plus what the adapter file adds to it
(B·A·scale, `inference.lora.delta_rows`) equals the trainer's merged value: the servers' base is the
one the adapter was trained on, and the file holds the trainer's adapter. Not checked: that a server
computes with the adapter correctly (the embedded server merges it with peft, SGLang applies it in
its kernels). A full sync is read back by the publisher as for `disk`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl_cli.engines.inference.client import LoraRefused
from agentrl_cli.engines.inference.lora import delta_rows, merged_model, payload_files, read_adapter
from agentrl_cli.weightsync.base import Prepared, Published, WeightSyncError
from agentrl_cli.weightsync.disk import DiskTransport, export_version
from agentrl_cli.weightsync.servers import flatten_rows

if TYPE_CHECKING:
    from agentrl_cli.learner.backend import TrainingBackend

log = logging.getLogger(__name__)
LAUNCH_VERSION = "0"  # the weight version the launcher starts servers with


class LoraTransport:
    name = "lora"
    hint = "and the adapter export"

    def __init__(self, client, export_root: Path, *, base_path: Path | str | None = None, base_resolver=None,
                 keep: int = 2) -> None:
        """`base_path`: the launch model (merged with an adapter when a server refuses it), or
        `base_resolver()` giving it when first needed."""
        self.client, self.root, self.keep = client, Path(export_root) / "adapters", keep
        self.full = DiskTransport(client, Path(export_root) / "weights", keep=keep)
        self._base_path, self._base_resolver = base_path, base_resolver
        self.token = secrets.token_hex(3)
        self.current: str | None = None  # the adapter the servers serve the policy with
        self.full_since: int | None = None  # the version from which every sync is full (a server refused an adapter)

    @classmethod
    def from_config(cls, cfg, client, workdir: Path) -> "LoraTransport":
        def launch_model() -> Path:
            from agentrl_cli.model.resolve import resolve_model_path

            return resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False)
        return cls(client, Path(workdir), base_resolver=launch_model)

    def adapter_name(self, version: int) -> str:
        return f"policy-{self.token}-v{version:06d}"

    # ---- one version --------------------------------------------------------------------------

    async def prepare(self, backend: TrainingBackend, version: int) -> Prepared:
        if self.full_since is not None:
            return await self.full.prepare(backend, version)
        return await export_version(self.root, version, backend.export_adapter, backend.rank)

    async def publish(self, prepared: Prepared) -> Published:
        if self.full_since is not None:
            return self._as_full(await self.full.publish(prepared))
        t0 = time.perf_counter()
        version, path = prepared.version, Path(prepared.payload)
        name = self.adapter_name(version)
        await self.client.update_weight_version(str(version))
        try:
            answers = await self._load(name, path, self.client.urls)
        except LoraRefused as exc:
            return await self._fall_back(prepared, exc)
        unlisted = [u for u, a in answers.items() if name not in (a.get("loaded_adapters") or {})]
        if unlisted:
            raise WeightSyncError(f"LoRA adapter {name} was loaded but is not listed as loaded on {', '.join(unlisted)}",
                                  "check those servers' logs")
        previous, self.current = self.current, name
        self.client.use_adapter(name)
        if previous is not None and previous != name:
            await self._unload(previous)
        self._prune(version)
        return Published(version, self.name, path=str(path), timings={"load_s": time.perf_counter() - t0},
                         details={"mode": "adapter", "adapter": name, "listed_on": len(answers),
                                  "bytes": sum(f.stat().st_size for f in payload_files(path))})

    async def verify(self, prepared: Prepared, published: Published, tolerance: float) -> int | None:
        """See the module docstring; None for a full sync (the publisher reads it back)."""
        if published.details.get("mode") != "adapter":
            return None
        if not self.client.engine.routes.get_weights_by_name:  # vLLM: no parameter read-back; versions are checked
            return 0
        adapter = await asyncio.to_thread(read_adapter, prepared.payload)
        names = list(prepared.reference)
        answers = await asyncio.gather(*(self.client.get_weights_by_name(name, 1) for name in names))
        for name, answer in zip(names, answers):
            ours = prepared.reference[name]
            delta = delta_rows(adapter, name, 1)
            added = [0.0] * len(ours) if delta is None else delta.flatten().tolist()[:len(ours)]
            for url, rows in answer.items():
                base = flatten_rows(rows)[:len(ours)]
                theirs = [b + d for b, d in zip(base, added)]
                worst = max((abs(a - b) for a, b in zip(ours, theirs)), default=float("inf"))
                if len(theirs) != len(ours) or worst > tolerance:
                    raise WeightSyncError(f"{url}'s base weights plus LoRA adapter {published.details['adapter']} differ "
                                          f"from the trainer's merged weights ({name}: max diff {worst:.3g})",
                                          "the server's base is not the model the adapter was trained on (another "
                                          "launch model, or a full sync loaded onto it); restart it with the launch model")
        return len(names)

    # ---- servers that restarted ---------------------------------------------------------------

    async def resend(self, urls: list[str], last: Published) -> bool:
        """Give restarted servers the current adapter (or, after a fallback, the full export)."""
        if last.details.get("mode") != "adapter":
            return await self.full.resend(urls, last)
        for url in urls:
            log.warning("re-syncing inference server %s: LoRA adapter %s from %s", url, last.details["adapter"], last.path)
            await self.client.update_weight_version(str(last.version), urls=[url])
            try:
                await self._load(last.details["adapter"], Path(last.path), [url])
            except BaseException as exc:
                # labelled with the launch version again, so the next check still finds it stale
                with contextlib.suppress(Exception):
                    await self.client.update_weight_version(LAUNCH_VERSION, urls=[url])
                if not isinstance(exc, LoraRefused):
                    raise
                log.error("%s; the next step syncs every server in full", exc.message)
                return False
        return True

    async def close(self) -> None:
        """Nothing to release: the exports stay for a resume."""

    # ---- parts ----------------------------------------------------------------------------------

    async def _load(self, name: str, path: Path, urls: list[str]) -> dict[str, dict]:
        """Load `name` on `urls`; a server that has it loaded from `path` already (a retried
        publish) counts as loaded. LoraRefused names the servers that refused."""
        try:
            return await self.client.load_lora_adapter(name, str(path), urls=urls)
        except LoraRefused as exc:
            if all(a.get("success") or (a.get("loaded_adapters") or {}).get(name) == str(path)
                   for a in exc.answers.values()):
                return {u: {**a, "success": True} for u, a in exc.answers.items()}
            raise

    async def _unload(self, name: str, urls: list[str] | None = None) -> None:
        """Unload `name` on `urls` (every server by default); a refusal (not loaded there) is only logged."""
        if urls == []:
            return
        try:
            await self.client.unload_lora_adapter(name, urls=urls)
        except LoraRefused as exc:
            log.warning("unloading LoRA adapter %s: %s", name, exc.message)

    async def _fall_back(self, prepared: Prepared, refused: LoraRefused) -> Published:
        """Sync `prepared`'s version in full, merged here, and every later one in full (module docstring)."""
        reasons = "; ".join(f"{u}: {a.get('error_message') or a}" for u, a in refused.answers.items() if not a.get("success"))
        log.error("a server refused LoRA adapter %s (%s); syncing version %d and every later one in full",
                  self.adapter_name(prepared.version), reasons, prepared.version)
        self.full_since = prepared.version
        path = self.full.root / f"v{prepared.version:06d}"
        await asyncio.to_thread(self._merged_export, Path(prepared.payload), path)
        self.client.use_adapter(None)
        await self._unload(self.adapter_name(prepared.version), [u for u, a in refused.answers.items() if a.get("success")])
        if self.current is not None:
            await self._unload(self.current)
        self.current = None
        published = self._as_full(await self.full.publish(Prepared(prepared.version, payload=path, rank=prepared.rank)))
        published.details["fallback"] = reasons
        return published

    def _merged_export(self, adapter_dir: Path, out: Path) -> None:
        """The launch model with the adapter at `adapter_dir` merged in, as a model directory at `out`."""
        import torch
        from transformers import AutoModelForCausalLM

        base_path = self._base_path if self._base_path is not None else self._base_resolver()
        base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
        merged = merged_model(base, read_adapter(adapter_dir))
        if out.exists():
            shutil.rmtree(out)
        merged.save_pretrained(out)

    def _as_full(self, published: Published) -> Published:
        published.transport = self.name
        published.details.update(mode="full", bytes=sum(f.stat().st_size for f in Path(published.path).iterdir()
                                                        if f.is_file()))
        return published

    def _prune(self, version: int) -> None:
        exports = sorted(self.root.glob("v*"))
        for old in exports[: max(0, len(exports) - self.keep)]:
            if old.name != f"v{version:06d}":
                shutil.rmtree(old, ignore_errors=True)
