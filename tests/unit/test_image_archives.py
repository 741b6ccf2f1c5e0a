"""Images as one file (docs/environments.md "Sandboxes rooted in an image"; docs/security.md rows
31-35): an OCI archive (`oci-archive:`) and a docker archive (`docker-archive:`, what `docker save`
writes), read in place, verified and unpacked by the rules a layout is. Archives made here with tarfile."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from agentrl_cli.envs.images import ImageError, parse, resolve
from agentrl_cli.envs.images.reference import DeviceNode, DigestMismatch, ImageNotFound, PathEscape
from tests.image_layouts import docker_archive, entry, oci_archive, tar_layer, write_layout

D = tarfile.DIRTYPE
BASE = [entry("etc/", kind=D), entry("etc/os-release", b"ID=arch\n"), entry("etc/gone", b"g"),
        entry("bin/", kind=D), entry("bin/tool", b"#!tool", mode=0o755), entry("bin/tool2", kind=tarfile.LNKTYPE, link="bin/tool")]
TOP = [entry("etc/.wh.gone"), entry("etc/hostname", b"top\n")]


def _check_root(root: Path) -> None:
    assert (root / "etc/os-release").read_bytes() == b"ID=arch\n" and (root / "etc/hostname").read_bytes() == b"top\n"
    assert not (root / "etc/gone").exists() and os.stat(root / "bin/tool").st_ino == os.stat(root / "bin/tool2").st_ino


def test_an_oci_archive_is_its_layout_in_one_file_and_shares_its_cache_entry(tmp_path):
    layout = write_layout(tmp_path / "layout", [tar_layer(BASE), tar_layer(TOP, gz=True)], tag="v1")
    archive = oci_archive(layout, tmp_path / "img.tar")
    from_layout = resolve(f"oci:{layout}:v1", tmp_path / "cache")
    from_archive = resolve(f"oci-archive:{archive}:v1", tmp_path / "cache")
    assert from_archive.digest == from_layout.digest and from_archive.path == from_layout.path
    _check_root(resolve(f"oci-archive:{archive}", tmp_path / "cache2").path)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzipped-archive"])
def test_a_docker_archive_is_named_by_its_image_id_with_shared_and_gzipped_layers(tmp_path, gz):
    shared = tar_layer([entry("usr/", kind=D), entry("usr/lib", b"l")])
    image_id = docker_archive(tmp_path / "save.tar", [tar_layer(BASE), shared, tar_layer(TOP, gz=True), shared],
                              ["docker.io/library/arch:1.0"], gz=gz)
    for tag in ("", ":arch:1.0", ":docker.io/library/arch:1.0"):
        rootfs = resolve(f"docker-archive:{tmp_path / 'save.tar'}{tag}", tmp_path / "cache")
        assert rootfs.digest == image_id and rootfs.path.parent.name == image_id.split(":")[1]
    _check_root(rootfs.path)
    assert (rootfs.path / "usr/lib").read_bytes() == b"l"


def test_archive_references_split_file_from_tag(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"")
    assert (parse(f"docker-archive:{tmp_path}/a.tar:busybox:1.36").path, parse(f"docker-archive:{tmp_path}/a.tar:busybox:1.36").tag) \
        == (tmp_path / "a.tar", "busybox:1.36")
    assert parse(f"oci-archive:{tmp_path}/a.tar").tag is None
    assert (parse("docker-archive:/no/such.tar:reg.io/x:2").path, parse("docker-archive:/no/such.tar:reg.io/x:2").tag) \
        == (Path("/no/such.tar"), "reg.io/x:2")


def test_31_an_archive_layer_escaping_the_root_is_refused(tmp_path):
    evil = tar_layer([entry("../escaped", b"x")])
    docker_archive(tmp_path / "d.tar", [evil], ["x:1"])
    oci_archive(write_layout(tmp_path / "layout", [evil]), tmp_path / "o.tar")
    for image in (f"docker-archive:{tmp_path / 'd.tar'}", f"oci-archive:{tmp_path / 'o.tar'}"):
        with pytest.raises(PathEscape, match="escapes the image root"):
            resolve(image, tmp_path / "cache")
    assert not (tmp_path / "escaped").exists()


def test_32_a_tampered_docker_layer_or_config_is_refused_naming_both_digests(tmp_path):
    good, bad = tar_layer([entry("f", b"good")]), tar_layer([entry("f", b"evil")])
    claimed = "sha256:" + hashlib.sha256(good).hexdigest()
    docker_archive(tmp_path / "d.tar", [bad], ["x:1"], diff_ids=[claimed])
    with pytest.raises(DigestMismatch, match=f"layer .*hashes to sha256:{hashlib.sha256(bad).hexdigest()}.*diff_id is {claimed}"):
        resolve(f"docker-archive:{tmp_path / 'd.tar'}", tmp_path / "cache")
    # a config whose bytes no longer match the image ID its file name carries
    docker_archive(tmp_path / "c.tar", [good], ["x:1"])
    with tarfile.open(tmp_path / "c.tar") as src, tarfile.open(tmp_path / "c2.tar", "w") as dst:
        for m in src:
            data = src.extractfile(m).read()
            if m.name.endswith(".json") and m.name != "manifest.json":
                data = data.replace(b'"linux"', b'"linux" ')
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(DigestMismatch, match="digest mismatch in config"):
        resolve(f"docker-archive:{tmp_path / 'c2.tar'}", tmp_path / "cache")


def test_32_a_tampered_oci_archive_blob_is_refused(tmp_path):
    layout = write_layout(tmp_path / "layout", [tar_layer([entry("f", b"x" * 100)])])
    layer = max((layout / "blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    layer.write_bytes(layer.read_bytes()[:-1] + b"\x01")
    with pytest.raises(DigestMismatch, match=f"digest mismatch in blob sha256:{layer.name}"):
        resolve(f"oci-archive:{oci_archive(layout, tmp_path / 'o.tar')}", tmp_path / "cache")


def test_32_a_docker_archive_without_diff_ids_is_refused(tmp_path):
    docker_archive(tmp_path / "d.tar", [tar_layer([entry("f", b"x")])], ["x:1"], diff_ids=[])
    with pytest.raises(ImageError, match="no sha256 diff_id for each of its 1 layers"):
        resolve(f"docker-archive:{tmp_path / 'd.tar'}", tmp_path / "cache")


def test_33_a_device_node_in_an_archive_layer_is_refused(tmp_path):
    docker_archive(tmp_path / "d.tar", [tar_layer([entry("dev/", kind=D), entry("dev/mem", kind=tarfile.CHRTYPE)])], ["x:1"])
    with pytest.raises(DeviceNode, match="'dev/mem' is a device node"):
        resolve(f"docker-archive:{tmp_path / 'd.tar'}", tmp_path / "cache")


def test_34_a_missing_archive_tag_or_member_is_refused(tmp_path):
    with pytest.raises(ImageNotFound, match="no archive file at"):
        resolve(f"oci-archive:{tmp_path / 'none.tar'}:v1", tmp_path / "cache")
    docker_archive(tmp_path / "d.tar", [tar_layer([entry("f", b"x")])], ["x:1"])
    with pytest.raises(ImageNotFound, match=r"no image tagged 'y:2'; tags here: \['x:1'\]"):
        resolve(f"docker-archive:{tmp_path / 'd.tar'}:y:2", tmp_path / "cache")
    with pytest.raises(ImageNotFound, match="not a docker archive"):
        resolve(f"docker-archive:{oci_archive(write_layout(tmp_path / 'l', [tar_layer([])]), tmp_path / 'o.tar')}", tmp_path / "cache")
    with tarfile.open(tmp_path / "o.tar") as src, tarfile.open(tmp_path / "o2.tar", "w") as dst:
        for m in src:
            if not (m.name.startswith("blobs/") and m.isfile() and m.size > 200):
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    with pytest.raises(ImageNotFound, match="cannot be read"):
        resolve(f"oci-archive:{tmp_path / 'o2.tar'}", tmp_path / "cache")
