"""Harbor tasks in their environment (`harnesses/adapters/harbor_image.py`, `envs/images/dockerfile.py`):
a task's environment/Dockerfile built with buildah (no daemon, FROM a local OCI layout) and the
episode, the verifier's run included, in the image built from it; a second build of the unchanged
task is a cache hit; a task that cannot be built runs in the fallback and its episode says why.

The base image is made by the test: the host's sh, bash, coreutils the harness uses and dpkg (a few
megabytes, no Python). "A package" is a .deb made by the test with dpkg-deb and installed by the
Dockerfile's RUN dpkg -i, so the build needs no network; a RUN step's view (no network, its own
processes only) is checked too (docs/security.md row 37)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.images.dockerfile import BuildError
from agentrl_cli.envs.sandbox import SandboxSettings
from harnesses.adapters.harbor import HarborHarness
from harnesses.base import Action, Trajectory
from harnesses.parsing import tool_call
from tests.image_layouts import entry, tar_layer, tiny_rootfs_entries, traversable_dir, write_layout
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
needs_buildah = pytest.mark.skipif(shutil.which("buildah") is None,
                                   reason="buildah is not installed (apt-get install -y buildah): no Dockerfile can be built here")
PROGRAMS = ("sh", "bash", "cat", "ls", "find", "mkdir", "xargs", "tail", "rm", "dpkg", "dpkg-deb", "dpkg-split", "dpkg-query", "tar")
DOCKERFILE = """\
    FROM python:3.12-slim
    WORKDIR /app
    COPY data.txt /app/data.txt
    COPY note.txt /etc/agentrl-note
    COPY probe.deb /tmp/probe.deb
    RUN dpkg --force-bad-path -i /tmp/probe.deb && rm /tmp/probe.deb
    RUN bash -c 'ls /proc > /etc/procs; (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reached > /etc/net || echo none > /etc/net'
"""
TEST_SH = """\
    #!/bin/sh
    if [ "$(cat answer.txt)" = "probe-installed $(cat data.txt)" ] && dpkg -s agentrl-probe >/dev/null; then
      echo 1 > /logs/verifier/reward.txt
    else
      echo 0 > /logs/verifier/reward.txt
    fi
"""


def _base_image(d: Path) -> str:
    dpkg_dirs = [entry(p, kind=tarfile.DIRTYPE) for p in ("var/", "var/lib/", "var/lib/dpkg/", "var/lib/dpkg/info/",
                                                        "var/lib/dpkg/updates/")]
    layer = tar_layer(tiny_rootfs_entries(PROGRAMS) + dpkg_dirs + [entry("var/lib/dpkg/status", b""),
                                                                   entry("tmp/", kind=tarfile.DIRTYPE, mode=0o1777)])
    write_layout(d / "base", [layer], tag="tiny")
    return f"oci:{d / 'base'}:tiny"


def _base_archive(d: Path) -> str:
    """The same base as an OCI archive (a tar of the layout, as `skopeo copy … oci-archive:` writes)."""
    _base_image(d)
    with tarfile.open(d / "base.tar", "w") as tar:
        for p in sorted((d / "base").rglob("*")):
            tar.add(p, arcname=p.relative_to(d / "base").as_posix(), recursive=False)
    return f"oci-archive:{d / 'base.tar'}:tiny"


def _deb(d: Path) -> bytes:
    pkg = d / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text("Package: agentrl-probe\nVersion: 1.0\nArchitecture: all\n"
                                            "Maintainer: agentrl tests <tests@agentrl.invalid>\nDescription: a probe\n")
    (pkg / "usr" / "bin" / "agentrl-probe").write_text("#!/bin/sh\necho probe-installed\n")
    (pkg / "usr" / "bin" / "agentrl-probe").chmod(0o755)
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "-b", str(pkg), str(d / "probe.deb")], check=True, capture_output=True)
    return (d / "probe.deb").read_bytes()


@pytest.fixture(scope="module")
def place():
    d = traversable_dir("agentrl-test-harbor-img-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _task(root: Path, name: str, dockerfile: str, deb: bytes = b"") -> Path:
    t = root / name
    files = {"instruction.md": "Write what agentrl-probe prints, a space and the content of data.txt to answer.txt.\n",
             "task.toml": 'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 20.0\n',
             "environment/Dockerfile": textwrap.dedent(dockerfile), "environment/data.txt": "from-copy\n",
             "environment/note.txt": "a file the Dockerfile put outside the WORKDIR\n", "tests/test.sh": textwrap.dedent(TEST_SH),
             "solution/solve.sh": 'echo "$(agentrl-probe) $(cat data.txt)" > answer.txt\n'}
    for rel, text in files.items():
        (t / rel).parent.mkdir(parents=True, exist_ok=True)
        (t / rel).write_text(text)
    (t / "tests" / "test.sh").chmod(0o755)
    if deb:
        (t / "environment" / "probe.deb").write_bytes(deb)
    return t


def _harness(place: Path, sandbox_root: Path, tasks: Path, **options) -> HarborHarness:
    settings = SandboxSettings(root_dir=sandbox_root, image_cache_dir=place / "unpacked")
    return HarborHarness(tasks_dir=str(tasks), settings=settings, build_dir=str(place / "built"), **options)


def _play(h: HarborHarness, *commands: str) -> Trajectory:
    task = HarborHarness.task_set({"tasks_dir": h.tasks_dir}).select("eval")[0]
    traj = Trajectory(task=task, observations=[h.reset(task)])
    for command in commands:
        traj.actions.append(Action(text=tool_call("run_shell", command=command)))
        traj.observations.append(h.step(traj.actions[-1]))
    return traj


@needs_buildah
def test_a_task_whose_dockerfile_adds_a_file_and_a_package_runs_in_the_image_built_from_it(place, sandbox_root):
    tasks = place / "tasks-built"
    listener = socket.create_server(("127.0.0.1", 0))  # a host service a RUN step must not reach
    _task(tasks, "probe", DOCKERFILE.format(port=listener.getsockname()[1]), _deb(place))
    bases = {"python:3.12-slim": _base_archive(place / "archived")}  # the long test below builds FROM a layout
    h = _harness(place, sandbox_root, tasks, build="auto", base_images=bases)
    try:
        traj = _play(h, "cat /etc/agentrl-note; agentrl-probe; dpkg -s agentrl-probe; ls /usr/bin/python3",
                     'echo "$(agentrl-probe) $(cat data.txt)" > answer.txt')
        env = traj.observations[0].info["harbor_environment"]
        assert env["environment"] == "built" and env["digest"].startswith("sha256:") and env["build_cached"] is False, env
        assert h.episode_image_digest == env["digest"], "the trajectory is stored with the task's image digest"
        seen = traj.observations[1].text
        assert "a file the Dockerfile put outside the WORKDIR" in seen and "probe-installed" in seen
        assert "Status: install ok installed" in seen, "dpkg in the image knows the package the RUN installed"
        assert "cannot access '/usr/bin/python3'" in seen, "the episode runs in the built image, not on the host's root"
        assert "data.txt" in traj.observations[0].text, "the image's WORKDIR files are in the working directory"
        assert h.compute_reward(traj) == 1.0, "test.sh, run in the built image, sees the package and the answer"
        root = h.episode_provider().settings.image_root
        assert (root / "etc/net").read_text() == "none\n", "a RUN step has no network (build_network is off)"
        assert len([p for p in (root / "etc/procs").read_text().split() if p.isdigit()]) < 10, "nor the host's processes"
    finally:
        h.close()
        listener.close()
    again = _harness(place, sandbox_root, tasks, build="auto", base_images=bases)
    try:
        env2 = _play(again).observations[0].info["harbor_environment"]
        assert env2["build_cached"] is True and env2["digest"] == env["digest"], "an unchanged task is not built again"
    finally:
        again.close()
    _replay_checks_the_tasks_image(place, tasks, bases, traj.task.task_id, env["digest"])


def _replay_checks_the_tasks_image(place: Path, tasks: Path, bases: dict, task_id: str, digest: str) -> None:
    """Replay compares a stored trajectory's image digest with the task's built image (a cache hit here)."""
    from agentrl_cli.config import load_config
    from agentrl_cli.runtime.data.replay import ImageMismatch, check_image
    from agentrl_cli.runtime.data.schema import TrajectoryRecord

    options = {"tasks_dir": str(tasks), "build": "auto", "base_images": bases, "build_dir": str(place / "built")}
    (place / "replay.yaml").write_text(json.dumps({"harnesses": [{"name": "harbor", "options": options}]}))
    config = load_config(place / "replay.yaml", [], env={}).config

    def record(image_digest: str) -> TrajectoryRecord:
        return TrajectoryRecord(run_id="r", task_id=task_id, harness="harbor", harness_version="1.0", trajectory_id="t",
                                image_digest=image_digest)

    check_image(record(digest), config)
    with pytest.raises(ImageMismatch, match=re.escape(f"ran in the host's root filesystem (no image), but harbor would replay it in image {digest}")):
        check_image(record(""), config)


def test_a_task_whose_from_cannot_be_resolved_runs_in_the_fallback_and_says_why(place, sandbox_root):
    tasks = place / "tasks-fallback"
    _task(tasks, "unresolvable", "FROM registry.example/private:1\nWORKDIR /app\nCOPY data.txt /app/\n")
    h = _harness(place, sandbox_root, tasks, build="auto", base_images={"*": ""})
    try:
        traj = _play(h, "cat data.txt; ls /usr/bin/python3")
        env = traj.observations[0].info["harbor_environment"]
        assert env["environment"] == "fallback" and env["image"] == "host", env
        assert "FROM registry.example/private:1 has no local image" in env["reason"] and "base_images" in env["reason"]
        assert "from-copy" in traj.observations[1].text and "/usr/bin/python3" in traj.observations[1].text
        verdict = h.compute_reward(traj)
        assert "environment_fallback" in verdict.flags and "has no local image" in verdict.detail, verdict
    finally:
        h.close()


def test_a_required_build_that_cannot_be_done_is_refused_naming_the_reason(place, sandbox_root):
    tasks = place / "tasks-required"
    _task(tasks, "unresolvable", "FROM registry.example/private:1\nWORKDIR /app\n")
    if shutil.which("buildah") is None:
        with pytest.raises(ConfigError, match="'required', but buildah is not installed"):
            _harness(place, sandbox_root, tasks, build="required")
        return
    h = _harness(place, sandbox_root, tasks, build="required", base_images={"*": ""})
    try:
        with pytest.raises(BuildError, match="FROM registry.example/private:1 has no local image"):
            _play(h)
    finally:
        h.close()


def test_a_configured_fallback_image_roots_the_episode_and_its_digest_is_recorded(place, sandbox_root):
    tasks = place / "tasks-fallback-image"
    _task(tasks, "off", "FROM python:3.12-slim\nWORKDIR /app\nCOPY data.txt /app/\n")
    h = _harness(place, sandbox_root, tasks, fallback_image=_base_image(place / "fb"))  # build: off, the default
    try:
        traj = _play(h, "cat data.txt; ls /usr/bin/python3")
        env = traj.observations[0].info["harbor_environment"]
        assert env["environment"] == "fallback" and env["reason"].startswith("build is off"), env
        assert env["image"].endswith(":tiny") and env["digest"].startswith("sha256:")
        assert "from-copy" in traj.observations[1].text and "cannot access '/usr/bin/python3'" in traj.observations[1].text
    finally:
        h.close()


SHIPPED = ("count-lines", "fix-script", "write-greeting")


@pytest.mark.long
@needs_buildah
@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_task_built_from_the_env_image_scores_full_reward_in_it(place, sandbox_root, name):
    from agentrl_cli.ops.image.env_image import EnvInputs, cached_image, default_cache_root

    if cached_image(default_cache_root(), EnvInputs()) is None:
        pytest.skip("the env image is not built here: run `agentrl image build --role env` (minutes, once)")
    from harnesses.adapters.harbor_format import DEFAULT_TASKS_DIR
    from harnesses.contract import play

    h = _harness(place, sandbox_root, DEFAULT_TASKS_DIR / name, build="required")  # base_images: every FROM -> env
    try:
        traj, last = play(h, HarborHarness.task_set({"tasks_dir": h.tasks_dir}).select("eval")[0], policy=HarborHarness.scripted_action)
        env = traj.observations[0].info["harbor_environment"]
        assert env["environment"] == "built" and env["digest"].startswith("sha256:"), env
        assert last.done and h.compute_reward(traj) == 1.0, [o.text for o in traj.observations]
        assert h.sandbox is None and h.episode_provider().settings.image_root is not None
    finally:
        h.close()
