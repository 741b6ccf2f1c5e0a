"""`agentrl stage run 7` against the local store (the default) and against an S3 endpoint (moto's
server mode on loopback), plus the `agentrl data` and `agentrl replay` commands on stored data."""

from __future__ import annotations

import shutil
import uuid

import boto3
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]
CHECKS = {"write and publish", "Hive partitions", "schema validation", "compression ratio", "redaction",
          "create-only publish", "query by filter", "evaluation metrics", "retention", "replay with no divergence"}


def _passes(cli, *sets):
    result, data = cli.json("stage", "run", "7", *sets)
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][:200]) for c in report["checks"] if c["status"] != "pass"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    assert CHECKS <= {c["name"] for c in report["checks"]}
    return report


def test_stage_7_passes_on_the_local_store_and_leaves_no_data_behind(cli, tmp_path):
    report = _passes(cli, "--set", f"data.root={tmp_path / 'data'}")
    assert report["environment"]["store"] == "local"
    assert not any((tmp_path / "data").glob("stage7-*/**/*.parquet"))


def test_stage_7_passes_against_s3(cli, aws_env, moto_endpoint, tmp_path):
    bucket = f"stage7-{uuid.uuid4().hex[:10]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    report = _passes(cli, "--set", "data.store=s3", "--set", f"data.s3.bucket={bucket}",
                     "--set", f"data.s3.endpoint_url={moto_endpoint}", "--set", f"data.root={tmp_path / 'data'}")
    assert report["environment"]["store_url"].startswith(f"s3://{bucket}/")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # its namespace was removed


def test_stage_7_reports_an_unreachable_s3_endpoint(cli, aws_env, tmp_path):
    from tests.conftest import free_port

    result, data = cli.json("stage", "run", "7", "--set", "data.store=s3",
                            "--set", f"data.s3.endpoint_url=http://127.0.0.1:{free_port()}", "--set", f"data.root={tmp_path}")
    checks = data["reports"][0]["checks"]
    assert result.exit_code == 1 and checks[0]["name"] == "store reachable" and checks[0]["status"] == "fail"
    assert "data.s3.endpoint_url" in checks[0]["hint"] and "127.0.0.1" in checks[0]["detail"]
    assert [c["status"] for c in checks[1:]] == ["skip"]
