"""`image build --role env` without the network: a root filesystem tar becomes an OCI layout that the
reader verifies and the unpacker accepts (device nodes left out, diff_id the uncompressed layer's
sha256), and the build is cached by the hash of its inputs. mmdebstrap itself is stood in for by a
function that writes a tar; the real build is tests/integration/test_env_image_build.py (long)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from agentrl_cli.envs.images import parse, resolve
from agentrl_cli.envs.images.layout import write_layout
from agentrl_cli.envs.images.oci import read_manifest
from agentrl_cli.ops.image import env_image
from agentrl_cli.ops.image.env_image import BuilderMissing, EnvInputs, build_env_image, mmdebstrap_command
from tests.image_layouts import entry, tar_layer

OS_RELEASE = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_ID="12"\n'


def _rootfs_tar(path: Path) -> Path:
    dev = tarfile.TarInfo("./dev/null")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
    entries = [entry("./", kind=tarfile.DIRTYPE), entry("./dev/", kind=tarfile.DIRTYPE), (dev, None),
               entry("./etc/", kind=tarfile.DIRTYPE), entry("./etc/os-release", OS_RELEASE),
               entry("./usr/", kind=tarfile.DIRTYPE), entry("./usr/bin/", kind=tarfile.DIRTYPE),
               entry("./usr/bin/python3.11", b"#!py", mode=0o755),
               entry("./usr/bin/python3", kind=tarfile.SYMTYPE, link="python3.11"),
               entry("./usr/bin/py-hard", kind=tarfile.LNKTYPE, link="./usr/bin/python3.11"),
               entry("./bin", kind=tarfile.SYMTYPE, link="usr/bin")]
    path.write_bytes(tar_layer(entries))
    return path


def test_a_rootfs_tar_becomes_a_verified_layout_without_device_nodes(tmp_path):
    digest = write_layout(_rootfs_tar(tmp_path / "root.tar"), tmp_path / "layout", "env", {"k": "v"})
    manifest = read_manifest(parse(f"oci:{tmp_path / 'layout'}:env"))
    assert manifest.digest == digest
    with manifest.layers[0].open() as f:
        raw = gzip.decompress(f.read())
    assert manifest.config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(raw).hexdigest()]
    assert manifest.config["config"]["Labels"] == {"k": "v"}
    names = tarfile.open(fileobj=io.BytesIO(raw)).getnames()
    assert "./dev/null" not in names and "./usr/bin/py-hard" in names
    root = resolve(f"oci:{tmp_path / 'layout'}:env", tmp_path / "cache").path
    assert (root / "etc/os-release").read_bytes() == OS_RELEASE
    assert (root / "usr/bin/py-hard").stat().st_ino == (root / "usr/bin/python3.11").stat().st_ino
    assert not list(tmp_path.glob(".layout.*")), "the layout is written beside dest and renamed into place"


def test_rewriting_a_layout_replaces_the_old_one_whole(tmp_path):
    tar = _rootfs_tar(tmp_path / "root.tar")
    write_layout(tar, tmp_path / "layout", "old")
    write_layout(tar, tmp_path / "layout", "env")
    assert read_manifest(parse(f"oci:{tmp_path / 'layout'}:env")).layers
    with pytest.raises(Exception, match="no manifest tagged 'old'"):
        read_manifest(parse(f"oci:{tmp_path / 'layout'}:old"))


@pytest.fixture
def fake_mmdebstrap(monkeypatch):
    runs = []

    def run(cmd, progress):
        runs.append(cmd)
        progress("I: success")
        _rootfs_tar(Path(cmd[-2]))

    monkeypatch.setattr(env_image.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(env_image, "_run_mmdebstrap", run)
    return runs


def test_the_env_image_is_built_once_per_inputs_then_cached(tmp_path, fake_mmdebstrap):
    lines = []
    first = build_env_image(tmp_path, progress=lines.append)
    again = build_env_image(tmp_path)
    assert len(fake_mmdebstrap) == 1 and not first.cached and again.cached
    assert again.digest == first.digest and again.reference == f"oci:{tmp_path / ('env-' + EnvInputs().key())}:env"
    assert "I: success" in lines and any(line.startswith("writing the OCI layout") for line in lines)
    other = build_env_image(tmp_path, EnvInputs(packages=("bash", "coreutils", "python3", "git")))
    assert len(fake_mmdebstrap) == 2 and not other.cached and other.path != first.path
    build_env_image(tmp_path, force=True)
    assert len(fake_mmdebstrap) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.path.name, other.path.name]), "no temporary leftovers"


def test_a_broken_cached_image_is_built_again(tmp_path, fake_mmdebstrap):
    first = build_env_image(tmp_path)
    blob = first.path / "blobs" / "sha256" / first.digest.split(":")[1]
    blob.write_bytes(blob.read_bytes() + b" ")
    assert not build_env_image(tmp_path).cached and len(fake_mmdebstrap) == 2


def test_the_inputs_key_changes_with_each_input_and_not_with_package_order():
    base = EnvInputs()
    assert EnvInputs(packages=tuple(reversed(base.packages))).key() == base.key()
    assert len({base.key(), EnvInputs(release="trixie").key(), EnvInputs(mirror="http://m/debian").key(),
                EnvInputs(variant="essential").key()}) == 4
    cmd = mmdebstrap_command(base, Path("/x/root.tar"))
    assert cmd[:4] == ["mmdebstrap", "--variant=minbase", "--include=bash,coreutils,python3", "--format=tar"]
    assert cmd[4:] == ["bookworm", "/x/root.tar", "http://deb.debian.org/debian"]


def test_a_missing_mmdebstrap_is_refused_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(env_image.shutil, "which", lambda name: None)
    with pytest.raises(BuilderMissing) as exc:
        build_env_image(tmp_path)
    assert exc.value.hint == "apt-get install -y mmdebstrap" and exc.value.exit_code == 2


def test_image_build_role_env_prints_the_reference_and_digest_and_says_cached(tmp_path, cli, fake_mmdebstrap):
    result, first = cli.json("image", "build", "--role", "env", "--cache-dir", str(tmp_path / "images"))
    assert result.exit_code == 0 and first["status"] == "pass" and not first["cached"]
    assert first["reference"] == f"oci:{first['path']}:env" and first["digest"].startswith("sha256:")
    again = cli("image", "build", "--role", "env", "--cache-dir", str(tmp_path / "images"))
    assert again.exit_code == 0 and again.stdout.split() == [first["reference"], first["digest"]]
    assert "env image cached" in again.stderr and len(fake_mmdebstrap) == 1


def test_image_build_refuses_a_role_not_built_from_debian_packages(cli):
    result = cli("image", "build", "--role", "train")
    assert result.exit_code == 2 and "only env is" in result.stderr
