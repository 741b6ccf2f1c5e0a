"""Stage 7 - data (the trajectory store).

Against the configured store (`data.store`: a local directory, or S3 at `data.s3.endpoint_url`),
in a namespace of its own (`stage7-<run_id>`, removed afterwards) so real data is never touched:
real episodes of the configured harnesses are played, scored and written; checks: write and
publish (every row read back, every footer valid), Hive partitions, schema validation (a drifted
row is quarantined, not written), compression ratio (JSON lines vs Parquet bytes), redaction of
planted secrets in Parquet and in logs, create-only publish, query by filter (against an
independent count), retention (an old partition is collected, recent ones kept), evaluation
metrics, and replay of stored trajectories with no divergence.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.runtime.data.record_from_episode import record_from_episode
from agentrl_cli.runtime.data.gc import collect_garbage
from agentrl_cli.runtime.data.metrics import compute_metrics
from agentrl_cli.runtime.data.query import filter_table
from agentrl_cli.core.redact import Redactor, install_log_redaction
from agentrl_cli.runtime.data.replay import replay
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.store import AlreadyExists
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.core.outcomes import Outcome, Phase
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.reward.scorer import Scorer
from harnesses.contract import play
from harnesses.oracle import oracle_action
from harnesses.registry import create
from agentrl_cli.envs.sandbox.provider import provider_from_config
from harnesses.tasks import TASK_SET_VERSION, load_tasks

EPISODES_PER_HARNESS = 8
COPIES = 40  # rows written per played episode (new ids): a store-sized write; compression is judged on unique rows
# shapes of real credentials, built at run time so this file holds none
SECRETS = {"aws_access_key": "AKIA" + "Q7XK2M4PZ8RT5WBN", "github_token": "ghp_" + "x7Kq2Lm9Pz4Rt6Wb8Nc1Vd3Fg5Hj0Ks2Qe4Ty",
           "bearer": "Authorization: Bearer " + "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQtMTIzNDU2Nzg5.Zm9vYmFyYmF6cXV4"}


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config.data
    space = f"stage7-{ctx.run.run_id}"
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-stage7-"))
    try:
        store = _store(cfg, space, tmp)
    except Exception as exc:  # noqa: BLE001 - a store that cannot even be opened is this stage's finding
        return ctx.report([Check("store reachable", CheckStatus.FAIL, None, f"{cfg.store} store opens", f"{type(exc).__name__}: {exc}",
                                 "check data.store, data.root and data.s3.* (endpoint_url, bucket, credentials)")])
    try:
        reach = _reachable(store, cfg)
        if reach.status != CheckStatus.PASS:
            return ctx.report([reach, Check.skipped("data checks", "the store is not reachable; see above")])
        played, records = ctx.produce("episodes recorded", lambda: _episodes(ctx))
        checks = [reach, *played]
        if not records:
            return ctx.report(checks + [Check.skipped("data checks", "no episode could be recorded; see above")])
        wrote, written = ctx.produce("write and publish", lambda: _write(store, tmp, records))
        checks += [
            *wrote,
            ctx.check("Hive partitions", lambda: _partitions(store, records)),
            ctx.check("schema validation", lambda: _drift(store, tmp, records)),
            ctx.check("compression ratio", lambda: _compression(records, cfg.compression, ctx.config.stages.data_min_compression_ratio)),
            ctx.check("create-only publish", lambda: _create_only(store, tmp)),
        ]
        if written is None:
            checks.append(Check.skipped("redaction, query, metrics", "nothing was written; see \"write and publish\""))
        else:
            checks += [ctx.check("redaction", lambda: _redaction(store, written.planted_id, cfg.redact_fields)),
                       ctx.check("query by filter", lambda: _query(store, written.rows)),
                       ctx.check("evaluation metrics", lambda: _metrics(store, written.rows))]
        checks += [
            ctx.check("retention", lambda: _retention(store, tmp, records, cfg.retention_days)),
            ctx.check("replay with no divergence", lambda: _replay(store, records, ctx.config)),
        ]
        return ctx.report(checks, [f"stage namespace {store.url} (removed afterwards)"],
                          environment={"store": cfg.store, "store_url": store.url, "compression": cfg.compression})
    finally:
        _remove(store)
        shutil.rmtree(tmp, ignore_errors=True)


def _store(cfg, space: str, tmp: Path):
    if cfg.store == "s3":
        from agentrl_cli.runtime.data.s3 import S3Store

        s3 = cfg.s3
        prefix = f"{s3.prefix.strip('/')}/{space}" if s3.prefix.strip("/") else space
        return S3Store(s3.bucket, prefix, endpoint_url=s3.endpoint_url, region=s3.region, spool_dir=tmp / "spool",
                       staging_dir=tmp / "staging", attempts=2, base_delay=0.1)
    root = (Path(cfg.root).expanduser() / space).absolute()
    store = LocalStore(root)
    store.preexisting = {p for p in root.parents if p.exists()}
    return store


def _reachable(store, cfg) -> Check:
    hint = ("check data.s3.endpoint_url, the bucket (data.s3.bucket) and credentials (AWS_* environment)"
            if cfg.store == "s3" else "check data.root is writable")
    try:
        n = len(store.list())
    except Exception as exc:  # noqa: BLE001
        return Check("store reachable", CheckStatus.FAIL, None, "list succeeds", f"{store.url}: {type(exc).__name__}: {exc}", hint)
    return Check("store reachable", CheckStatus.PASS, {"url": store.url, "objects": n}, "list succeeds")


def _remove(store) -> None:
    try:
        for info in store.list():
            store.delete(info.key)
    except Exception:  # noqa: BLE001 - best effort; the namespace name says what it was
        pass
    if isinstance(store, LocalStore):
        shutil.rmtree(store.root, ignore_errors=True)
        for parent in store.root.parents:  # directories this stage created (data.root), if still empty
            if parent in store.preexisting:
                break
            try:
                parent.rmdir()
            except OSError:
                break


def _episodes(ctx: StageContext) -> tuple[Check, list[TrajectoryRecord]]:
    provider = provider_from_config(ctx.config.sandbox)
    scorer = Scorer.from_config(ctx.config, provider)
    records: list[TrajectoryRecord] = []
    try:
        for hc in ctx.config.harnesses:
            h = create(hc.name, ctx.config)  # its own sandboxes, as a run builds them: its limits and its image
            try:
                tasks = load_tasks(hc.name, "eval")
                for i in range(EPISODES_PER_HARNESS):
                    task = tasks[(i * 5) % len(tasks)]
                    policy = oracle_action if i % 2 == 0 else (lambda t, turn: "no idea" if turn == 0 else oracle_action(t, turn - 1))
                    traj, _ = play(h, task, policy=policy)
                    ev = h.evidence(traj)
                    tid = uuid.uuid4().hex
                    result = scorer.score(request_from_episode(traj, ev, trajectory_id=tid))
                    record = record_from_episode(traj, run_id=ctx.run.run_id, harness_version=h.version, reward=result,
                                                 evidence=ev, seed=i, phase=Phase.EVAL, task_set_version=TASK_SET_VERSION,
                                                 trajectory_id=tid)
                    record.image_digest = getattr(h, "episode_image_digest", "")  # the image its sandbox ran in
                    records.append(record)
            finally:
                h.close()
    finally:
        scorer.close()
    harnesses = sorted({r.harness for r in records})
    return Check.judge("episodes recorded", bool(records), {"episodes": len(records), "harnesses": harnesses},
                       "one or more scored episodes per configured harness",
                       "see stages 5 and 6 for the harnesses and the reward"), records


def _copies(records: list[TrajectoryRecord]) -> list[TrajectoryRecord]:
    out = []
    for c in range(COPIES):
        for r in records:
            out.append(TrajectoryRecord.from_row({**r.to_row(), "trajectory_id": uuid.uuid4().hex}) if c else r)
    return out


@dataclass
class Written:
    rows: list[TrajectoryRecord]  # every row written, the planted one included
    planted_id: str  # the row carrying planted secrets


def _write(store, tmp: Path, records: list[TrajectoryRecord]) -> tuple[Check, Written]:
    rows = _copies(records)
    planted = rows[-1]  # a copy: the played records themselves stay as recorded (replayed below)
    planted.steps[0].observation += "\n" + "\n".join(SECRETS.values())
    planted.steps[0].action += f"\nexport AWS_KEY={SECRETS['aws_access_key']}"
    with TrajectoryWriter(store, rows_per_file=10_000, redactor=Redactor(), quarantine_dir=tmp / "quarantine") as w:
        accepted = sum(w.write(r) for r in rows)
    back = store.read_table()
    ids_ok = sorted(back.column("trajectory_id").to_pylist()) == sorted(r.trajectory_id for r in rows)
    return Check.judge("write and publish", accepted == len(rows) and ids_ok,
                       {"rows": len(rows), "read_back": back.num_rows, "files": w.stats["files"], "bytes": w.stats["bytes"],
                        "spooled": w.stats["spooled"]},
                       "every row published and read back by id",
                       "see the detail; `agentrl troubleshoot \"trajectory storage\"`"), Written(rows, planted.trajectory_id)


def _partitions(store, records: list[TrajectoryRecord]) -> Check:
    keys = [i.key for i in store.list()]
    bad = [k for k in keys if not (k.startswith("harness=") and "/date=" in k and k.endswith(".parquet"))]
    harnesses = sorted({k.split("/")[0].split("=", 1)[1] for k in keys if k.startswith("harness=")})
    expected = sorted({r.harness for r in records})
    return Check.judge("Hive partitions", not bad and harnesses == expected, {"files": len(keys), "harnesses": harnesses},
                       "harness=…/date=…/part-*.parquet for every harness", "the writer's partitioning is broken", str(bad[:3]))


def _drift(store, tmp: Path, records: list[TrajectoryRecord]) -> Check:
    row = records[0].to_row()
    row.update(trajectory_id="drifted-" + uuid.uuid4().hex[:8], turns="five")
    w = TrajectoryWriter(store, quarantine_dir=tmp / "quarantine")
    accepted = w.write(row)
    w.close()
    qfile = tmp / "quarantine" / "quarantine.jsonl"
    kept = qfile.exists() and row["trajectory_id"] in qfile.read_text()
    in_store = filter_table(store.read_table(), f"trajectory_id == {row['trajectory_id']!r}").num_rows
    return Check.judge("schema validation", not accepted and kept and in_store == 0,
                       {"accepted": accepted, "quarantined": kept, "in_store": in_store},
                       "a row with turns='five' is rejected before writing and quarantined", "validate_row must run before every write")


def _compression(records: list[TrajectoryRecord], codec: str, minimum: float) -> Check:
    """Judged on the played episodes alone (the copies would flatter the codec), in one file."""
    import pyarrow.parquet as pq

    from agentrl_cli.runtime.data.schema import to_table

    rows = [r.to_row() for r in records]
    raw = sum(len(json.dumps(r, default=str).encode()) + 1 for r in rows)
    buf = io.BytesIO()
    pq.write_table(to_table(rows), buf, compression=None if codec == "none" else codec)
    ratio = raw / len(buf.getvalue())
    return Check.judge("compression ratio", ratio >= minimum,
                       {"ratio": round(ratio, 2), "rows": len(rows), "jsonl_bytes": raw, "parquet_bytes": len(buf.getvalue()),
                        "codec": codec},
                       f">= {minimum:g} (JSON lines / Parquet bytes, unique episodes)", "set data.compression: zstd")


def _redaction(store, planted_id: str, fields: list[str]) -> Check:
    table = filter_table(store.read_table(), f"trajectory_id == {planted_id!r}")
    stored = json.dumps(table.to_pylist(), default=str)
    leaked_parquet = [k for k, v in SECRETS.items() if v.split()[-1] in stored]
    buf = io.StringIO()
    logger = logging.getLogger(f"agentrl.stage7.{uuid.uuid4().hex[:6]}")
    handler = logging.StreamHandler(buf)
    logger.addHandler(handler)
    logger.propagate = False
    install_log_redaction(Redactor(fields), logger)
    logger.warning("tool said %s and %s", SECRETS["aws_access_key"], SECRETS["github_token"])
    logger.removeHandler(handler)
    leaked_log = [k for k, v in SECRETS.items() if v.split()[-1] in buf.getvalue()]
    marked = stored.count("[REDACTED:")
    return Check.judge("redaction", not leaked_parquet and not leaked_log and marked > 0,
                       {"leaked_in_parquet": leaked_parquet, "leaked_in_logs": leaked_log, "redactions": marked},
                       "planted AWS key, GitHub token and bearer token absent from Parquet and logs",
                       "extend agentrl_cli/core/redact.py patterns or data.redact_fields")


def _create_only(store, tmp: Path) -> Check:
    key = f"harness=probe/date=2000-01-01/part-{uuid.uuid4().hex}.parquet"
    first, second = tmp / "first.bin", tmp / "second.bin"
    first.write_bytes(b"first")
    second.write_bytes(b"second")
    store.publish(first, key)
    try:
        store.publish(second, key)
        refused = False
    except AlreadyExists:
        refused = True
    content = store.get_bytes(key)
    store.delete(key)
    return Check.judge("create-only publish", refused and content == b"first", {"second_refused": refused, "content": content.decode()},
                       "a second publish of the same key fails; the first content stays",
                       "the store overwrote an existing object; S3 needs If-None-Match support (moto/MinIO/AWS do)")


def _query(store, written: list[TrajectoryRecord]) -> Check:
    text = "tool_calls >= 1 and invalid_actions > 0"
    got = filter_table(store.read_table(), text).num_rows
    expected = sum(1 for r in written if r.tool_calls >= 1 and r.invalid_actions > 0)
    return Check.judge("query by filter", got == expected and expected > 0, {"filter": text, "matched": got, "expected": expected},
                       "the filter selects exactly the rows counted independently", "see agentrl_cli/runtime/data/query.py")


def _metrics(store, written: list[TrajectoryRecord]) -> Check:
    rows = compute_metrics(store.read_table(), group_by=("harness",))
    overall = next(r for r in rows if r["harness"] == "all")
    n = len(written)
    success = sum(r.outcome == Outcome.SUCCESS for r in written) / n
    ok = overall["n"] == n and abs(overall["success_rate"] - success) < 1e-9
    return Check.judge("evaluation metrics", ok, {"n": overall["n"], "success_rate": round(overall["success_rate"], 3),
                                                  "invalid_action_ratio": overall["invalid_action_ratio"]},
                       "metrics over the stored rows match the written ones", "see agentrl_cli/runtime/data/metrics.py")


def _retention(store, tmp: Path, records: list[TrajectoryRecord], days: int) -> Check:
    old = records[0]
    when = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days + 10)
    stale = TrajectoryRecord.from_row({**old.to_row(), "trajectory_id": "stale-" + uuid.uuid4().hex[:8], "started_at": when})
    with TrajectoryWriter(store, quarantine_dir=tmp / "quarantine") as w:
        w.write(stale)
    before = store.read_table().num_rows
    report = collect_garbage(store, dt.timedelta(days=days))
    after = store.read_table().num_rows
    gone = all(f"date={stale.date}" in k for k in report["deleted"]) and len(report["deleted"]) == 1
    return Check.judge("retention", gone and after == before - 1, {"deleted_files": len(report["deleted"]), "rows_before": before,
                                                                    "rows_after": after, "older_than_days": days},
                       "only the partition older than data.retention_days is deleted", "see agentrl_cli/runtime/data/gc.py")


def _replay(store, records: list[TrajectoryRecord], platform_config) -> Check:
    ids = {}
    for r in records:
        ids.setdefault(r.harness, r.trajectory_id)
    results = {}
    for harness, tid in ids.items():
        stored = read_records(store, _id_filter(tid))
        results[harness] = replay(stored[0], platform_config=platform_config).ok if stored else False
    return Check.judge("replay with no divergence", bool(results) and all(results.values()), results,
                       "each harness's stored trajectory replays identically",
                       "run `agentrl replay TRAJECTORY_ID` to see the first divergence")


def _id_filter(tid: str):
    import pyarrow.compute as pc

    return pc.field("trajectory_id") == tid
