"""The S3 trajectory store (any S3-compatible `endpoint_url`), with a local spool for outages.

Belongs here: create-only puts (`If-None-Match: *`, docs/security.md row 28), bounded retries with
exponential backoff, the spool (row 30): a file that cannot be uploaded is moved to
`<spool_dir>/<key>` and uploaded later by `upload_spool()` (which every `publish` calls first). A
spooled file whose key meanwhile exists remotely with other content is moved to
`<spool_dir>/_conflicts/<key>` and reported, never overwritten; nothing is deleted locally until S3
holds the same bytes. Until then a spooled file is part of the store: `read_table` reads it too, so a
resumed run that asks what it stored finds it and does not store it twice. Every attempt is bounded
(`connect_timeout`, `read_timeout`, `attempts` with backoff), so a publish to an S3 that does not
answer ends spooled, never hanging; `outages` records each stretch S3 could not be reached (first
failure, first success after it, when the spool was empty again). Not here: the protocol and the local
store (`store.py`), Parquet (`writer.py`).
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path
from typing import Any, Callable

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from agentrl_cli.runtime.data.schema import FILE_SCHEMA
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.store import (STAGING_DIR, AlreadyExists, ObjectInfo, ObjectNotFound, check_key, empty_table, partition_of,
                    with_partitions)

log = logging.getLogger("agentrl.data.s3")

_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                    "ConditionalRequestConflict"}


class Unreachable(Exception):
    """Every attempt failed with a connection error, a timeout or a 5xx answer."""


def _error_code(e: ClientError) -> tuple[int, str]:
    return (e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0),
            e.response.get("Error", {}).get("Code", ""))


def is_transient(e: BaseException) -> bool:
    """Worth retrying: no connection, a timeout, a 5xx, throttling, a concurrent conditional write."""
    if isinstance(e, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(e, ClientError):
        status, code = _error_code(e)
        return status >= 500 or code in _TRANSIENT_CODES
    return False


def _precondition_failed(e: ClientError) -> bool:
    status, code = _error_code(e)
    return status == 412 or code == "PreconditionFailed"


class S3Store:
    """Parquet files under `s3://<bucket>/<prefix>/<key>`.

    `attempts` puts per publish, waiting `base_delay * 2**n` seconds (at most `max_delay`) between
    them; after the last the file is spooled. `sleep` is injectable so tests need not wait."""

    def __init__(self, bucket: str, prefix: str = "", *, spool_dir: str | Path, endpoint_url: str | None = None,
                 region: str = "us-east-1", staging_dir: str | Path | None = None, attempts: int = 4,
                 base_delay: float = 0.2, max_delay: float = 5.0, connect_timeout: float = 2.0,
                 read_timeout: float = 30.0, client: Any = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if attempts < 1:
            raise ValueError(f"S3Store attempts must be >= 1, got {attempts}")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.spool = LocalStore(spool_dir)
        self.conflicts = LocalStore(self.spool.root / "_conflicts")
        self.staging_dir = Path(staging_dir).absolute() if staging_dir else self.spool.root.parent / STAGING_DIR
        self.attempts, self.base_delay, self.max_delay, self._sleep = attempts, base_delay, max_delay, sleep
        self.stats: dict[str, int] = {"published": 0, "spooled": 0, "retries": 0, "uploaded_from_spool": 0,
                                      "spool_conflicts": 0}
        # {"start", "end", "drained" (time.monotonic(); None until then), "failures"} per stretch S3 was unreachable
        self.outages: list[dict] = []
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=connect_timeout,
                        read_timeout=read_timeout, s3={"addressing_style": "path"} if endpoint_url else None)
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)

    @classmethod
    def from_config(cls, data_config: Any, **kwargs: Any) -> "S3Store":
        """From `DataConfig`: bucket, prefix, endpoint and region from `data.s3`, the spool under
        `data.root/spool`, temp files under `data.root/.tmp`."""
        root, s3 = Path(data_config.root).expanduser(), data_config.s3
        return cls(s3.bucket, s3.prefix, endpoint_url=s3.endpoint_url, region=s3.region,
                   spool_dir=root / "spool", staging_dir=root / STAGING_DIR, **kwargs)

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}" if self.prefix else check_key(key)

    # ---- publishing --------------------------------------------------------------------------------

    def _put(self, path: Path, key: str, attempts: int) -> None:
        """One create-only upload with retries; AlreadyExists, Unreachable, or a ClientError."""
        last: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                self.stats["retries"] += 1
                self._sleep(min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))
            try:
                with open(path, "rb") as body:
                    self.client.put_object(Bucket=self.bucket, Key=self._object_key(key), Body=body, IfNoneMatch="*")
                self._reached()
                return
            except ClientError as e:
                if _precondition_failed(e):
                    self._reached()
                    # after a failed attempt the object may be ours: a lost response, not a conflict
                    if last is not None and self._same_content(path, key):
                        return
                    raise AlreadyExists(f"{self.url}/{key} already exists; stores are create-only") from None
                if not is_transient(e):
                    raise
                last = e
                self._unreached()
            except (BotoConnectionError, HTTPClientError) as e:
                last = e
                self._unreached()
        raise Unreachable(f"{self.url}/{key}: {attempts} attempt(s) failed; last error: {last}") from last

    def _unreached(self) -> None:
        if not self.outages or self.outages[-1]["end"] is not None:
            self.outages.append({"start": time.monotonic(), "end": None, "drained": None, "failures": 0})
        self.outages[-1]["failures"] += 1

    def _reached(self) -> None:
        if self.outages and self.outages[-1]["end"] is None:
            self.outages[-1]["end"] = time.monotonic()

    def _same_content(self, path: Path, key: str) -> bool:
        try:
            return self.get_bytes(key) == Path(path).read_bytes()
        except (ObjectNotFound, FileNotFoundError):
            return False

    def publish(self, local_path: Path, key: str) -> str:
        """Upload `local_path` under `key` (create-only); "published", or "spooled" when S3 stayed
        unreachable. Spooled files from earlier outages are pushed first."""
        check_key(key)
        if self.spool.list():
            self.upload_spool(attempts=1)
        try:
            self._put(Path(local_path), key, self.attempts)
        except Unreachable as e:
            self.spool.publish(Path(local_path), key)
            self.stats["spooled"] += 1
            log.warning("%s; spooled %s under %s (uploaded by the next publish or `upload_spool()`)",
                        e, key, self.spool.root)
            return "spooled"
        Path(local_path).unlink(missing_ok=True)
        self.stats["published"] += 1
        return "published"

    def upload_spool(self, attempts: int | None = None) -> dict[str, Any]:
        """Upload every spooled file, oldest first; stops at the first one S3 still refuses to take.

        Returns {"uploaded", "already_present", "conflicts", "remaining": [keys], "error": str | None}.
        "already_present": S3 holds identical bytes (a put whose answer was lost); "conflicts": S3
        holds other bytes under that key: the file moves to `<spool>/_conflicts/` and is not uploaded."""
        report: dict[str, Any] = {"uploaded": [], "already_present": [], "conflicts": [], "remaining": [],
                                  "error": None}
        pending = sorted(self.spool.list(), key=lambda info: (info.modified, info.key))
        for i, info in enumerate(pending):
            path = self.spool.root / info.key
            try:
                self._put(path, info.key, attempts or self.attempts)
            except AlreadyExists:
                self._resolve_existing(path, info.key, report)
                continue
            except Unreachable as e:
                report["error"], report["remaining"] = str(e), [p.key for p in pending[i:]]
                log.warning("spool upload paused, %d file(s) remain under %s: %s", len(pending) - i,
                            self.spool.root, e)
                break
            except FileNotFoundError:  # another process uploaded it and removed it meanwhile
                continue
            self.spool.delete(info.key)
            self.stats["uploaded_from_spool"] += 1
            report["uploaded"].append(info.key)
        if pending and report["error"] is None and self.outages and self.outages[-1]["drained"] is None:
            self.outages[-1]["drained"] = time.monotonic()
        return report

    def spooled(self) -> int:
        """Files waiting in the spool for S3."""
        return len(self.spool.list())

    def _resolve_existing(self, path: Path, key: str, report: dict[str, Any]) -> None:
        if self._same_content(path, key):
            self.spool.delete(key)
            report["already_present"].append(key)
            return
        try:
            self.conflicts.publish(path, key)
        except AlreadyExists:
            pass  # an earlier conflict under this key: leave this one in the spool
        self.stats["spool_conflicts"] += 1
        report["conflicts"].append(key)
        log.error("spooled file %s was not uploaded: %s/%s already holds different content; kept under %s",
                  key, self.url, key, self.conflicts.root)

    # ---- reading -----------------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix):
            for obj in page.get("Contents", ()):
                key = obj["Key"][len(base):]
                if key and not any(part[:1] in (".", "_", "") for part in key.split("/")):
                    out.append(ObjectInfo(key, obj["Size"], obj["LastModified"]))
        return sorted(out, key=lambda info: info.key)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._object_key(key))["Body"].read()
        except ClientError as e:
            if _error_code(e)[1] in ("NoSuchKey", "404") or _error_code(e)[0] == 404:
                raise ObjectNotFound(f"{self.url}/{key} is not in the store") from None
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._object_key(key))

    def read_table(self, filter: Any = None) -> pa.Table:
        """Every published Parquet file (one GET each) and every spooled one not in S3 yet, partition
        columns included, optionally filtered."""
        published = [info.key for info in self.list() if partition_of(info.key)]
        tables = [with_partitions(pq.read_table(io.BytesIO(self.get_bytes(key)), schema=FILE_SCHEMA), key)
                  for key in published]
        listed = set(published)
        for info in self.spool.list():
            if partition_of(info.key) and info.key not in listed:
                try:
                    data = self.spool.get_bytes(info.key)
                except ObjectNotFound:  # uploaded since S3 was listed, then removed from the spool
                    data = self.get_bytes(info.key)
                tables.append(with_partitions(pq.read_table(io.BytesIO(data), schema=FILE_SCHEMA), info.key))
        table = pa.concat_tables(tables) if tables else empty_table()
        return table if filter is None else table.filter(filter)
