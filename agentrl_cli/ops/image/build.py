"""Build the rendered images with docker, podman or buildah, and run `image verify` inside each.

A builder counts as present only when it works here: docker and podman answer `info` (a docker
client without a reachable daemon is not a builder), buildah answers `info`. Without one, the
result says so for each candidate and lists the exact commands that would run. A base image the
builder has neither locally nor from a registry it can reach (none here) means the build cannot
run: a skip naming the image, never a failure of the images. The wheel of agentrl is built from
its source tree into the build context first. Belongs here: detection, the build and run commands,
and their checks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import agentrl_cli
from agentrl_cli.core.report import Check, CheckStatus

CANDIDATES = ("docker", "podman", "buildah")


@dataclass
class Builder:
    name: str | None
    reasons: dict[str, str] = field(default_factory=dict)  # candidate -> why it cannot build here


def detect_builder(preferred: str = "auto", timeout: float = 15.0) -> Builder:
    reasons = {}
    for name in (CANDIDATES if preferred == "auto" else (preferred,)):
        exe = shutil.which(name)
        if exe is None:
            reasons[name] = "not installed"
            continue
        try:
            proc = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            reasons[name] = f"`{name} info` did not answer in {timeout:g} s"
            continue
        if proc.returncode == 0:
            return Builder(name, reasons)
        first = next((ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()), f"exit {proc.returncode}")
        reasons[name] = f"installed, but `{name} info` fails: {first}"
    return Builder(None, reasons)


def build_commands(builder: str, index: dict) -> list[tuple[str, list[str]]]:
    """(label, command): the build of every image in `index` (images.json), then the verify run of each role."""
    ctx = index["context"]
    cmds = []
    for img in index["images"]:
        build = ["buildah", "bud"] if builder == "buildah" else [builder, "build"]
        cmds.append((f"build {img['role']}", [*build, "-f", f"{ctx}/{img['dockerfile']}", "-t", img["tag"], ctx]))
    for img in index["images"][1:]:
        verify = ["image", "verify", "--role", img["role"], "--lock", "/opt/agentrl/agentrl.lock.json"]
        if builder == "buildah":  # no daemon and no podman: a working container from the image, run, removed
            name = f"agentrl-verify-{img['role']}"
            cmds.append((f"verify {img['role']}", ["sh", "-c", f"buildah rm {name} >/dev/null 2>&1; buildah from --name {name} "
                                                   f"{img['tag']} >/dev/null && buildah run {name} -- agentrl {' '.join(verify)}; "
                                                   f"rc=$?; buildah rm {name} >/dev/null; exit $rc"]))
        else:
            cmds.append((f"verify {img['role']}", [builder, "run", "--rm", img["tag"], *verify]))
    return cmds


def external_bases(index: dict) -> list[str]:
    """The images the rendered Dockerfiles start FROM that none of them builds (the base image's base)."""
    built = {img["tag"] for img in index["images"]}
    bases: list[str] = []
    for img in index["images"]:
        text = (Path(index["context"]) / img["dockerfile"]).read_text()
        for ref in re.findall(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", text, re.M):
            if ref not in built and ref not in bases:
                bases.append(ref)
    return bases


def missing_base(builder: str, ref: str, timeout: float = 300.0) -> str | None:
    """None when `builder` has `ref` locally or pulls it now; else why it cannot (the builder's own words)."""
    has = {"buildah": ["buildah", "inspect", "--type", "image", ref]}.get(builder, [builder, "image", "inspect", ref])
    if subprocess.run(has, capture_output=True, text=True, timeout=60).returncode == 0:
        return None
    try:
        retry = ["--retry", "1", "--retry-delay", "1s"] if builder == "buildah" else []
        proc = subprocess.run([builder, "pull", *retry, ref], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"`{builder} pull {ref}` did not finish in {timeout:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"`{builder} pull {ref}` exit {proc.returncode}"


def source_root() -> Path | None:
    root = Path(agentrl_cli.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").exists() else None


def build_wheel(context: Path) -> Path:
    root = source_root()
    if root is None:
        raise FileNotFoundError("agentrl's source tree (pyproject.toml) is not next to the installed package")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(context), str(root)],
                   check=True, capture_output=True, text=True, timeout=600)
    return next(context.glob("agentrl_cli-*.whl"))


def build_checks(index: dict, preferred: str = "auto") -> list[Check]:
    builder = detect_builder(preferred)
    would = build_commands(builder.name or "docker", index)
    if builder.name is None:
        why = "; ".join(f"{k}: {v}" for k, v in builder.reasons.items())
        steps = " && ".join(" ".join(c) for _, c in would)
        return [Check.skipped("image build and probe", f"no image builder works here ({why}). With one, this runs: {steps}",
                              "each role image builds and `agentrl image verify` passes inside it",
                              "install docker (with its daemon), podman or buildah to build here")]
    for ref in external_bases(index):
        why = missing_base(builder.name, ref)
        if why is not None:
            return [Check.skipped("image build and probe",
                                  f"{builder.name} works here, but the base image {ref} is neither in its store nor "
                                  f"pullable ({why}). With it, this runs: {' && '.join(' '.join(c) for _, c in would)}",
                                  "each role image builds and `agentrl image verify` passes inside it",
                                  f"put {ref} in {builder.name}'s store (`{builder.name} pull {ref}` where a registry is "
                                  f"reachable, or `skopeo copy oci:DIR:TAG containers-storage:{ref}`), or set "
                                  "cluster.base_image to an image it has")]
    context = Path(index["context"])
    try:
        build_wheel(context)
    except (OSError, subprocess.SubprocessError, StopIteration) as exc:
        return [Check("image build and probe", CheckStatus.FAIL, None, "agentrl's wheel builds into the context", str(exc),
                      "build from a source checkout of agentrl (pip install -e .)")]
    timings = {}
    for label, cmd in would:
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        timings[label] = round(time.monotonic() - t0, 1)
        if proc.returncode != 0:
            return [Check("image build and probe", CheckStatus.FAIL, timings, "every image builds and verifies inside",
                          f"`{' '.join(cmd)}` failed:\n{(proc.stderr or proc.stdout)[-3000:]}",
                          "if the base image cannot be pulled, pull it or set cluster.base_image to one the builder has")]
    return [Check("image build and probe", CheckStatus.PASS, {"builder": builder.name, "seconds": timings},
                  "every role image builds and `agentrl image verify` passes inside it")]
