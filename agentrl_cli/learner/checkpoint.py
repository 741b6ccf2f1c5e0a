"""Crash-safe checkpoint directories (docs/security.md rows 20, 21) and the RNG state a resumed run restores.

Belongs here: the on-disk layout of a checkpoint root, saving a step atomically, finding the newest
checkpoint that verifies, pruning, and capturing/restoring the global random streams. Not here: what
goes into a checkpoint (the caller's `write(dir)` decides: model, optimizer, data cursor) or when to
save (the trainer).

Layout under `root`:

    step-00000012/            a complete checkpoint: the caller's files + COMPLETE.json
    .tmp-step-00000013-<hex>/  a save in progress, or the leftover of a killed one (never read)
    latest                    one line: the name of the newest complete checkpoint

A save writes into a `.tmp-*` dir, fsyncs every file, writes COMPLETE.json (sizes and sha256 of every
file), renames the dir to `step-*` and only then moves `latest` (temp file + os.replace). A SIGKILL at
any moment therefore leaves `latest` naming the previous checkpoint, and `latest()` re-checks what the
pointer names before trusting it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from agentrl_cli.core.fsutil import fsync_dir

log = logging.getLogger("agentrl.training.checkpoint")

COMPLETE = "COMPLETE.json"
POINTER = "latest"
SCHEMA_VERSION = 1
STEP_DIR = re.compile(r"^step-(\d{8})$")
DEFAULT_HASH_LIMIT = 64 << 20


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _sync_tree(directory: Path, hash_limit_bytes: int) -> list[dict[str, Any]]:
    """fsync every file and directory under `directory`; return the file list for COMPLETE.json."""
    files = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (here / d).is_symlink()]:
            path = here / name
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"checkpoint file {rel!r} is a link or not a regular file; "
                                 "write real files into the checkpoint directory")
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            digest = _sha256(path) if size <= hash_limit_bytes else None
            files.append({"path": rel, "size": size, "sha256": digest})
        fsync_dir(here)
    return files


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class CheckpointManager:
    """Saves, finds and prunes the checkpoints under one root. One writer per root (rank 0)."""

    def __init__(self, root: Path | str, keep_last: int = 3, *,
                 _pause_hook: Callable[[str], None] | None = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}; the newest checkpoint is "
                             "always kept")
        self.root = Path(root).expanduser().absolute()
        self.keep_last = keep_last
        # Test seam only: called with a stage name at each step of save() so a test can SIGKILL there.
        self._pause_hook = _pause_hook or (lambda stage: None)

    # ---- saving ----

    def save(self, step: int, write: Callable[[Path], None], meta: dict, *,
             hash_limit_bytes: int = DEFAULT_HASH_LIMIT) -> Path:
        """Write checkpoint `step` via `write(dir)`, publish it atomically, move `latest`, prune.

        Files larger than `hash_limit_bytes` are recorded (and later verified) by size only."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        final = self.root / step_dir_name(step)
        if final.exists():
            self._supersede(final)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex}"
        tmp.mkdir()
        started_ns = tmp.stat().st_mtime_ns
        self._pause_hook("tmp_created")
        try:
            write(tmp)
            self._pause_hook("files_written")
            files = _sync_tree(tmp, hash_limit_bytes)
            self._pause_hook("files_synced")
            record = {"schema_version": SCHEMA_VERSION, "step": step, "meta": meta,
                      "created_at": datetime.now(timezone.utc).isoformat(), "files": files}
            _write_synced(tmp / COMPLETE, json.dumps(record, indent=2, default=str).encode())
            fsync_dir(tmp)
            self._pause_hook("complete_written")
            if final.exists():  # re-checked: a long write() gives another writer time
                raise FileExistsError(self._exists_message(final))
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.root)
        self._pause_hook("renamed")
        self._write_pointer(final.name)
        self._pause_hook("pointer_moved")
        self._prune(keep=final, started_ns=started_ns)
        return final

    def _supersede(self, final: Path) -> None:
        """A run resumed from an older checkpoint reaches a step whose directory exists: it was saved
        after the checkpoint `latest` names (a kill between rename and pointer move, or a run that
        went on past it). Move it aside (pruned as a temp dir) unless `latest` names it."""
        pointed = self._read_pointer()
        current = self.root / pointed if pointed else None
        if current is not None and current.resolve() == final.resolve():
            raise FileExistsError(self._exists_message(final))
        log.warning("checkpoint %s is newer than the resumed one (%s); moving it aside", final.name, pointed)
        os.rename(final, self.root / f".tmp-superseded-{final.name}-{uuid.uuid4().hex}")
        fsync_dir(self.root)

    def _exists_message(self, final: Path) -> str:
        named = self._read_pointer()
        return (f"checkpoint {final} already exists (the `latest` pointer names {named or 'nothing'}); "
                "checkpoints are never overwritten. Resume from the newest checkpoint, or delete "
                f"{final} by hand if it belongs to an abandoned run")

    def _write_pointer(self, name: str) -> None:
        tmp = self.root / f".latest-{uuid.uuid4().hex}.tmp"
        try:
            _write_synced(tmp, (name + "\n").encode())
            os.replace(tmp, self.root / POINTER)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.root)

    def _prune(self, keep: Path, started_ns: int) -> None:
        """Keep the newest `keep_last` complete checkpoints and `keep`; remove leftovers of killed saves."""
        complete = self.list_complete()
        doomed = [p for p in complete[:-self.keep_last] if p != keep]
        for path in doomed:  # rename first, so a kill mid-delete leaves a .tmp-* dir, not a half step-*
            trash = self.root / f".tmp-prune-{path.name}-{uuid.uuid4().hex}"
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            log.info("pruned checkpoint %s (keep_last=%d)", path.name, self.keep_last)
        for entry in self.root.iterdir():
            stale = entry.name.startswith(".tmp-") or (entry.name.startswith(".latest-")
                                                        and entry.name.endswith(".tmp"))
            if not stale or entry.lstat().st_mtime_ns > started_ns:
                continue  # newer than this save: another writer's, not a leftover
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            log.info("removed %s, the leftover of an interrupted save", entry.name)
        fsync_dir(self.root)

    # ---- reading ----

    def _read_pointer(self) -> str | None:
        try:
            return (self.root / POINTER).read_text(encoding="utf-8").strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def meta(self, path: Path | str) -> dict:
        """The COMPLETE.json of checkpoint `path` (step, meta, created_at, files)."""
        return json.loads((Path(path) / COMPLETE).read_text(encoding="utf-8"))

    def problem(self, path: Path | str, *, verify_hashes: bool = False) -> str | None:
        """Why checkpoint `path` cannot be resumed from, or None when it verifies."""
        path = Path(path)
        match = STEP_DIR.match(path.name)
        if match is None or path.parent != self.root:
            return f"{path.name!r} is not a step-NNNNNNNN directory of {self.root}"
        if not path.is_dir() or path.is_symlink():
            return f"{path.name} does not exist"
        try:
            record = self.meta(path)
            step, files = record["step"], record["files"]
            entries = [(f["path"], f["size"], f.get("sha256")) for f in files]
        except FileNotFoundError:
            return f"{path.name} has no {COMPLETE} (its save never finished)"
        except (ValueError, KeyError, TypeError) as e:
            return f"{path.name}/{COMPLETE} is unreadable: {e}"
        if step != int(match.group(1)):
            return f"{path.name}/{COMPLETE} says step {step}"
        for rel, size, digest in entries:
            file = path / rel
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                return f"{path.name}/{COMPLETE} lists {rel!r}, outside the checkpoint"
            if not file.is_file() or file.is_symlink():
                return f"{path.name}/{rel} is missing"
            if file.stat().st_size != size:
                return f"{path.name}/{rel} has {file.stat().st_size} bytes, {COMPLETE} says {size}"
            if verify_hashes and digest is not None and _sha256(file) != digest:
                return f"{path.name}/{rel} does not match its sha256"
        return None

    def _step_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        dirs = [p for p in self.root.iterdir() if STEP_DIR.match(p.name)]
        return sorted(dirs, key=lambda p: p.name)

    def list_complete(self, *, verify_hashes: bool = False) -> list[Path]:
        """Checkpoints that verify, oldest step first."""
        return [p for p in self._step_dirs() if self.problem(p, verify_hashes=verify_hashes) is None]

    def latest(self, *, verify_hashes: bool = False) -> Path | None:
        """The checkpoint `latest` names if it verifies, else the newest one that does, else None."""
        named = self._read_pointer()
        if named is None:
            if self._step_dirs():
                log.warning("no readable `latest` pointer in %s; using the newest checkpoint that verifies",
                            self.root)
        else:
            why = self.problem(self.root / named, verify_hashes=verify_hashes)
            if why is None:
                return self.root / named
            log.warning("`latest` names %r but %s; using the newest checkpoint that verifies", named, why)
        for path in reversed(self._step_dirs()):
            why = self.problem(path, verify_hashes=verify_hashes)
            if why is None:
                return path
            log.warning("skipping checkpoint %s: %s", path.name, why)
        return None


# ---- random streams ----

def rng_state() -> dict:
    """The global random, numpy and torch (CPU and CUDA) RNG states, as plain types and tensors, so
    the dict survives pickle and torch.save/torch.load(weights_only=True)."""
    import random

    import numpy as np
    import torch

    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": [int(x) for x in np_state["state"]["key"]], "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state()` captured, so the next draws repeat the ones that followed it."""
    import random

    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"], "has_gauss": n["has_gauss"],
                         "gauss": n["gauss"],
                         "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]}})
    torch.set_rng_state(state["torch"])
    cuda = state.get("torch_cuda")
    if cuda is None:
        return
    if not torch.cuda.is_available() or torch.cuda.device_count() != len(cuda):
        log.warning("checkpoint has CUDA RNG state for %d device(s) but %d are visible; CUDA random "
                    "streams are not restored", len(cuda),
                    torch.cuda.device_count() if torch.cuda.is_available() else 0)
        return
    torch.cuda.set_rng_state_all(cuda)
