"""Stage 5's checks of a harness's image, run in real sandboxes of it: the image's release (PRETTY_NAME
of its /etc/os-release, reported) and a file present only on the host absent inside (judged; a
host-rooted sandbox of the same settings is asked too, so the report shows the file was one a
sandbox could have seen).

Belongs here: what stage 5 asks an image-rooted sandbox. Not here: resolving the image
(`agentrl_cli.envs.images`), the harness's episodes (`stages/s5_sandbox.py`).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path

from agentrl_cli.core.report import Check, guarded
from agentrl_cli.envs.sandbox import Sandbox, SandboxSettings

# a host-rooted sandbox binds the host's /usr read-only, so a file here is one it would see; an image
# brings its own /usr; /tmp would prove nothing (every sandbox has its own)
HOST_ONLY_DIRS = ("/usr/local/share", "/usr/local", "/usr/share")


def image_checks(name: str, rooted: SandboxSettings) -> list[Check]:
    """The image's os-release and the host-only file check for harness `name`, each contained."""
    return [guarded(f"harness {name}: image os-release", lambda: os_release(name, rooted)),
            guarded(f"harness {name}: host-only file absent in image", lambda: host_only_absent(name, rooted))]


def pretty_name(os_release_text: str) -> str | None:
    """PRETTY_NAME of an os-release file's text (its quotes removed), else None."""
    for line in os_release_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME":
            parts = shlex.split(value, posix=True)
            return parts[0] if parts else ""
    return None


def os_release(name: str, rooted: SandboxSettings) -> Check:
    """`cat /etc/os-release` in a sandbox of the image: its PRETTY_NAME (NAME when it has none), reported."""
    with Sandbox(rooted) as sb:
        r = sb.exec(["cat", "/etc/os-release"], timeout=30)
    title = f"harness {name}: image os-release"
    measured = {"image": rooted.image, "digest": rooted.image_digest}
    if r.exit_code != 0:
        return Check.info(title, {**measured, "pretty_name": None},
                          f"the image has no readable /etc/os-release (cat exited {r.exit_code}: {(r.stderr or r.error or '').strip()[:200]})")
    pretty = pretty_name(r.stdout)
    if pretty is None:
        pretty = next((line.partition("=")[2].strip('"') for line in r.stdout.splitlines() if line.startswith("NAME=")), None)
    return Check.info(title, {**measured, "pretty_name": pretty}, "read by `cat /etc/os-release` inside a sandbox of the image")


def _host_only_file() -> Path:
    """A uniquely named file in the first host directory a host-rooted sandbox sees that is writable
    here; in the temporary directory when none is (then the host-rooted sandbox cannot see it either)."""
    where = next((d for d in HOST_ONLY_DIRS if os.path.isdir(d) and os.access(d, os.W_OK)), tempfile.gettempdir())
    fd, path = tempfile.mkstemp(prefix="agentrl-host-only-", dir=where)
    os.write(fd, b"present only on the host\n")
    os.close(fd)
    os.chmod(path, 0o644)
    return Path(path)


def _visible(settings: SandboxSettings, path: Path) -> bool:
    with Sandbox(settings) as sb:
        r = sb.exec(["ls", "-d", str(path)], timeout=30)
    if r.error:
        raise RuntimeError(f"the sandbox could not run ls: {r.error}")
    return r.exit_code == 0


def host_only_absent(name: str, rooted: SandboxSettings) -> Check:
    """A file created on the host just now (so no image can hold it) must not be visible inside a
    sandbox of the image; a host-rooted sandbox is asked too, as the control."""
    path = _host_only_file()
    try:
        inside = _visible(rooted, path)
        on_host_root = _visible(replace(rooted, image="", image_root=None, image_digest=""), path)
    finally:
        path.unlink(missing_ok=True)
    measured = {"path": str(path), "visible_in_image": inside, "visible_on_host_root": on_host_root}
    control = ("a host-rooted sandbox sees it" if on_host_root else
               "a host-rooted sandbox does not see it either (no host directory it binds was writable here), so this shows less")
    return Check.judge(f"harness {name}: host-only file absent in image", not inside, measured,
                       "absent inside the image's sandbox", f"the image's sandbox shows host files: check that harnesses[{name}].image "
                       "is the image's root (not a directory holding the host's /) and that bubblewrap binds nothing of the host",
                       f"{path}: {control}")
