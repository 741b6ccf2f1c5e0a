"""Fixtures that start real sandboxes (bubblewrap on this host)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agentrl_cli.sandbox import Limits, Sandbox, SandboxSettings

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
    from agentrl_cli.inference.engine import HFEngine
    from agentrl_cli.inference.hf_server import create_app
    from agentrl_cli.serving import ServerThread

    engine = HFEngine(random_model_dir, batch_window_ms=5, weight_version="3")
    srv = ServerThread(create_app(engine), name="hf").start()
    yield srv
    srv.stop()
    engine.close()
