"""Which supervisor a sandbox runs, the read-only directory it comes from, and the request framing.

Two supervisors do the same job and give the same answers (see `supervisor.py`):
- `supervisor.c`, compiled once per source by the host's C compiler (`cc`, static when it can):
  it starts in well under a millisecond of CPU. Requests are "<length>\\n" and length-prefixed
  fields; an exec answer is a JSON line with `stdout_bytes`/`stderr_bytes` followed by that many
  raw output bytes, which the host decodes (UTF-8, invalid bytes replaced) as supervisor.py does.
- `supervisor.py`, run by the sandbox's Python from bytecode compiled once by that same Python:
  about 20 ms of CPU to start, in every sandbox. Requests are marshal frames, answers JSON lines.
`choose` takes the compiled one when a compiler is here, else the Python one (also on request);
`image_supervisor` the one that can run inside an image's root.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import marshal
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from agentrl_cli.envs.sandbox.bwrap import SandboxUnavailable

log = logging.getLogger("agentrl.sandbox")
SUPPORT_SOURCES = ("supervisor.py", "supervisor.c", "network.py")
BINARY = "supervisor-bin"
COMPILE_PY = "import py_compile, sys; py_compile.compile(sys.argv[1], sys.argv[2], doraise=True)"
_lock = threading.Lock()
_failed: set[Path] = set()  # support dirs whose C source did not compile here (tried once per process)


@functools.cache
def _sources() -> tuple[dict[str, bytes], str]:
    package = resources.files("agentrl_cli.envs.sandbox")
    sources = {name: package.joinpath(name).read_bytes() for name in SUPPORT_SOURCES}
    return sources, hashlib.sha256(b"".join(sources.values())).hexdigest()[:12]


def support_dir(root: Path, sandbox_uid: int, home: str) -> Path:
    """A read-only directory with the supervisors and passwd/group files, shared by all sandboxes
    (named by the hash of its sources, read once per process, so a changed source gets a new one)."""
    sources, digest = _sources()
    d = root / f"support-{digest}"
    if (d / "supervisor.py").exists():
        return d
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    tmp = Path(tempfile.mkdtemp(prefix=".support-", dir=root))
    for name, data in sources.items():
        (tmp / name).write_bytes(data)
    (tmp / "passwd").write_text(f"root:x:0:0:root:/:/usr/sbin/nologin\nsandbox:x:{sandbox_uid}:{sandbox_uid}:sandbox:{home}:/bin/bash\n")
    (tmp / "group").write_text(f"root:x:0:\nsandbox:x:{sandbox_uid}:\n")
    for p in tmp.iterdir():
        os.chmod(p, 0o644)
    os.chmod(tmp, 0o755)
    try:
        tmp.rename(d)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return d


def _host_cache() -> Path:
    """This host's copy of each compiled supervisor (by source hash and machine), so a new sandbox
    root (another run directory, another test) copies it instead of compiling it again."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "agentrl" / "sandbox" / f"{BINARY}-{_sources()[1]}-{os.uname().machine}"


def _copy(src: Path, dest: Path) -> None:
    """`src` to `dest`, executable, atomically (a concurrent reader sees the whole file or none)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)


def compiled(support: Path) -> str | None:
    """The compiled supervisor's file name in `support`: copied from this host's cache (`_host_cache`),
    else compiled and cached; None without a working C compiler (then the Python supervisor runs)."""
    if (support / BINARY).exists():
        return BINARY
    with _lock:
        if (support / BINARY).exists():
            return BINARY
        if support in _failed:
            return None
        cache = _host_cache()
        if cache.is_file():
            try:
                _copy(cache, support / BINARY)
                return BINARY
            except OSError as exc:
                log.debug("cached supervisor %s not usable, compiling: %s", cache, exc)
        cc = shutil.which("cc") or shutil.which("gcc")
        tmp = support / f".{BINARY}.{os.getpid()}"
        errors = []
        for flags in (["-static"], []) if cc else ():
            proc = subprocess.run([cc, "-O2", *flags, "-o", str(tmp), str(support / "supervisor.c")],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, support / BINARY)
                try:  # best effort: an unwritable cache only means compiling again
                    _copy(support / BINARY, cache)
                except OSError as exc:
                    log.debug("compiled supervisor not cached at %s: %s", cache, exc)
                return BINARY
            errors.append(proc.stderr.strip()[-300:])
        tmp.unlink(missing_ok=True)
        _failed.add(support)
        log.warning("sandbox supervisor runs on Python (~20 ms more CPU per sandbox): %s",
                    "no C compiler (cc) on PATH" if not cc else f"{cc} cannot compile supervisor.c: {errors[-1]}")
        return None


def bytecode(support: Path, python: str) -> str:
    """supervisor.py as bytecode compiled once by the sandbox's own Python (a source file given on
    the command line is compiled again at every start), or the source when it cannot be compiled."""
    try:
        binary = os.stat(python)
    except OSError:
        return "supervisor.py"
    key = hashlib.sha256(f"{python}:{binary.st_size}:{binary.st_mtime_ns}".encode()).hexdigest()[:12]
    name = f"supervisor-{key}.pyc"
    if (support / name).exists():
        return name
    tmp = support / f".{name}.{os.getpid()}.{threading.get_ident()}"
    try:
        subprocess.run([python, "-I", "-S", "-c", COMPILE_PY, str(support / "supervisor.py"), str(tmp)],
                       check=True, capture_output=True, timeout=60)
        os.chmod(tmp, 0o644)
        os.replace(tmp, support / name)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox supervisor runs from source: %s cannot compile it (%s)", python, exc)
        tmp.unlink(missing_ok=True)
        return "supervisor.py"
    return name


@dataclass(frozen=True)
class Supervisor:
    kind: str  # "compiled" | "python"
    file: str  # its file in the support directory

    @classmethod
    def choose(cls, support: Path, python: str, wanted: str = "auto") -> "Supervisor":
        if wanted not in ("auto", "python"):
            raise ValueError(f"supervisor {wanted!r}: choose auto or python")
        binary = compiled(support) if wanted == "auto" else None
        return cls("compiled", binary) if binary else cls("python", bytecode(support, python))

    def command(self, path: str, python: str) -> list[str]:
        """The command line that starts it, its file being at `path`."""
        return [path] if self.kind == "compiled" else [python, "-I", "-S", path]

    def frame(self, req: dict) -> bytes:
        """One request as this supervisor reads it."""
        if self.kind == "python":
            payload = marshal.dumps(req)
        elif req.get("op") == "exec":
            env = [f"{k}={v}" for k, v in (req.get("env") or {}).items()]
            argv = list(req.get("argv") or [])
            payload = _fields(["exec", req.get("id"), req.get("timeout"), req.get("output_limit"), req.get("cpu_time"),
                               req.get("address_space"), req.get("cwd"), req.get("stdin"), len(argv), *argv, len(env), *env])
        else:
            payload = _fields([req.get("op"), req.get("id")])
        return b"%d\n" % len(payload) + payload


def _fields(values: list) -> bytes:
    out = []
    for v in values:
        data = v if isinstance(v, bytes) else ("" if v is None else str(v)).encode("utf-8", "surrogateescape")
        out.append(b"%d:" % len(data) + data)
    return b"".join(out)


def image_supervisor(chosen: Supervisor, support: Path, image: str, image_root: Path, python: str) -> Supervisor:
    """The supervisor that can run inside `image_root`: the compiled one when statically linked (it
    needs nothing of the image), else supervisor.py run by the image's own `python`."""
    if chosen.kind == "compiled" and is_static(support / chosen.file):
        return chosen
    if os.path.lexists(image_root / python.lstrip("/")):
        return Supervisor("python", "supervisor.py")  # the host's bytecode may not suit the image's Python
    raise SandboxUnavailable(
        f"image {image!r}: no supervisor can run in it: the compiled one is not statically linked here "
        f"and the image has no {python}",
        "install a C compiler and static libc (`apt-get install gcc libc6-dev`), or set sandbox.python to the image's Python")


def is_static(path: Path) -> bool:
    """True when the ELF file at `path` names no program interpreter (PT_INTERP): it runs anywhere."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
                return False
            order = "little" if head[5] == 1 else "big"
            phoff, phentsize, phnum = (int.from_bytes(head[32:40], order), int.from_bytes(head[54:56], order),
                                       int.from_bytes(head[56:58], order))
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return not any(int.from_bytes(table[i:i + 4], order) == 3 for i in range(0, len(table), phentsize))
