"""Sandboxes rooted in an image (docs/security.md rows 31-35), against real bubblewrap: the image's
root is the read-only /, the work directory and /tmp are writable, nothing of the host is visible,
and an image that cannot be found or verified refuses to start (exit 2, naming the image and why).
The image is a few megabytes made by the test from the host's own sh, cat and ls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_cli.config.models import HarnessConfig
from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings, SandboxUnavailable
from tests.image_layouts import OS_RELEASE, tiny_image, traversable_dir
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


@pytest.fixture(scope="module")
def image_dirs():
    d = traversable_dir("agentrl-test-img-")
    tiny_image(d / "layout")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def settings(image_dirs, sandbox_root) -> SandboxSettings:
    return SandboxSettings(root_dir=sandbox_root, image_cache_dir=image_dirs / "cache")


def _cli(image_dirs: Path, image: str, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTRL_SANDBOX__IMAGE_CACHE_DIR": str(image_dirs / "cache"),
           "AGENTRL_SANDBOX__ROOT_DIR": str(image_dirs / "sandboxes")}
    return subprocess.run([sys.executable, "-m", "agentrl_cli", "sandbox", "run", "--image", image, "--", *command],
                          capture_output=True, text=True, timeout=60, env=env)


def test_sandbox_run_in_an_image_shows_the_images_release(image_dirs):
    proc = _cli(image_dirs, f"oci:{image_dirs / 'layout'}:tiny", "cat", "/etc/os-release")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == OS_RELEASE.decode()


def test_host_only_paths_are_not_visible_in_an_image(image_dirs):
    secret = image_dirs / "host-only-secret"
    secret.write_text("host secret\n")
    os.chmod(secret, 0o644)
    proc = _cli(image_dirs, f"oci:{image_dirs / 'layout'}:tiny", "ls", str(secret), "/usr/bin/python3", "/etc/hostname")
    assert proc.returncode != 0
    assert f"cannot access '{secret}'" in proc.stderr and "cannot access '/usr/bin/python3'" in proc.stderr
    assert "/etc/hostname" in proc.stdout, "the image's own files are there"


def test_an_images_sandbox_writes_only_its_work_directory_and_tmp(settings, image_dirs):
    with Sandbox(settings.with_image(f"oci:{image_dirs / 'layout'}:tiny")) as sb:
        r = sb.exec(["sh", "-c", "echo w > /work/f && echo t > /tmp/f && cat /work/f /tmp/f; echo x > /etc/f || echo refused"])
        assert r.stdout.split() == ["w", "t", "refused"] and "Read-only file system" in r.stderr
        assert sb.read_file("f") == b"w\n"
        mounts = [line.split() for line in sb.exec(["cat", "/proc/self/mountinfo"]).stdout.splitlines()]
        usr = next(m for m in mounts if m[4] == "/usr")
        assert {"ro", "nosuid", "nodev"} <= set(usr[5].split(",")), "the image is mounted read-only, nosuid, nodev"
        assert sb.describe()["image"]["digest"].startswith("sha256:") and sb.describe()["seccomp"] == "loaded"


def test_a_harness_image_roots_its_sandboxes_and_no_image_keeps_the_host_root(settings, image_dirs):
    with Sandbox(settings.for_harness(HarnessConfig(name="h", image=f"oci:{image_dirs / 'layout'}:tiny"))) as sb:
        assert sb.exec(["cat", "/etc/os-release"]).stdout == OS_RELEASE.decode()
    with Sandbox(settings.for_harness(HarnessConfig(name="h"))) as sb:
        assert sb.exec(["ls", "/usr/bin/python3"]).exit_code == 0 and sb.describe()["image"] == "host"


def test_a_root_filesystem_directory_is_an_image(settings, image_dirs):
    rootfs = image_dirs / "dir-image"
    shutil.copytree(settings.with_image(f"oci:{image_dirs / 'layout'}:tiny").image_root, rootfs, symlinks=True)
    (rootfs / "etc/os-release").write_text('NAME="from a directory"\n')
    with Sandbox(settings.with_image(f"dir:{rootfs}")) as sb:
        assert sb.exec(["cat", "/etc/os-release"]).stdout == 'NAME="from a directory"\n'


def test_the_process_backend_refuses_an_image(settings, image_dirs):
    with pytest.raises(SandboxUnavailable, match="process backend cannot root a sandbox in an image"):
        Sandbox(SandboxSettings(backend="process", root_dir=settings.root_dir, image_cache_dir=settings.image_cache_dir)
                .with_image(f"oci:{image_dirs / 'layout'}:tiny"))


def test_32_34_a_corrupted_or_missing_image_exits_2_naming_it_and_the_reason(image_dirs, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(image_dirs / "layout", bad)
    layer = max((bad / "blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    layer.write_bytes(bytes(data))
    proc = _cli(image_dirs, f"oci:{bad}:tiny", "cat", "/etc/os-release")
    assert proc.returncode == 2 and f"digest mismatch in blob sha256:{layer.name}" in proc.stderr
    assert f"oci:{bad}:tiny" in proc.stderr and "agentrl tiny" not in proc.stdout, "never a silent fallback"
    proc = _cli(image_dirs, f"oci:{tmp_path / 'missing'}:tiny", "cat", "/etc/os-release")
    assert proc.returncode == 2 and "no OCI layout directory" in proc.stderr and proc.stdout == ""


def test_a_harness_pool_hands_out_warm_sandboxes_rooted_in_its_image(image_dirs, sandbox_root):
    import time

    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.envs.sandbox.provider import HarnessSandboxes

    os.chmod(sandbox_root, 0o711)  # the run's directory goes below it, and the sandbox user binds from there
    cfg = PlatformConfig.model_validate({
        "sandbox": {"root_dir": str(sandbox_root), "image_cache_dir": str(image_dirs / "cache"), "pool_size": 2},
        "harnesses": [{"name": "terminal_like", "image": f"oci:{image_dirs / 'layout'}:tiny"}, {"name": "tool_api_like"}]})
    sandboxes = HarnessSandboxes(cfg)
    try:
        image_pool = sandboxes.for_harness("terminal_like").inner
        deadline = time.monotonic() + 60
        while image_pool.metrics()["warm"] == 0:  # the pool starts its sandboxes in the background
            assert time.monotonic() < deadline, f"no warm sandbox within 60 s: {image_pool.metrics()}"
            time.sleep(0.02)
        sb = sandboxes.for_harness("terminal_like").acquire()
        assert image_pool.counters["warm_hits"] == 1, "handed out from the warm pool"
        assert sb.settings.image_root == image_pool.settings.image_root and sb.settings.image_digest.startswith("sha256:")
        assert sb.exec(["cat", "/etc/os-release"]).stdout == OS_RELEASE.decode()
        sandboxes.for_harness("terminal_like").release(sb)
        host = sandboxes.for_harness("tool_api_like").acquire()
        assert host.settings.image_root is None, "a harness with no image keeps the host-rooted pool"
        assert host.exec(["cat", "/etc/os-release"]).stdout != OS_RELEASE.decode()
        sandboxes.for_harness("tool_api_like").release(host)
    finally:
        final = sandboxes.close()
    assert final["sandbox/leaked_processes"] == 0


def test_a_docker_archive_and_an_oci_archive_run_like_the_layout(image_dirs):
    from tests.image_layouts import docker_archive, oci_archive, tar_layer, tiny_rootfs_entries

    docker_archive(image_dirs / "docker.tar", [tar_layer(tiny_rootfs_entries(), gz=True)], ["agentrl/tiny:1"])
    oci_archive(image_dirs / "layout", image_dirs / "oci.tar")
    for image in (f"docker-archive:{image_dirs / 'docker.tar'}:agentrl/tiny:1", f"oci-archive:{image_dirs / 'oci.tar'}:tiny"):
        proc = _cli(image_dirs, image, "cat", "/etc/os-release")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == OS_RELEASE.decode()
