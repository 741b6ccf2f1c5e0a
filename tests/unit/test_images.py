"""Images sandboxes run in (docs/security.md rows 31-35): references, digests verified, layers
unpacked strictly into the content-addressed cache. No bubblewrap needed: the sandboxes that run in
an image are tests/integration/test_sandbox_image.py."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from agentrl_cli.envs.images import ImageError, parse, resolve
from agentrl_cli.envs.images.reference import DeviceNode, DigestMismatch, ImageNotFound, PathEscape
from tests.image_layouts import entry, tar_layer, write_layout

D = tarfile.DIRTYPE


def _image(tmp_path: Path, *layers: list, tag: str = "t") -> str:
    write_layout(tmp_path / "layout", [tar_layer(entries, gz=i % 2 == 1) for i, entries in enumerate(layers)], tag=tag)
    return f"oci:{tmp_path / 'layout'}:{tag}"


def _leftovers(cache: Path) -> list[str]:
    return [p.name for p in cache.iterdir() if p.name.startswith(".")] if cache.exists() else []


def test_layers_apply_in_order_with_whiteouts_opaque_dirs_and_hard_links(tmp_path):
    base = [entry("etc/", kind=D), entry("etc/keep", b"k"), entry("etc/gone", b"g"), entry("opq/", kind=D),
            entry("opq/old", b"o"), entry("bin/", kind=D), entry("bin/tool", b"#!tool", mode=0o755),
            entry("bin/tool2", kind=tarfile.LNKTYPE, link="bin/tool"), entry("abs", kind=tarfile.SYMTYPE, link="/etc/keep")]
    top = [entry("opq/new", b"n"), entry("opq/.wh..wh..opq"), entry("etc/.wh.gone")]
    root = resolve(_image(tmp_path, base, top), tmp_path / "cache").path
    assert (root / "etc/keep").read_bytes() == b"k" and not (root / "etc/gone").exists()
    assert sorted(os.listdir(root / "opq")) == ["new"], "the opaque marker empties what lower layers put there, not this layer's"
    assert os.stat(root / "bin/tool").st_ino == os.stat(root / "bin/tool2").st_ino
    assert os.readlink(root / "abs") == "/etc/keep", "absolute symlink targets are kept: they resolve inside the sandbox"


def test_an_image_is_unpacked_once_per_digest(tmp_path):
    image = _image(tmp_path, [entry("f", b"x")])
    first = resolve(image, tmp_path / "cache")
    inode = os.stat(first.path / "f").st_ino
    second = resolve(image, tmp_path / "cache")
    assert second.path == first.path and os.stat(second.path / "f").st_ino == inode
    assert first.path.parent.name == first.digest.split(":")[1] and _leftovers(tmp_path / "cache") == []


def test_setuid_and_setgid_bits_are_dropped(tmp_path):
    root = resolve(_image(tmp_path, [entry("su", b"x", mode=0o6755)]), tmp_path / "cache").path
    assert stat.S_IMODE(os.stat(root / "su").st_mode) == 0o755


@pytest.mark.parametrize("name", ["../escaped", "a/../../escaped", "/etc/escaped", "a/.wh...", "a/.wh."])
def test_31_a_layer_member_escaping_the_root_is_refused(tmp_path, name):
    with pytest.raises(PathEscape, match="escapes the image root|names no entry"):
        resolve(_image(tmp_path, [entry("a/", kind=D), entry(name, b"x")]), tmp_path / "cache")
    assert not (tmp_path / "escaped").exists() and _leftovers(tmp_path / "cache") == []


def test_31_a_member_written_through_a_symlink_laid_by_a_lower_layer_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    image = _image(tmp_path, [entry("link", kind=tarfile.SYMTYPE, link=str(outside))], [entry("link/planted", b"x")])
    with pytest.raises(PathEscape, match="passes through the symlink 'link'"):
        resolve(image, tmp_path / "cache")
    assert list(outside.iterdir()) == []


def test_31_a_hard_link_to_a_path_outside_the_root_is_refused(tmp_path):
    with pytest.raises(PathEscape, match="hard link target"):
        resolve(_image(tmp_path, [entry("pw", kind=tarfile.LNKTYPE, link="/etc/passwd")]), tmp_path / "cache")


def test_32_a_corrupted_blob_is_refused_naming_it(tmp_path):
    image = _image(tmp_path, [entry("f", b"x" * 100)])
    layer = max((tmp_path / "layout/blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(layer.read_bytes())
    data[600] ^= 0xFF
    layer.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch, match=f"digest mismatch in blob sha256:{layer.name}"):
        resolve(image, tmp_path / "cache")
    assert _leftovers(tmp_path / "cache") == []


def test_32_a_tampered_manifest_is_refused(tmp_path):
    image = _image(tmp_path, [entry("f", b"x")])
    import json

    desc = json.loads((tmp_path / "layout/index.json").read_text())["manifests"][0]
    manifest = tmp_path / "layout/blobs/sha256" / desc["digest"].split(":")[1]
    manifest.write_bytes(manifest.read_bytes().replace(b"schemaVersion\": 2", b"schemaVersion\": 3"))
    with pytest.raises(DigestMismatch, match=desc["digest"]):
        resolve(image, tmp_path / "cache")


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE])
def test_33_a_device_node_in_a_layer_is_refused(tmp_path, kind):
    with pytest.raises(DeviceNode, match="'dev/mem' is a device node"):
        resolve(_image(tmp_path, [entry("dev/", kind=D), entry("dev/mem", kind=kind)]), tmp_path / "cache")


def test_34_a_missing_image_or_tag_is_refused(tmp_path):
    with pytest.raises(ImageNotFound, match="no OCI layout directory"):
        resolve(f"oci:{tmp_path / 'nowhere'}:v1", tmp_path / "cache")
    with pytest.raises(ImageNotFound, match="no manifest tagged 'other'"):
        resolve(_image(tmp_path, [entry("f", b"x")]).rsplit(":", 1)[0] + ":other", tmp_path / "cache")
    with pytest.raises(ImageNotFound, match="no root filesystem directory"):
        resolve(f"dir:{tmp_path / 'nowhere'}")


def test_34_a_missing_layer_blob_is_refused(tmp_path):
    image = _image(tmp_path, [entry("f", b"x" * 100)])
    max((tmp_path / "layout/blobs/sha256").iterdir(), key=lambda p: p.stat().st_size).unlink()
    with pytest.raises(ImageNotFound, match="cannot be read"):
        resolve(image, tmp_path / "cache")


def test_35_a_registry_reference_is_refused_saying_how_to_provide_a_layout():
    with pytest.raises(ImageError, match="registry reference") as info:
        parse("docker.io/library/debian:12")
    assert "oci:DIR:TAG" in info.value.hint


def test_references_parse_to_layouts_tags_and_directories(tmp_path):
    assert (parse("oci:/x/layout:v1").path, parse("oci:/x/layout:v1").tag) == (Path("/x/layout"), "v1")
    assert parse("oci:/x/layout").tag is None
    assert parse("dir:/srv/root").kind == parse("/srv/root").kind == "dir"


def test_a_directory_image_digest_is_stable_and_follows_its_files(tmp_path):
    (tmp_path / "root/etc").mkdir(parents=True)
    (tmp_path / "root/etc/os-release").write_text("NAME=x\n")
    a, b = resolve(f"dir:{tmp_path / 'root'}"), resolve(str(tmp_path / "root"))
    assert a.digest == b.digest and a.digest.startswith("dir-sha256:") and a.path == (tmp_path / "root").resolve()
    (tmp_path / "root/etc/os-release").write_text("NAME=changed\n")
    assert resolve(f"dir:{tmp_path / 'root'}").digest != a.digest


def test_a_harness_image_fails_at_load_never_falling_back_to_the_host_root(tmp_path):
    from agentrl_cli.config.models import HarnessConfig, SandboxConfig
    from agentrl_cli.envs.sandbox import SandboxSettings
    from agentrl_cli.envs.sandbox.provider import harness_settings

    missing = f"oci:{tmp_path / 'missing'}:v1"
    with pytest.raises(ImageNotFound, match="no OCI layout directory"):
        harness_settings(SandboxConfig(image_cache_dir=str(tmp_path / "cache")), HarnessConfig(name="h", image=missing))
    assert SandboxSettings().for_harness(HarnessConfig(name="h")).image_root is None


def test_a_harness_image_with_the_sandbox_service_needs_its_digest_before_asking(tmp_path):
    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.core.errors import ConfigError
    from agentrl_cli.envs.sandbox.provider import HarnessSandboxes

    harness = {"name": "h", "image": "oci:/x:y"}
    cfg = PlatformConfig.model_validate({"sandbox": {"service_url": "http://127.0.0.1:1", "root_dir": str(tmp_path)},
                                         "harnesses": [harness]})
    with pytest.raises(ImageNotFound, match="no OCI layout directory"):  # no copy here to read the digest from, none pinned
        HarnessSandboxes(cfg).for_harness("h")
    cfg.harnesses[0].image_digest = "sha256:" + "a" * 64
    with pytest.raises(ConfigError, match="could not be reached to prepare image 'oci:/x:y'"):
        HarnessSandboxes(cfg).for_harness("h")


def test_stage_5_fails_a_harness_whose_image_is_refused_naming_the_image_and_why(tmp_path):
    from types import SimpleNamespace

    from agentrl_cli.acceptance.context import StageContext
    from agentrl_cli.config.models import PlatformConfig
    from agentrl_cli.core.report import CheckStatus
    from agentrl_cli.envs.sandbox import SandboxSettings
    from stages.s5_sandbox import _harness_checks

    missing = f"oci:{tmp_path / 'missing'}:v1"
    cfg = PlatformConfig.model_validate({"harnesses": [{"name": "terminal_like", "image": missing}]})
    ctx = SimpleNamespace(config=cfg, progress=lambda message: None)
    ctx.produce = lambda name, fn: StageContext.produce(ctx, name, fn)
    checks = _harness_checks(ctx, "terminal_like", SandboxSettings(image_cache_dir=tmp_path / "cache"))
    assert [(c.name, c.status) for c in checks] == [("harness terminal_like: image", CheckStatus.FAIL)]
    assert missing in str(checks[0].detail) + str(checks[0].measured) and "no OCI layout directory" in str(checks[0].detail)


def test_concurrent_unpackers_of_one_image_agree_and_leave_no_partial_root(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    image = _image(tmp_path, [entry("d/", kind=D)] + [entry(f"d/f{i}", b"x" * 1000) for i in range(200)])
    with ThreadPoolExecutor(4) as pool:
        roots = list(pool.map(lambda _: resolve(image, tmp_path / "cache"), range(4)))
    assert len({r.path for r in roots}) == 1 and len(os.listdir(roots[0].path / "d")) == 200
    assert _leftovers(tmp_path / "cache") == []


def test_a_pinned_digest_refuses_an_image_that_has_another_naming_both(tmp_path):
    from agentrl_cli.config.models import HarnessConfig
    from agentrl_cli.envs.sandbox import SandboxSettings

    image = _image(tmp_path, [entry("f", b"x")])
    actual = resolve(image, tmp_path / "cache").digest
    pinned = "sha256:" + "e" * 64
    with pytest.raises(ImageError, match=f"its digest is {actual}, not the pinned {pinned}"):
        SandboxSettings(image_cache_dir=tmp_path / "cache").for_harness(HarnessConfig(name="h", image=image, image_digest=pinned))
    ok = SandboxSettings(image_cache_dir=tmp_path / "cache").for_harness(HarnessConfig(name="h", image=image, image_digest=actual))
    assert ok.image_digest == actual
