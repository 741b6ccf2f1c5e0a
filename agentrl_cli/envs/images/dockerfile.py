"""Building a Dockerfile's context into an OCI layout with buildah, no daemon, no registry.

Every external `FROM` must be given as a locally available image (`bases`: FROM name ->
`oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]` or `docker-archive:FILE[:TAG]`); none is pulled from a registry. The build runs as this user with
`--isolation chroot` and the vfs storage driver in a private storage root under the cache
(`<cache_root>/buildah/`), inside new PID and IPC namespaces (`unshare`) and, unless `network`, a
new empty network namespace: a RUN step runs in a chroot of the build container as root with
buildah's reduced capabilities and seccomp profile, seeing none of the host's processes (buildah's
oci isolation needs cgroup controls this host lacks; see docs/security.md row 37). The result is
pushed to `<cache_root>/dockerfile-<key>` tagged `built`, where `key` hashes the context (every
file's path, mode and bytes), the base images' manifest digests, `FORMAT` and whether RUN had a
network; an unchanged context over unchanged bases is a cache hit (one manifest read, no build).

    build(Path("task/environment"), {"python:3.12-slim": "oci:/images/env:env"}, Path("~/.cache/x"))

Belongs here: the Dockerfile's FROMs, the cache key, the buildah runs. Not here: which base an
image name maps to (the caller's policy), unpacking the result (`cache.py`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.envs.images import oci
from agentrl_cli.envs.images.cache import digest_of
from agentrl_cli.envs.images.reference import ImageError, parse

FORMAT = "1"  # bump when the build's recipe changes, so old cache entries are not reused
TAG = "built"
TRANSPORTS = ("oci", "oci-archive", "docker-archive")  # the references a base may be: buildah pulls each as it is
INSTALL_FIX = "apt-get install -y buildah"
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE | re.MULTILINE)
_CONTINUATION = re.compile(r"\\\n")


class BuildError(ImageError):
    """A Dockerfile cannot be built here: the builder is missing, a FROM has no local image, or the build failed."""


@dataclass(frozen=True)
class Built:
    image: str  # oci:<path>:built
    digest: str  # the manifest's sha256
    cached: bool
    seconds: float


def builder_missing() -> str:
    """Why no build can run here ('' when buildah is installed)."""
    return "" if shutil.which("buildah") else "buildah is not installed"


def external_froms(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM, in order, without `scratch` and earlier stages' names."""
    stages: set[str] = set()
    out: list[str] = []
    for image, alias in _FROM.findall(_CONTINUATION.sub(" ", dockerfile)):
        if image.lower() != "scratch" and image.lower() not in stages and image not in out:
            out.append(image)
        if alias:
            stages.add(alias.lower())
    return out


def context_digest(context: Path) -> str:
    """sha256 over every file of the build context (path, mode, bytes; symlinks by target), sorted."""
    h = hashlib.sha256()
    for top, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(top, d))]):
            p = os.path.join(top, name)
            rel = os.path.relpath(p, context)
            st = os.lstat(p)
            body = os.readlink(p).encode() if os.path.islink(p) else Path(p).read_bytes()
            h.update(f"{rel}\0{st.st_mode:o}\0{len(body)}\0".encode("utf-8", "surrogateescape") + body)
    return h.hexdigest()


def _base_digests(context: Path, bases: dict[str, str]) -> dict[str, str]:
    """FROM name -> the manifest digest of its local image (verified); BuildError naming an unmapped FROM."""
    dockerfile = context / "Dockerfile"
    try:
        froms = external_froms(dockerfile.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BuildError(str(context), f"no readable Dockerfile: {exc.strerror}") from None
    out = {}
    for name in froms:
        if "$" in name:
            raise BuildError(str(dockerfile), f"FROM {name} uses a build argument, which is not resolved here",
                             "write the base image's name in the FROM line")
        ref = bases.get(name)
        if not ref:
            raise BuildError(str(dockerfile), f"FROM {name} has no local image, and images are not pulled from a registry",
                             f"map {name!r} to an OCI layout (oci:DIR:TAG) in the harness's base_images option")
        if parse(ref).kind not in TRANSPORTS:
            raise BuildError(ref, f"the base image of FROM {name} must be an OCI layout or archive ({', '.join(TRANSPORTS)})",
                             "save the root filesystem as an OCI layout, e.g. with `agentrl image build --role env`")
        out[name] = digest_of(ref)
    return out


def build(context: Path, bases: dict[str, str], cache_root: Path, progress: Callable[[str], None] = lambda _: None,
          network: bool = False) -> Built:
    """The OCI layout built from `context` (its Dockerfile), from cache when the context and the bases
    are unchanged; BuildError when it cannot be built (the reason and buildah's last lines in it).
    `network`: RUN steps reach the host's network (else they have none)."""
    t0 = time.monotonic()
    digests = _base_digests(context, bases)
    key = hashlib.sha256("\0".join([FORMAT, f"network={network}", context_digest(context)]
                                   + [f"{n}={d}" for n, d in sorted(digests.items())])
                         .encode()).hexdigest()[:16]
    cache_root = cache_root.expanduser()
    dest = cache_root / f"dockerfile-{key}"
    if (hit := _cached(dest)) is not None:
        return Built(f"oci:{dest}:{TAG}", hit, True, round(time.monotonic() - t0, 3))
    if reason := builder_missing():
        raise BuildError(str(context), reason, INSTALL_FIX)
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: base tags are re-pointed per build
        if (hit := _cached(dest)) is not None:
            return Built(f"oci:{dest}:{TAG}", hit, True, round(time.monotonic() - t0, 3))
        _build(context, bases, digests, cache_root, dest, key, progress, network)
    digest = oci.read_manifest(parse(f"oci:{dest}:{TAG}")).digest
    return Built(f"oci:{dest}:{TAG}", digest, False, round(time.monotonic() - t0, 1))


def _cached(dest: Path) -> str | None:
    if not (dest / "index.json").is_file():
        return None
    try:
        return oci.read_manifest(parse(f"oci:{dest}:{TAG}")).digest
    except ImageError:
        return None


def _buildah(cache_root: Path) -> list[str]:
    store = cache_root / "buildah"
    return ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]


def _run(cmd: list[str], context: Path, progress: Callable[[str], None], cwd: Path | None = None) -> str:
    """Run one buildah command, each output line to `progress`; its output, or BuildError with the last lines."""
    lines: list[str] = []
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    for line in proc.stdout or ():
        lines.append(line.rstrip())
        progress(line.rstrip())
    if proc.wait() != 0:
        raise BuildError(str(context), f"`buildah {cmd[cmd.index('vfs') + 1]}` exited {proc.returncode}:\n" + "\n".join(lines[-20:]),
                         "fix the Dockerfile (the step above failed), or let the task run in the fallback image")
    return "\n".join(lines)


def _build(context: Path, bases: dict[str, str], digests: dict[str, str], cache_root: Path, dest: Path, key: str,
           progress: Callable[[str], None], network: bool) -> None:
    b = _buildah(cache_root)
    name = f"localhost/agentrl-dockerfile-{key}:latest"
    with tempfile.TemporaryDirectory(prefix=f".build-{key}-", dir=cache_root) as tmp:
        work = Path(tmp)
        for from_name, ref in bases.items():
            if from_name not in digests:
                continue
            parsed = parse(ref)
            # buildah names a pulled layout after its path, and a path with a dot-led part (~/.cache) is
            # not a valid name: pull it through a plainly named link, relative to the work directory
            link = f"base-{digests[from_name].split(':', 1)[1][:16]}"
            os.symlink(parsed.path.resolve(), work / link)
            progress(f"[build] FROM {from_name}: {ref} ({digests[from_name][:19]})")
            image_id = _run(b + ["pull", "--quiet", f"{parsed.kind}:{link}" + (f":{parsed.tag}" if parsed.tag else "")],
                            context, progress, cwd=work).splitlines()[-1].strip()
            _run(b + ["tag", image_id, from_name], context, progress)
        progress(f"[build] buildah build {context} (isolation chroot, storage vfs, {'host' if network else 'no'} network)")
        jail = ["unshare", "--pid", "--ipc", "--fork", "--mount-proc"] + ([] if network else ["--net"])
        _run(jail + b + ["build", "--isolation", "chroot", "--pull-never", "-t", name, "-f", str(context / "Dockerfile"), str(context)],
             context, progress)
        layout = work / "layout"
        _run(b + ["push", "--quiet", name, f"oci:{layout}:{TAG}"], context, progress)
        os.chmod(layout, 0o755)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(layout, dest)
        subprocess.run(b + ["rmi", name], capture_output=True)  # the layout is the result; storage keeps the bases


__all__ = ["BuildError", "Built", "build", "builder_missing", "context_digest", "external_froms"]
