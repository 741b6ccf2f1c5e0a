"""`agentrl verify`'s connectivity probe of a sandbox service: a real `agentrl serve sandbox` process.
The sandbox's work directory lives on the service's host, so whether it was reclaimed is the
service's to say (the sandbox it held is gone: 404), not a path looked up on the verifying host:
there a remote path is absent on another machine and, on a shared file system, can still be there
after the service released the sandbox to its warm pool."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from agentrl_cli.acceptance.verify.connectivity import sandbox_check
from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.report import CheckStatus
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def test_the_sandbox_probe_asks_the_service_whether_it_reclaimed_the_sandbox(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    log = (tmp_path / "sandbox.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "sandbox", "--insecure-loopback", "--port", str(port)],
                            env=env, cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "sandbox.log").read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the sandbox service never answered /health"
            time.sleep(0.1)
        cfg = PlatformConfig.model_validate({"sandbox": {"service_url": f"http://127.0.0.1:{port}"}})
        check = sandbox_check(cfg)
        assert check.status == CheckStatus.PASS, (check.measured, check.detail)
        assert check.measured["workdir_removed"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=30)
