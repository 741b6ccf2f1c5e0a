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
