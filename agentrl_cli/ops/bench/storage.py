"""Checkpoint storage: sequential write bandwidth with fsync, small-file create rate, free space.

Sequential write: `size_mb` written in 4 MiB blocks to one new file, then fsync of the file and of
its directory; MB/s = bytes / (time to the end of the fsyncs), so the page cache cannot flatter it.
Small files: `files` new 4 KiB files created, written and closed in one new directory, then one
fsync of that directory; files/s over the whole. Free space is compared with what checkpoints of
the configured model take: see `checkpoint_bytes`. Everything written is removed afterwards.
Belongs here: the measurements and their checks; the model's parameter count comes from `ops/plan.py`.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrl_cli.core.fsutil import fsync_dir
from agentrl_cli.core.report import Check, CheckStatus

BLOCK = 4 << 20
SMALL = 4096
MB = 1e6


@dataclass
class StorageResult:
    directory: str
    write_mbps: float | None = None
    write_bytes: int = 0
    small_files_per_s: float | None = None
    small_files: int = 0
    free_bytes: int | None = None
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def measure_storage(directory: Path, size_mb: int = 64, files: int = 500) -> StorageResult:
    """Measure in a fresh sub-directory of `directory` (created if missing), removed afterwards."""
    directory = Path(directory).expanduser()
    res = StorageResult(str(directory))
    probe = directory / f".agentrl-storage-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir(parents=True)
    except OSError as exc:
        res.error = f"cannot create a directory in {directory}: {exc.strerror or exc}"
        return res
    try:
        res.free_bytes = shutil.disk_usage(probe).free
        res.write_bytes = size_mb * (1 << 20)
        block = os.urandom(BLOCK)
        t0 = time.perf_counter()
        fd = os.open(probe / "sequential.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = res.write_bytes
            while left > 0:
                left -= os.write(fd, block[:min(BLOCK, left)])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(probe)
        res.write_mbps = round(res.write_bytes / MB / (time.perf_counter() - t0), 1)
        os.unlink(probe / "sequential.bin")
        small = probe / "small"
        small.mkdir()
        payload = os.urandom(SMALL)
        t0 = time.perf_counter()
        for i in range(files):
            fd = os.open(small / f"f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
        fsync_dir(small)
        res.small_files_per_s = round(files / (time.perf_counter() - t0), 1)
        res.small_files = files
    except OSError as exc:
        res.error = f"writing in {directory} failed: {exc.strerror or exc}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return res


def checkpoint_bytes(params: int, precision: str) -> int:
    """One checkpoint of a model with `params` parameters trained with Adam at `precision`:
    weights (2 bytes in bf16/fp16, 4 in fp32) + an fp32 master copy when not fp32 (4) + Adam's two
    fp32 moments (8)."""
    weight = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" else 4
    return params * (weight + master + 8)


def checks(res: StorageResult, min_write_mbps: float, min_files_per_s: float,
           need_bytes: int | None = None, need_detail: str = "") -> list[Check]:
    hint_dir = (f"make {res.directory} writable (checkpoints go to observe.runs_dir/<run>/checkpoints), or point "
                "observe.runs_dir at a writable file system")
    if res.write_mbps is None:
        return [Check("checkpoint dir writable", CheckStatus.FAIL, res.directory, "a file can be created, written and fsync'd",
                      res.error, hint_dir)]
    out = [Check.judge("checkpoint write bandwidth", res.write_mbps >= min_write_mbps, res.write_mbps,
                       f">= {min_write_mbps:g} MB/s sequential with fsync (stages.checkpoint_write_min_mbps)",
                       "slow checkpoint storage: use a parallel or local NVMe file system for observe.runs_dir",
                       f"{res.write_bytes / MB:.0f} MB to {res.directory}")]
    if res.small_files_per_s is None:
        out.append(Check("small-file create rate", CheckStatus.FAIL, None, f">= {min_files_per_s:g} files/s", res.error, hint_dir))
    else:
        out.append(Check.judge("small-file create rate", res.small_files_per_s >= min_files_per_s, res.small_files_per_s,
                               f">= {min_files_per_s:g} files/s, 4 KiB each, one directory fsync (stages.small_files_min_per_s)",
                               "slow metadata operations: check the file system (parallel file systems need a metadata server "
                               "sized for checkpoint shards)", f"{res.small_files} files"))
    if need_bytes is not None and res.free_bytes is not None:
        out.append(Check.judge("free space for checkpoints", res.free_bytes >= need_bytes,
                               {"free_gb": round(res.free_bytes / 1e9, 2), "needed_gb": round(need_bytes / 1e9, 3)},
                               f">= {need_detail}", "free disk space, lower training.keep_last_checkpoints, or move observe.runs_dir"))
    return out
