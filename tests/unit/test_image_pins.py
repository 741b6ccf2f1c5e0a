"""Issue 47, pinned and recorded: the image each harness's episodes run in is recorded by digest in
meta.json and the trajectory record (schema 4; a schema 3 store still reads, with no digest), pinned
in the image lock beside the role images and verified by stage 2's check, and `agentrl replay`
refuses a trajectory recorded in another image than the one it would replay it in, naming both.
The images are OCI layouts of one small layer each, written by the test (no unpacking needed)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.replay import ImageMismatch, replay
from agentrl_cli.runtime.data.schema import TrajectoryRecord
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from tests.image_layouts import entry, tar_layer, write_layout

GOLDEN_V3 = Path(__file__).resolve().parents[1] / "golden" / "trajectory_store_v3"


def _layout(root: Path, release: bytes) -> str:
    write_layout(root, [tar_layer([entry("etc/", kind=tarfile.DIRTYPE), entry("etc/os-release", release)])], tag="t")
    return f"oci:{root}:t"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("images")
    return {"a": _layout(d / "a", b'PRETTY_NAME="image a"\n'), "b": _layout(d / "b", b'PRETTY_NAME="image b"\n')}


def _config(*sets: str):
    return load_config(None, list(sets), env={}).config


def _digest(image: str) -> str:
    from agentrl_cli.envs.images import digest_of

    return digest_of(image)


def test_a_store_the_version_3_writer_wrote_still_reads_beside_records_with_an_image_digest(tmp_path):
    store = LocalStore(tmp_path / "v3")
    shutil.copytree(GOLDEN_V3, store.root)
    with TrajectoryWriter(store) as w:
        assert w.write(TrajectoryRecord(run_id="r", task_id="t", harness="terminal_like", harness_version="1",
                                        trajectory_id="new", image_digest="sha256:" + "ab" * 32))
    records = {r.trajectory_id: r for r in read_records(store)}
    old, new = records["golden-v3-train-g0-0"], records["new"]
    assert (old.schema_version, old.image_digest, old.role, old.steps[0].role) == (3, None, "solver", "solver")
    assert old.steps[0].tool_calls[0].output == "3\n" and old.token_ids == [1, 2, 3, 4]
    assert (new.schema_version, new.image_digest) == (4, "sha256:" + "ab" * 32)


def test_meta_json_records_each_harness_image_by_reference_and_digest(images, tmp_path):
    from agentrl_cli.acceptance.run_meta import create_run

    sets = [f"observe.runs_dir={tmp_path / 'runs'}", f"harnesses.0.image={images['a']}", f"harnesses.2.image={images['a']}"]
    loaded = load_config(None, sets, env={})
    meta = json.loads(create_run(loaded, run_id="r1", command=["test"]).meta_path.read_text())
    by_name = {h["name"]: h for h in meta["harnesses"]}
    assert by_name["terminal_like"]["image"] == {"ref": images["a"], "digest": _digest(images["a"]), "sandboxed": True}
    assert by_name["code_sandbox_like"]["image"] == {"ref": "", "digest": "", "sandboxed": True}  # the host root
    # tool_api_like acts through no sandbox: its episodes run in no image, whatever its entry names
    assert by_name["tool_api_like"]["image"] == {"ref": images["a"], "digest": "", "sandboxed": False}
    assert by_name["terminal_like"]["image_tag"] == "pinned-2026-08-01"  # the label, beside what runs


def _record(image_digest: str | None) -> TrajectoryRecord:
    return TrajectoryRecord(run_id="r", task_id="arith-train-001", harness="terminal_like", harness_version="1",
                            trajectory_id="t-1", image_digest=image_digest)


def test_replay_refuses_a_trajectory_recorded_in_another_image_naming_both(images):
    recorded, other = _digest(images["a"]), _digest(images["b"])
    with pytest.raises(ImageMismatch) as exc:
        replay(_record(recorded), platform_config=_config(f"harnesses.0.image={images['b']}"))
    assert exc.value.exit_code == 2
    assert f"ran in image {recorded}" in exc.value.message and f"replay it in image {other}" in exc.value.message
    assert "harnesses[terminal_like].image" in exc.value.hint
    with pytest.raises(ImageMismatch, match="would replay it in the host's root filesystem"):
        replay(_record(recorded), platform_config=_config())
    with pytest.raises(ImageMismatch, match="ran in the host's root filesystem") as host:
        replay(_record(""), platform_config=_config(f"harnesses.0.image={images['a']}"))
    assert "unset harnesses[terminal_like].image" in host.value.hint


def test_replay_goes_ahead_when_the_digests_agree_or_none_was_recorded(images):
    from agentrl_cli.runtime.data.replay import check_image

    check_image(_record(_digest(images["a"])), _config(f"harnesses.0.image={images['a']}"))
    check_image(_record(""), _config())
    check_image(_record(None), _config(f"harnesses.0.image={images['a']}"))  # a schema 3 record: not recorded


def test_the_lock_pins_environment_images_and_stage_2s_check_names_both_digests_on_a_mismatch(images, tmp_path):
    from agentrl_cli.ops.image import env_images
    from agentrl_cli.ops.image.lock import build_lock, read_lock, write_lock
    from agentrl_cli.ops.image.render import render

    cfg = _config(f"harnesses.1.image={images['a']}")
    pins, unresolved = env_images.pin(cfg.harnesses)
    assert pins == {"code_sandbox_like": {"ref": images["a"], "digest": _digest(images["a"])}} and not unresolved
    lock = read_lock(write_lock(build_lock(cfg.image, env_images=pins), tmp_path / "lock.json"))
    assert lock["environment_images"] == pins
    index = render(lock, tmp_path / "build", "registry.example", "")
    assert index["environment_images"] == [{"harness": "code_sandbox_like", **pins["code_sandbox_like"]}]

    (ok,) = env_images.checks(lock, "lock.json", cfg.harnesses)
    assert ok.status == CheckStatus.PASS and ok.measured["digest"] == _digest(images["a"])
    moved = _config(f"harnesses.1.image={images['b']}")
    (bad,) = env_images.checks(lock, "lock.json", moved.harnesses)
    assert bad.status == CheckStatus.FAIL and "agentrl image lock" in bad.hint
    assert _digest(images["b"]) in bad.detail and _digest(images["a"]) in bad.detail
    (dropped,) = env_images.checks(lock, "lock.json", _config().harnesses)
    assert dropped.status == CheckStatus.FAIL and "host's root" in dropped.detail
    unpinned = build_lock(cfg.image)
    assert "environment_images" not in unpinned  # a default config's lock is unchanged
    (missing,) = env_images.checks(unpinned, "lock.json", cfg.harnesses)
    assert missing.status == CheckStatus.FAIL and "pins no image for code_sandbox_like" in missing.detail
    (none,) = env_images.checks(unpinned, "lock.json", _config().harnesses)
    assert none.status == CheckStatus.SKIP and "no harnesses[].image" in none.detail


def test_an_image_that_is_gone_fails_its_lock_check_naming_it(images, tmp_path):
    from agentrl_cli.ops.image import env_images

    gone = f"oci:{tmp_path / 'nowhere'}:t"
    pins, unresolved = env_images.pin(_config(f"harnesses.0.image={gone}").harnesses)
    assert not pins and "no OCI layout directory" in unresolved["terminal_like"].message
    lock = {"environment_images": {"terminal_like": {"ref": gone, "digest": "sha256:" + "0" * 64}}}
    (check,) = env_images.checks(lock, "lock.json", _config(f"harnesses.0.image={gone}").harnesses)
    assert check.status == CheckStatus.FAIL and gone in check.detail


def test_an_image_on_a_harness_that_acts_through_no_sandbox_is_refused_when_it_is_built(images):
    from agentrl_cli.core.errors import ConfigError
    from harnesses.registry import create

    with pytest.raises(ConfigError) as refused:
        create("tool_api_like", _config(f"harnesses.2.image={images['a']}"))
    assert "harnesses[tool_api_like].image" in refused.value.message and "acts through no sandbox" in refused.value.message
    assert "remove image" in refused.value.hint
