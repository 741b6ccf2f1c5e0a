"""Stage 1's object-store probe against the local store, an S3 endpoint (moto's server mode on
loopback) and an endpoint that is down."""

from __future__ import annotations

import uuid

import boto3
import pytest

from agentrl_cli.ops.bench.objectstore import probe_store
from agentrl_cli.config import load_config
from tests.conftest import free_port

pytestmark = pytest.mark.integration
OPS = ["object store reachable", "object store put", "object store list", "object store get",
       "object store create-only put", "object store delete"]


def test_local_store_passes_and_leaves_nothing(tmp_path):
    cfg = load_config(None, [f"data.root={tmp_path / 'new' / 'trajectories'}"]).config
    checks = probe_store(cfg.data)
    assert [c.name for c in checks] == OPS and all(c.status == "pass" for c in checks), checks
    assert checks[1].measured["key"].startswith("harness=agentrl-probe/date=")
    assert not (tmp_path / "new").exists()  # directories the probe created are removed again


def test_s3_store_passes_and_the_probe_object_is_gone(aws_env, moto_endpoint):
    bucket = f"probe-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    cfg = load_config(None, ["data.store=s3", f"data.s3.endpoint_url={moto_endpoint}", f"data.s3.bucket={bucket}"]).config
    checks = probe_store(cfg.data)
    assert [c.status for c in checks] == ["pass"] * 6, [(c.name, c.detail) for c in checks]
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_unreachable_store_is_one_failing_check_with_a_hint(aws_env, tmp_path):
    cfg = load_config(None, ["data.store=s3", f"data.s3.endpoint_url=http://127.0.0.1:{free_port()}",
                             f"data.root={tmp_path}"]).config
    checks = probe_store(cfg.data)
    assert len(checks) == 1 and checks[0].status == "fail"
    assert "127.0.0.1" in checks[0].detail and "data.s3.endpoint_url" in checks[0].hint
