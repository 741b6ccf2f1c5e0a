"""`image build --role env`: the built-in harnesses' environment image from Debian's packages, with
no daemon: mmdebstrap writes a minimal root filesystem tar (variant minbase, plus a shell,
coreutils and Python 3), `envs/images/layout.py` turns it into an OCI layout tagged `env`. The
layout sits in a cache directory named by the hash of its inputs (release, mirror, variant,
packages), so unchanged inputs reuse it. Belongs here: the inputs, the cache and the mmdebstrap
run. Not here: the layout's files (`layout.py`), Dockerfile role images (`build.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.core.errors import AgentrlError

RELEASE = "bookworm"  # Debian 12, this host's release
MIRROR = "http://deb.debian.org/debian"
VARIANT = "minbase"
PACKAGES = ("bash", "coreutils", "python3")  # what the built-in harnesses run: a shell, coreutils, Python 3
TAG = "env"
INSTALL_FIX = "apt-get install -y mmdebstrap"


class BuilderMissing(AgentrlError):
    """mmdebstrap is not installed."""


class BuildFailed(AgentrlError):
    """mmdebstrap ran and failed."""

    exit_code = 1


@dataclass(frozen=True)
class EnvInputs:
    release: str = RELEASE
    mirror: str = MIRROR
    variant: str = VARIANT
    packages: tuple[str, ...] = field(default=PACKAGES)

    def key(self) -> str:
        """The first 16 hex digits of the sha256 of the inputs: the cache directory's name."""
        doc = {"release": self.release, "mirror": self.mirror, "variant": self.variant, "packages": sorted(self.packages)}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EnvImage:
    path: Path
    digest: str  # the manifest's sha256
    cached: bool
    seconds: float
    inputs: EnvInputs

    @property
    def reference(self) -> str:
        return f"oci:{self.path}:{TAG}"


def default_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl" / "images"


def cached_image(root: Path, inputs: EnvInputs) -> EnvImage | None:
    """The image already built from `inputs` under `root`, every blob verified; None if absent or broken."""
    from agentrl_cli.envs.images.oci import read_manifest
    from agentrl_cli.envs.images.reference import ImageError, parse

    path = root / f"env-{inputs.key()}"
    if not (path / "index.json").is_file():
        return None
    t0 = time.monotonic()
    try:
        manifest = read_manifest(parse(f"oci:{path}:{TAG}"))
    except ImageError:
        return None
    return EnvImage(path, manifest.digest, True, round(time.monotonic() - t0, 2), inputs)


def mmdebstrap_command(inputs: EnvInputs, out_tar: Path) -> list[str]:
    return ["mmdebstrap", f"--variant={inputs.variant}", f"--include={','.join(inputs.packages)}", "--format=tar",
            inputs.release, str(out_tar), inputs.mirror]


def _run_mmdebstrap(cmd: list[str], progress: Callable[[str], None]) -> None:
    """Run mmdebstrap, passing each line it prints to `progress`; BuildFailed with its last lines."""
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout or ():
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        progress(line)
    if proc.wait() != 0:
        raise BuildFailed(f"`{' '.join(cmd)}` exited {proc.returncode}:\n" + "\n".join(tail),
                          "check that the mirror is reachable (apt-get update) and the package names exist in the release")


def build_env_image(root: Path, inputs: EnvInputs = EnvInputs(), progress: Callable[[str], None] = lambda _: None,
                    force: bool = False) -> EnvImage:
    """The environment image for `inputs` under `root`: the cached one when it is whole and `force`
    is off, else built now (minutes the first time: mmdebstrap downloads and unpacks the packages)."""
    from agentrl_cli.envs.images.layout import write_layout

    if not force and (hit := cached_image(root, inputs)) is not None:
        return hit
    if shutil.which("mmdebstrap") is None:
        raise BuilderMissing("mmdebstrap is not installed: it builds the environment image from Debian's packages without a daemon",
                             INSTALL_FIX)
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrl-env-", dir=root) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        progress(f"mmdebstrap {inputs.release} ({inputs.variant} + {', '.join(inputs.packages)}) from {inputs.mirror}")
        _run_mmdebstrap(mmdebstrap_command(inputs, tar), progress)
        progress(f"writing the OCI layout ({tar.stat().st_size >> 20} MiB root filesystem)")
        path = root / f"env-{inputs.key()}"
        labels = {"org.opencontainers.image.title": "agentrl env", "agentrl.inputs": inputs.key(),
                  "agentrl.packages": ",".join(inputs.packages), "agentrl.release": inputs.release}
        digest = write_layout(tar, path, TAG, labels)
    return EnvImage(path, digest, False, round(time.monotonic() - t0, 1), inputs)
