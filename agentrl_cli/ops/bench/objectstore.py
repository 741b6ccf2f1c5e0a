"""The trajectory object store, probed the way the writer uses it: reachable, put, list, get,
create-only put, delete, under the writer's partition layout (`harness=H/date=D/part-<id>.parquet`).

The probe object is an empty Parquet file of the trajectory schema under `harness=agentrl-probe`,
so a reader that lists the store while the probe runs reads zero rows, never a broken file; it is
deleted at the end. Belongs here: the probe and its checks; stores are opened with `open_store`.
"""

from __future__ import annotations

import datetime as dt
import io
import tempfile
import time
import uuid
from pathlib import Path

from agentrl_cli.core.report import Check, CheckStatus

PROBE_HARNESS = "agentrl-probe"


def _hint(data_config) -> str:
    if data_config.store == "s3":
        return ("check data.s3.endpoint_url, that the bucket data.s3.bucket exists (`aws s3 mb s3://BUCKET`) and the "
                "credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the instance role)")
    return "make data.root a writable directory"


def _probe_bytes() -> bytes:
    import pyarrow.parquet as pq

    from agentrl_cli.runtime.data.schema import FILE_SCHEMA

    buf = io.BytesIO()
    pq.write_table(FILE_SCHEMA.empty_table(), buf, compression="zstd")
    return buf.getvalue()


def probe_store(data_config, store=None) -> list[Check]:
    """Open the configured store (unless given) and run the operations; one check per operation."""
    hint = _hint(data_config)
    where = data_config.s3.endpoint_url or "AWS" if data_config.store == "s3" else data_config.root
    created = [] if store is not None or data_config.store != "local" else _missing_dirs(Path(data_config.root).expanduser().absolute())
    try:
        return _probe(data_config, store, hint, where)
    finally:
        for d in created:  # directories the probe itself made (the local store's root), if still empty
            try:
                d.rmdir()
            except OSError:
                break


def _missing_dirs(root: Path) -> list[Path]:
    out = []
    for d in (root, *root.parents):
        if d.exists():
            break
        out.append(d)
    return out


def _probe(data_config, store, hint: str, where: str) -> list[Check]:
    from agentrl_cli.runtime.data.store import AlreadyExists, ObjectNotFound, partition_of
    from agentrl_cli.runtime.data.stores import open_store

    try:
        store = store or open_store(data_config)
        t0 = time.perf_counter()
        existing = len(store.list())
        list_ms = (time.perf_counter() - t0) * 1000
    except Exception as exc:  # noqa: BLE001 - an unreachable store is this check's finding
        return [Check("object store reachable", CheckStatus.FAIL, None, f"{data_config.store} store lists its objects",
                      f"{data_config.store} store at {where}: {type(exc).__name__}: {exc}", hint)]
    checks = [Check("object store reachable", CheckStatus.PASS, {"url": store.url, "objects": existing, "list_ms": round(list_ms, 1)},
                    "the store lists its objects")]
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    key = f"harness={PROBE_HARNESS}/date={today}/part-{uuid.uuid4().hex}.parquet"
    body = _probe_bytes()
    with tempfile.TemporaryDirectory(prefix="agentrl-store-probe-") as tmp:
        first, second = Path(tmp) / "first.parquet", Path(tmp) / "second.parquet"
        first.write_bytes(body)
        second.write_bytes(body + b"x")
        try:
            t0 = time.perf_counter()
            outcome = store.publish(first, key)
            put_ms = (time.perf_counter() - t0) * 1000
        except Exception as exc:  # noqa: BLE001
            return checks + [Check("object store put", CheckStatus.FAIL, None, "a create-only put succeeds",
                                   f"{key}: {type(exc).__name__}: {exc}", hint)]
        checks.append(Check.judge("object store put", outcome == "published", {"key": key, "bytes": len(body), "put_ms": round(put_ms, 1),
                                                                                 "outcome": outcome},
                                  "published (not spooled) under the writer's layout harness=…/date=…/part-*.parquet",
                                  f"the put was spooled locally, so the store did not take it: {hint}"))
        if outcome != "published":
            return checks
        try:
            listed = [i for i in store.list(f"harness={PROBE_HARNESS}/") if i.key == key]
            checks.append(Check.judge("object store list", len(listed) == 1 and listed[0].size == len(body) and partition_of(key) is not None,
                                      {"found": len(listed), "size": listed[0].size if listed else None,
                                       "partition": partition_of(key)},
                                      "the new key is listed under its partition prefix with its size", hint))
            got = store.get_bytes(key)
            checks.append(Check.judge("object store get", got == body, {"bytes": len(got)}, "the bytes read back equal the bytes put",
                                      "the store returned different bytes; check proxies and the endpoint"))
            try:
                store.publish(second, key)
                refused = False
            except AlreadyExists:
                refused = True
            kept = store.get_bytes(key) == body
            checks.append(Check.judge("object store create-only put", refused and kept, {"second_put_refused": refused, "first_kept": kept},
                                      "a second put of the same key is refused and the first object stays",
                                      "the store overwrote an object; for S3 the endpoint must honour If-None-Match: * "
                                      "(AWS, MinIO and moto do)"))
        finally:
            try:
                store.delete(key)
                deleted_error = ""
            except Exception as exc:  # noqa: BLE001
                deleted_error = f"{type(exc).__name__}: {exc}"
        try:
            store.get_bytes(key)
            gone = False
        except ObjectNotFound:
            gone = True
        still = [i for i in store.list(f"harness={PROBE_HARNESS}/") if i.key == key]
        checks.append(Check.judge("object store delete", gone and not still and not deleted_error,
                                  {"gone": gone, "still_listed": len(still)}, "the key is gone from get and list", hint,
                                  deleted_error))
    return checks
