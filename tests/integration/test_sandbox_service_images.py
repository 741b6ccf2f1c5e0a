"""The sandbox service runs images (docs/environments.md "The sandbox service and images"): a real
`agentrl serve sandbox` process whose image cache was filled by `agentrl image unpack`, and the
run's own client path (`HarnessSandboxes` with sandbox.service_url). A harness with an image gets
sandboxes rooted in it through the service; a digest the service does not hold is refused naming
it and the digests the service has, and nothing runs on the service host's root instead."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.envs.images import ImageError
from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
from tests.conftest import free_port
from tests.image_layouts import OS_RELEASE, tiny_image, traversable_dir
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
DEADLINE_S = 60.0
OTHER = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def service():
    d = traversable_dir("agentrl-test-svcimg-")
    layout = tiny_image(d / "layout")
    env = {**os.environ, "AGENTRL_SANDBOX__IMAGE_CACHE_DIR": str(d / "cache"), "AGENTRL_SANDBOX__ROOT_DIR": str(d / "sandboxes"),
           "AGENTRL_SANDBOX__POOL_SIZE": "1"}
    unpacked = subprocess.run([sys.executable, "-m", "agentrl_cli", "image", "unpack", f"oci:{layout}:tiny"],
                              capture_output=True, text=True, timeout=60, env=env)
    assert unpacked.returncode == 0, unpacked.stderr
    digest = unpacked.stdout.split()[0]
    port = free_port()
    log = d / "service.log"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "sandbox", "--insecure-loopback", "--port", str(port)],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"the sandbox service exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"the sandbox service did not answer within {DEADLINE_S} s: {log.read_text()[-2000:]}"
        time.sleep(0.1)
    yield url, layout, digest
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    shutil.rmtree(d, ignore_errors=True)


def _sandboxes(url: str, tmp_path, **harness) -> HarnessSandboxes:
    cfg = PlatformConfig.model_validate({"sandbox": {"service_url": url, "root_dir": str(tmp_path)},
                                         "harnesses": [{"name": "terminal_like", **harness}]})
    return HarnessSandboxes(cfg)


def test_a_harness_with_an_image_runs_in_it_through_the_service(service, tmp_path):
    url, layout, digest = service
    assert digest in httpx.get(f"{url}/health").json()["images"]
    # pinned by digest alone (the client has no copy), then by the client's own copy of the image
    for harness in ({"image": "oci:/not/on/this/client:tiny", "image_digest": digest}, {"image": f"oci:{layout}:tiny"}):
        sandboxes = _sandboxes(url, tmp_path, **harness)
        provider = sandboxes.for_harness("terminal_like")
        sb = provider.acquire()
        try:
            assert sb.exec(["cat", "/etc/os-release"]).stdout == OS_RELEASE.decode()
            host_only = sb.exec(["ls", sys.executable, "/usr/bin/python3"])
            assert host_only.exit_code != 0 and "cannot access" in host_only.stderr, "no host file is visible in the image"
            assert sb.exec(["sh", "-c", "echo hi > note && cat note"]).stdout == "hi\n", "the work directory is writable"
            fresh = httpx.post(f"{url}/sandboxes/{sb.id}/reset").json()  # a reset stays in the image's pool
            assert fresh["digest"] == digest
            httpx.delete(f"{url}/sandboxes/{fresh['id']}")
        finally:
            provider.release(sb)
            sandboxes.close()


def test_a_digest_the_service_does_not_hold_is_refused_naming_both(service, tmp_path):
    url, _, digest = service
    sandboxes = _sandboxes(url, tmp_path, image="oci:/elsewhere:v2", image_digest=OTHER)
    with pytest.raises(ImageError, match=f"cannot provide digest {OTHER}: .*no image with digest {OTHER}: it holds .*{digest}"):
        sandboxes.for_harness("terminal_like")
    refused = httpx.post(f"{url}/sandboxes", json={"image": "oci:/elsewhere:v2", "digest": OTHER})
    assert refused.status_code == 409 and refused.json()["detail"]["available"] == [digest]
    # the service never opens a path a client names: a directory of its host is not an image it holds
    for sneaky in ({"image": "dir:/", "digest": "dir-sha256:" + "c" * 64}, {"image": "x", "digest": "sha256:../../../etc"}):
        assert httpx.post(f"{url}/sandboxes", json=sneaky).status_code == 409, sneaky


def test_a_harness_built_by_the_registry_gets_the_service_sandboxes_of_its_image(service, tmp_path):
    """The path stage 5 takes (`harnesses.registry.create` with sandbox.service_url): the image's
    sandboxes, never the service host's root."""
    from harnesses import registry

    url, _, digest = service
    cfg = PlatformConfig.model_validate({"sandbox": {"service_url": url, "root_dir": str(tmp_path)},
                                         "harnesses": [{"name": "terminal_like", "image": "oci:/x:tiny", "image_digest": digest}]})
    h = registry.create("terminal_like", cfg)
    provider = h._provider  # the provider the harness plays its episodes with
    sb = provider.acquire()
    try:
        assert sb.exec(["cat", "/etc/os-release"]).stdout == OS_RELEASE.decode()
    finally:
        provider.release(sb)
    cfg.harnesses[0].image_digest = OTHER
    with pytest.raises(ImageError, match=OTHER):
        registry.create("terminal_like", cfg)
