"""Fixtures that start real sandboxes (bubblewrap on this host), and a trajectory store of either kind."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from agentrl_cli.config.models import DataConfig, S3Config
from agentrl_cli.envs.sandbox import Limits, Sandbox, SandboxSettings

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install bubblewrap)")


@pytest.fixture
def sandbox_root():
    root = Path(tempfile.mkdtemp(prefix="agentrl-test-sb-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_sandbox(sandbox_root):
    made: list[Sandbox] = []

    def make(**limits) -> Sandbox:
        settings = SandboxSettings(limits=Limits().with_(**limits), root_dir=sandbox_root)
        sb = Sandbox(settings)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()


@pytest.fixture(scope="module")
def server(random_model_dir):
    """The embedded inference server on a random tiny model, in a thread (a module's own `server`
    fixture overrides this one)."""
    from agentrl_cli.engines.inference.engine import HFEngine
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.core.serving import ServerThread

    engine = HFEngine(random_model_dir, batch_window_ms=5, weight_version="3")
    srv = ServerThread(create_app(engine), name="hf").start()
    yield srv
    srv.stop()
    engine.close()


@pytest.fixture(params=["local", "s3"])
def data_config(request, tmp_path) -> DataConfig:
    """The trajectory store's config: a local directory, then a bucket on moto's S3 server (needs `aws_env`)."""
    root = str(tmp_path / "data")
    if request.param == "local":
        return DataConfig(store="local", root=root)
    import boto3

    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return DataConfig(store="s3", root=root, s3=S3Config(bucket=bucket, prefix="trajectories", endpoint_url=endpoint))
