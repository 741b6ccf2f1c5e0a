"""Where a configured harness's tasks come from, first match wins:

1. `harnesses[].tasks`: a JSONL or Parquet file (a local path, or `s3://bucket/key` read with the
   `data.s3` endpoint and credentials from the environment) whose rows carry the `TaskSpec` fields
   `task_id`, `prompt`, `answer`, `split` (train | eval) and optionally `difficulty` (default 1) and
   `meta`; a row's `harness` is ignored: the configured name wins. Its version is the file's digest.
2. The harness class's own `task_set()` (the optional `TaskSource` part of the contract; the
   built-ins' is their task set committed in this repository, `harnesses/tasksets/<name>.jsonl`).
   A `task_set(options)` that takes an argument is given `harnesses[].options` (an adapter's
   generated or read tasks depend on them: a dataset, a directory, a seed).
"""

from __future__ import annotations

import hashlib
import io
import json
from functools import lru_cache
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from harnesses.base import TaskSet, TaskSpec

REQUIRED = ("task_id", "prompt", "answer", "split")


def task_set(harness_config, data_config=None) -> TaskSet:
    """The task set of one `harnesses[]` entry (see the module docstring for the order)."""
    if getattr(harness_config, "tasks", None):
        s3 = getattr(data_config, "s3", None)
        return _from_file(harness_config.name, harness_config.tasks, getattr(s3, "endpoint_url", None),
                          getattr(s3, "region", None))
    options = getattr(harness_config, "options", None) or {}
    return builtin_or_own(harness_config.name, json.dumps(options, sort_keys=True, default=str) if options else "")


@lru_cache(maxsize=None)
def builtin_or_own(name: str, options_json: str = "") -> TaskSet:
    """The class's own task set; `options_json` (the harness's options as sorted JSON) reaches a
    `task_set(options)` that takes them."""
    import inspect

    from harnesses.registry import resolve

    cls = resolve(name)
    own = getattr(cls, "task_set", None)
    if own is None:
        raise ConfigError(f"harness {name!r} has no tasks: it defines no task_set() and harnesses[].tasks is not set",
                          "point harnesses[].tasks at a JSONL or Parquet file of tasks, or give the harness class a "
                          "task_set() classmethod")
    takes_options = bool(inspect.signature(own).parameters)
    tasks = own(json.loads(options_json) if options_json else {}) if takes_options else own()
    if not isinstance(tasks, TaskSet):
        raise ConfigError(f"{name}.task_set() returned {type(tasks).__name__}, not harnesses.base.TaskSet",
                          "return TaskSet(version, tuple_of_TaskSpec)")
    return TaskSet(tasks.version, tuple(_own(t, name) for t in tasks.tasks))


@lru_cache(maxsize=64)
def _from_file(name: str, location: str, endpoint_url: str | None, region: str | None) -> TaskSet:
    data = _read(location, endpoint_url, region)
    version = "file:" + hashlib.sha256(data).hexdigest()[:12]
    if location.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(io.BytesIO(data)).to_pylist()
    else:
        rows = []
        for i, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise ConfigError(f"harnesses[{name}].tasks: line {i} of {location} is not JSON: {exc}",
                                      "write one JSON object per line (JSONL)") from None
    return TaskSet(version, tuple(_row(r, name, location, i) for i, r in enumerate(rows, 1)))


def _read(location: str, endpoint_url: str | None, region: str | None) -> bytes:
    if location.startswith("s3://"):
        import boto3

        bucket, _, key = location.removeprefix("s3://").partition("/")
        try:
            return boto3.client("s3", endpoint_url=endpoint_url, region_name=region).get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001 - any S3 failure is a configuration problem to report
            raise ConfigError(f"harnesses[].tasks: cannot read {location}: {type(exc).__name__}: {exc}",
                              "check the bucket and key, data.s3.endpoint_url and the AWS_* credentials") from None
    path = Path(location).expanduser()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"harnesses[].tasks: cannot read {path}: {exc.strerror}",
                          "point harnesses[].tasks at an existing JSONL or Parquet file") from None


def _row(r: dict, name: str, location: str, i: int) -> TaskSpec:
    missing = [k for k in REQUIRED if r.get(k) is None]
    if missing:
        raise ConfigError(f"harnesses[{name}].tasks: row {i} of {location} lacks {', '.join(missing)}",
                          f"every row needs {', '.join(REQUIRED)} (difficulty and meta are optional)")
    if r["split"] not in ("train", "eval"):
        raise ConfigError(f"harnesses[{name}].tasks: row {i} of {location} has split {r['split']!r}",
                          "use split train or eval")
    meta = r.get("meta") or {}
    if isinstance(meta, str):
        meta = json.loads(meta)
    return TaskSpec(task_id=str(r["task_id"]), harness=name, prompt=str(r["prompt"]), answer=r["answer"],
                    difficulty=int(r.get("difficulty") or 1), split=r["split"], meta=dict(meta))


def _own(t: TaskSpec, name: str) -> TaskSpec:
    from dataclasses import replace

    return t if t.harness == name else replace(t, harness=name)
