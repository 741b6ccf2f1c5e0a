"""What a rehearsal asks from inside a node, as a role's process there would: `python -m
agentrl_cli.acceptance.rehearsal.probe REQUEST` (one JSON object) prints one JSON answer. The rehearsal's own
process lives in the host's network namespace, which has no route to the nodes, so every look at a
service (is it up, how many sandboxes did a replica hand out, a gateway session) is made from the
node of a role the plan lets connect.

Requests (`op`):
- `up`: `targets`, each `{"name", "url"}` (GET url, any answer below 500 counts) or `{"name", "tcp":
  "host:port"}` (a connection); answers `{"up": [names], "down": {name: why}}`.
- `http`: `method`, `url`, optional `json`, `headers` (a `bearer_file` names a key file to send as
  the bearer token); answers `{"status", "text"}` or `{"error"}`.
- `bucket`: `endpoint`, `bucket`: creates the S3 bucket unless it exists (boto3, credentials from
  the environment); answers `{"created": bool}`.
- `ledger`: `config` (a config file), `run_id`, `phase`, `ledger` (a checkpoint's directory, holding ledger.json): the
  run's trajectories in its trajectory store against the draws the ledger says were trained
  (`acceptance/chaos/losses.py`): stored, trained, missing (trained, not stored), stored twice.

Belongs here: the few client calls a rehearsal makes from a node. Does not: which node asks what
(`rehearsal.py`).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx


def _up(targets: list[dict], timeout: float) -> dict:
    up, down = [], {}
    for t in targets:
        try:
            if "tcp" in t:
                host, _, port = t["tcp"].rpartition(":")
                with socket.create_connection((host, int(port)), timeout=timeout):
                    pass
            else:
                r = httpx.get(t["url"], timeout=timeout)
                if r.status_code >= 500:
                    raise OSError(f"HTTP {r.status_code}")
            up.append(t["name"])
        except (OSError, httpx.HTTPError) as exc:
            down[t["name"]] = f"{type(exc).__name__}: {exc}"[:200]
    return {"up": up, "down": down}


def _http(req: dict, timeout: float) -> dict:
    headers = dict(req.get("headers") or {})
    if req.get("bearer_file"):
        key = Path(req["bearer_file"]).read_text(encoding="utf-8").splitlines()[0].strip()
        headers["Authorization"] = f"Bearer {key}"
    try:
        r = httpx.request(req.get("method", "GET"), req["url"], json=req.get("json"), headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"status": r.status_code, "text": r.text[:20000]}


def _bucket(req: dict) -> dict:
    import boto3

    s3 = boto3.client("s3", endpoint_url=req["endpoint"], region_name=req.get("region", "us-east-1"))
    names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if req["bucket"] in names:
        return {"created": False}
    s3.create_bucket(Bucket=req["bucket"])
    return {"created": True}


def _ledger(req: dict) -> dict:
    from agentrl_cli.acceptance.chaos.losses import loss_ledger
    from agentrl_cli.config.load import load_config
    from agentrl_cli.runtime.data.stores import open_store

    cfg = load_config(Path(req["config"])).config
    from agentrl_cli.run.loop.ledger import read_ledger

    entries = read_ledger(Path(req["ledger"])) or []
    found = loss_ledger(open_store(cfg.data), run_id=req["run_id"], phase=req["phase"], ledger=entries, reference=entries,
                        attempts=[])
    return {k: found[k] for k in ("stored", "trained", "trained_masked", "missing", "duplicated", "stored_twice",
                                  "trained_not_stored", "spooled_not_uploaded")}


def answer(req: dict) -> dict:
    timeout = float(req.get("timeout", 5.0))
    op = req.get("op")
    if op == "up":
        return _up(req["targets"], timeout)
    if op == "http":
        return _http(req, timeout)
    if op == "bucket":
        return _bucket(req)
    if op == "ledger":
        return _ledger(req)
    return {"error": f"unknown op {op!r}"}


if __name__ == "__main__":
    print(json.dumps(answer(json.loads(sys.argv[1]))))
