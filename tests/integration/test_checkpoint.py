"""Checkpoints (docs/security.md rows 20, 21): a save publishes a step atomically and moves `latest` last, so a
real SIGKILL at any moment of a save leaves `latest()` on a checkpoint that verifies; corrupted
checkpoints are skipped; pruning keeps the newest K and never the one `latest` names; the RNG state
round-trips so a resumed run continues the same random streams."""

from __future__ import annotations

import logging
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl_cli.learner.checkpoint import CheckpointManager, rng_state, set_rng_state

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def write_files(payload: dict[str, bytes]):
    def write(directory: Path) -> None:
        for name, data in payload.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(data)
    return write


def save_step(manager: CheckpointManager, step: int, **kwargs) -> Path:
    payload = {"model.bin": bytes([step % 256]) * 1000, "optim/state.bin": f"optim {step}".encode()}
    return manager.save(step, write_files(payload), {"step_loss": step / 10}, **kwargs)


def tmp_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))


# ---- round trip, pruning ----

def test_save_then_latest_returns_the_saved_checkpoint_with_its_files_and_meta(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt")
    path = save_step(manager, 7)

    assert path == tmp_path / "ckpt" / "step-00000007"
    assert manager.latest(verify_hashes=True) == path
    assert (path / "model.bin").read_bytes() == bytes([7]) * 1000
    assert (path / "optim" / "state.bin").read_bytes() == b"optim 7"
    record = manager.meta(path)
    assert record["step"] == 7 and record["meta"] == {"step_loss": 0.7}
    assert {f["path"]: f["size"] for f in record["files"]} == {"model.bin": 1000, "optim/state.bin": 7}
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-00000007"
    assert tmp_dirs(tmp_path / "ckpt") == []


def test_latest_is_none_when_nothing_was_saved(tmp_path):
    assert CheckpointManager(tmp_path / "missing").latest() is None


def test_keep_last_prunes_to_exactly_the_k_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40, 50):
        save_step(manager, step)

    assert [p.name for p in manager.list_complete()] == ["step-00000040", "step-00000050"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "latest", "step-00000040", "step-00000050"]
    assert manager.latest() == tmp_path / "step-00000050"


def test_the_checkpoint_latest_names_is_never_pruned_even_when_older_than_the_k_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    save_step(manager, 20)
    save_step(manager, 30)
    resumed = save_step(manager, 5)  # a run resumed from an earlier step saves a lower step number

    assert resumed.is_dir()
    assert manager.latest() == resumed
    assert [p.name for p in manager.list_complete()] == ["step-00000005", "step-00000030"]


def test_saving_a_step_that_already_exists_refuses_and_says_what_to_do(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = save_step(manager, 3)
    before = (first / "model.bin").read_bytes()

    with pytest.raises(FileExistsError, match=r"already exists.*never overwritten"):
        manager.save(3, write_files({"model.bin": b"other"}), {})
    assert (first / "model.bin").read_bytes() == before
    assert tmp_dirs(tmp_path) == []


def test_a_write_callback_that_raises_leaves_no_temp_dir_and_keeps_latest(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = save_step(manager, 1)

    def broken(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"x" * 100)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        manager.save(2, broken, {})
    assert tmp_dirs(tmp_path) == []
    assert manager.latest() == first


# ---- corruption ----

def test_a_truncated_file_makes_latest_fall_back_to_the_previous_checkpoint(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    first = save_step(manager, 1)
    second = save_step(manager, 2)
    with (second / "model.bin").open("r+b") as f:
        f.truncate(10)

    with caplog.at_level(logging.WARNING, logger="agentrl.training.checkpoint"):
        assert manager.latest() == first
    assert "step-00000002" in caplog.text and "model.bin has 10 bytes" in caplog.text


def test_a_checkpoint_without_complete_json_is_skipped(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    first = save_step(manager, 1)
    second = save_step(manager, 2)
    (second / "COMPLETE.json").unlink()

    with caplog.at_level(logging.WARNING, logger="agentrl.training.checkpoint"):
        assert manager.latest() == first
    assert "no COMPLETE.json" in caplog.text
    assert manager.list_complete() == [first]


def test_a_same_size_corruption_is_caught_only_when_hashes_are_verified(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = save_step(manager, 1)
    second = save_step(manager, 2)
    data = bytearray((second / "model.bin").read_bytes())
    data[500] ^= 0xFF
    (second / "model.bin").write_bytes(bytes(data))

    assert manager.latest() == second
    assert manager.latest(verify_hashes=True) == first


def test_files_above_hash_limit_are_recorded_and_checked_by_size_only(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = save_step(manager, 1, hash_limit_bytes=100)

    digests = {f["path"]: f["sha256"] for f in manager.meta(path)["files"]}
    assert digests["model.bin"] is None and len(digests["optim/state.bin"]) == 64
    (path / "model.bin").write_bytes(b"y" * 1000)  # same size, different bytes
    assert manager.latest(verify_hashes=True) == path


def test_a_pointer_naming_a_missing_or_foreign_dir_falls_back_to_the_newest_that_verifies(tmp_path, caplog):
    manager = CheckpointManager(tmp_path / "ckpt")
    save_step(manager, 1)
    second = save_step(manager, 2)
    (tmp_path / "ckpt" / "step-00000099").mkdir()  # a dir with no COMPLETE.json
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    for named in ("step-00000042", "../elsewhere", "step-00000099", ".tmp-step-00000002-abc"):
        (tmp_path / "ckpt" / "latest").write_text(named + "\n")
        with caplog.at_level(logging.WARNING, logger="agentrl.training.checkpoint"):
            assert manager.latest() == second, named
        assert named in caplog.text
    (tmp_path / "ckpt" / "latest").unlink()
    assert manager.latest() == second


# ---- SIGKILL during a save (row 21) ----

CHILD = r'''
import signal, sys, time
from pathlib import Path
from agentrl_cli.learner.checkpoint import CheckpointManager

root, markers, pause_at = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
SHARDS, SHARD_BYTES, CHUNK = 4, 2 << 20, 64 << 10

def reached(stage):
    (markers / stage).touch()
    if stage == pause_at:
        signal.pause()  # hold still until the test's SIGKILL

def shards(step, slow):
    def write(directory):
        for i in range(SHARDS):
            with open(directory / f"shard-{i}.bin", "wb") as f:
                for c in range(SHARD_BYTES // CHUNK):
                    f.write(bytes([step, i]) * (CHUNK // 2))
                    f.flush()
                    if slow:
                        time.sleep(0.001)
                    if slow and i == 1 and c == SHARD_BYTES // CHUNK // 2:
                        reached("mid_write")
    return write

CheckpointManager(root).save(1, shards(1, slow=False), {"step": 1})
reached("saved_1")
CheckpointManager(root, _pause_hook=reached).save(2, shards(2, slow=True), {"step": 2})
reached("saved_2")
'''

# stage the child holds at (or "none": killed while it writes freely) -> step latest() must return
KILL_POINTS = {
    "tmp_created": 1, "mid_write": 1, "files_written": 1, "files_synced": 1, "complete_written": 1,
    "renamed": 1, "pointer_moved": 2, "none": None,
}


def wait_until(condition, child: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if child.poll() is not None:
            pytest.fail(f"child exited ({child.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.001)


def some_shard_written(root: Path) -> bool:
    return any(f.stat().st_size > 0 for d in root.glob(".tmp-step-00000002-*") for f in d.glob("shard-*"))


@pytest.mark.parametrize("kill_at", list(KILL_POINTS))
def test_sigkill_during_a_save_never_leaves_a_checkpoint_latest_picks(tmp_path, kill_at):
    root, markers = tmp_path / "ckpt", tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with (tmp_path / "child.log").open("wb") as out:
        child = subprocess.Popen([sys.executable, str(script), str(root), str(markers), kill_at],
                                 stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        if kill_at == "none":
            wait_until(lambda: some_shard_written(root), child, "a shard of step 2 to appear")
        else:
            wait_until((markers / kill_at).exists, child, f"the child to reach {kill_at}")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "child.log").read_text()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    manager = CheckpointManager(root)
    expected = KILL_POINTS[kill_at]
    if kill_at in ("tmp_created", "mid_write", "files_written", "files_synced", "complete_written"):
        assert len(tmp_dirs(root)) == 1 and not (root / "step-00000002").exists()  # killed mid-save
    if kill_at == "renamed":
        assert (root / "step-00000002").is_dir() and (root / "latest").read_text().strip() == "step-00000001"
    found = manager.latest(verify_hashes=True)
    assert found is not None and found.name.startswith("step-")
    if expected is None:  # free-running kill: either the save had not finished, or it fully had
        expected = 2 if (markers / "pointer_moved").exists() else 1
    assert found == root / f"step-{expected:08d}"
    assert manager.latest() == found
    assert manager.meta(found)["meta"] == {"step": expected}
    assert (found / "shard-3.bin").stat().st_size == 2 << 20
    assert (found / "shard-0.bin").read_bytes()[:2] == bytes([expected, 0])

    third = save_step(manager, 3)
    assert manager.latest(verify_hashes=True) == third
    assert tmp_dirs(root) == []
    assert root / "step-00000001" in manager.list_complete()


# ---- random streams ----

def draws() -> tuple:
    return (tuple(random.random() for _ in range(5)), np.random.rand(5).tolist(), torch.rand(5).tolist(),
            np.random.normal(size=3).tolist(), torch.randint(0, 1000, (4,)).tolist())


def test_draws_after_restoring_the_rng_state_equal_the_draws_after_capture():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # leaves a cached gaussian in numpy's legacy state
    state = rng_state()
    expected = draws()
    later = draws()

    set_rng_state(state)
    assert draws() == expected
    assert later != expected  # the streams moved on; the restore is what brought them back


def test_rng_state_survives_pickle_and_torch_save_with_weights_only(tmp_path):
    random.seed(4), np.random.seed(5), torch.manual_seed(6)
    state = rng_state()
    expected = draws()
    torch.save(state, tmp_path / "rng.pt")
    draws()

    set_rng_state(pickle.loads(pickle.dumps(state)))
    assert draws() == expected
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected
