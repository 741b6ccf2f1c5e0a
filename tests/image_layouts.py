"""OCI image layouts made in Python for tests: tar layers, sha256 blobs, index.json, so no external
tool is needed to make an image; and a tiny root filesystem from the host's own sh, cat and ls."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from agentrl_cli.envs.images.oci import ARCH, REF_NAME

OS_RELEASE = b'NAME="agentrl tiny"\nID=agentrl-tiny\nVERSION_ID=1\n'


def entry(name: str, data: bytes | None = None, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644,
          link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    if kind == tarfile.DIRTYPE:
        info.mode = mode if mode != 0o644 else 0o755
    if data is not None:
        info.size = len(data)
    return info, data


def tar_layer(entries: list[tuple[tarfile.TarInfo, bytes | None]], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0) if gz else raw


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_layout(root: Path, layers: list[bytes], tag: str = "test") -> Path:
    """An OCI image layout at `root` whose one manifest (tagged `tag`) has these layers."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    layer_descs = []
    for data in layers:
        gz = data[:2] == b"\x1f\x8b"
        kind = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gz else "")
        layer_descs.append({"mediaType": kind, **_blob(root, data)})
    config = {"architecture": ARCH, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(root, json.dumps(config).encode())},
                "layers": layer_descs}
    desc = {"mediaType": manifest["mediaType"], **_blob(root, json.dumps(manifest).encode()), "annotations": {REF_NAME: tag}}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    return root


def tiny_rootfs_entries(programs: tuple[str, ...] = ("sh", "cat", "ls")) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The host's `programs` under usr/bin with the libraries ldd names, at their paths, and an
    /etc/os-release naming "agentrl tiny": an image a few megabytes large."""
    files: dict[str, bytes] = {}
    for prog in programs:
        path = f"/usr/bin/{prog}"
        files[path] = Path(path).read_bytes()
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            lib = next((w for w in line.split() if w.startswith("/")), None)
            if lib:
                files[lib] = Path(lib).read_bytes()
    dirs = sorted({str(Path(p).parent)[1:] for p in files} | {"etc", "usr", "usr/bin"})
    entries = []
    for d in dirs:
        parts = d.split("/")
        entries += [entry("/".join(parts[:i]) + "/", kind=tarfile.DIRTYPE) for i in range(1, len(parts) + 1)]
    seen, unique = set(), []
    for e in entries:
        if e[0].name not in seen:
            seen.add(e[0].name)
            unique.append(e)
    unique += [entry(p[1:], data, mode=0o755) for p, data in files.items()]
    unique += [entry("bin", kind=tarfile.SYMTYPE, link="usr/bin"), entry("etc/os-release", OS_RELEASE)]
    return unique


def tiny_image(root: Path) -> Path:
    """An OCI layout of the tiny root filesystem (a plain tar layer, then a gzip'd one)."""
    base = tar_layer(tiny_rootfs_entries())
    top = tar_layer([entry("etc/", kind=tarfile.DIRTYPE), entry("etc/hostname", b"tiny\n")], gz=True)
    return write_layout(root, [base, top], tag="tiny")


def traversable_dir(prefix: str) -> Path:
    """A new directory the sandbox user can traverse (bubblewrap runs as it and binds from there)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o711)
    return d


def oci_archive(layout: Path, dest: Path) -> Path:
    """A tar of the OCI layout at `layout` (what `skopeo copy ... oci-archive:FILE` writes)."""
    with tarfile.open(dest, "w") as tar:
        for name in sorted(os.listdir(layout)):
            tar.add(layout / name, arcname=name)
    return dest


def docker_archive(dest: Path, layers: list[bytes], tags: list[str], *, gz: bool = False,
                   diff_ids: list[str] | None = None) -> str:
    """What `docker save` writes at `dest`: `<id>/layer.tar` per layer (gzip'd or not, as given; a
    repeated layer a symlink to its first copy), `<config sha256>.json`, manifest.json naming the
    tags; the whole archive gzip'd when `gz`. The image ID (sha256 of the config)."""
    import gzip as gzip_

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names, first = [], {}
        for data in layers:
            raw = gzip_.decompress(data) if data[:2] == b"\x1f\x8b" else data
            lid = hashlib.sha256(raw + str(len(names)).encode()).hexdigest()
            name = f"{lid}/layer.tar"
            if data in first:
                link = tarfile.TarInfo(name)
                link.type, link.linkname = tarfile.SYMTYPE, f"../{first[data]}"
                tar.addfile(link)
            else:
                first[data] = name
                add(name, data)
            names.append(name)
        ids = diff_ids if diff_ids is not None else [
            "sha256:" + hashlib.sha256(gzip_.decompress(d) if d[:2] == b"\x1f\x8b" else d).hexdigest() for d in layers]
        config = json.dumps({"architecture": ARCH, "os": "linux", "rootfs": {"type": "layers", "diff_ids": ids}}).encode()
        image_id = hashlib.sha256(config).hexdigest()
        add(f"{image_id}.json", config)
        add("manifest.json", json.dumps([{"Config": f"{image_id}.json", "RepoTags": tags, "Layers": names}]).encode())
    data = buf.getvalue()
    dest.write_bytes(gzip_.compress(data, compresslevel=1) if gz else data)
    return f"sha256:{image_id}"
