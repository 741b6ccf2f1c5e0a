"""Writing an OCI image layout from a root filesystem tar: one gzip'd layer (device nodes left out,
since sandboxes bind their own /dev and the unpacker refuses them), a config whose rootfs.diff_ids
names the layer's uncompressed sha256, a manifest, and index.json tagging it. The layout is written
beside `dest` and renamed into place, so a reader sees a whole layout or none.
Belongs here: the layout's files. Not here: reading and verifying one (`oci.py`), making the tar.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from agentrl_cli.envs.images.oci import ARCH, REF_NAME

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


class _Hashing:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, raw) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _blob(blobs: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layer(rootfs_tar: Path, blobs: Path) -> tuple[dict, str, int]:
    """(descriptor, diff_id, members skipped): the tar re-written without device nodes, gzip'd."""
    tmp = blobs / "layer.partial"
    skipped = 0
    with open(tmp, "wb") as raw:
        outer = _Hashing(raw)
        with gzip.GzipFile(fileobj=outer, mode="wb", compresslevel=6, mtime=0) as gz:
            inner = _Hashing(gz)
            with tarfile.open(rootfs_tar, "r:*") as src, tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as dst:
                for m in src:
                    if m.ischr() or m.isblk() or m.isfifo():
                        skipped += 1
                        continue
                    dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    digest = outer.sha.hexdigest()
    os.replace(tmp, blobs / digest)
    return {"mediaType": LAYER_TYPE, "digest": f"sha256:{digest}", "size": outer.size}, f"sha256:{inner.sha.hexdigest()}", skipped


def write_layout(rootfs_tar: Path, dest: Path, tag: str, labels: dict[str, str] | None = None) -> str:
    """Write the OCI layout of `rootfs_tar` at `dest` (replacing one there) with its one manifest
    tagged `tag`; the manifest's digest (sha256:...)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        blobs = work / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layer, diff_id, _ = _layer(rootfs_tar, blobs)
        config = {"architecture": ARCH, "os": "linux", "config": {"Labels": dict(labels or {}), "Env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                    "config": {"mediaType": CONFIG_TYPE, **_blob(blobs, json.dumps(config, sort_keys=True).encode())},
                    "layers": [layer]}
        desc = {"mediaType": MANIFEST_TYPE, **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                "annotations": {REF_NAME: tag}}
        (work / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        (work / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}, indent=1))
        os.chmod(work, 0o755)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return desc["digest"]
