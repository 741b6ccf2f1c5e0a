"""`benchmarks/gpu_check.py --device cpu`, the GPU check's dry run: every part runs on the CPU at tiny
sizes and reports each figure as a number, or as skipped with its reason, and none as failed; and
the pack's plan, offline: what it carries and what it leaves to the target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# a throughput-free test (it judges no speed): it runs beside the other worker's tests, though it starts
# a dozen processes (workers, servers, two stage runs) for about a minute
pytestmark = [pytest.mark.integration]

STREAMS = (2, 4)
DEVICE_MEASURED = ["matmul_tflops", "deepspeed_step_s", "deepspeed_step_mfu", "fsdp_step_s", "fsdp_step_mfu",
                   "weight_transfer_gloo_s", "weight_transfer_gloo_first_s", "weight_transfer_gloo_share_of_step",
                   "check_wall_s", *(f"engine_{kind}_{n}_streams" for n in STREAMS for kind in ("tokens_per_s", "mfu"))]
STAGES_MEASURED = ["stage0_checks_passed", "stage0_wall_s", "stage8_smoke_checks_passed", "stage8_smoke_wall_s"]
DEVICE_SKIPPED = ["weight_transfer_nccl_s"]
STAGES_SKIPPED = ["stage0_smollm2_checks_passed", "stage8_smoke_smollm2_checks_passed"]


def _dry_run(workdir: Path, *parts: str) -> dict:
    args = ["--parts", ",".join(parts)] if parts else []
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--json", "--streams",
                           ",".join(map(str, STREAMS)), "--smollm2", "none", "--wheels", "/nonexistent",
                           "--workdir", str(workdir), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)["figures"]
    failed = {k: f["unit"] for k, f in figures.items() if f["value"] == "failed"}
    assert not failed, failed
    assert figures["device"]["value"] == "cpu"
    return figures


def _measured(figures: dict, measured: list[str], skipped: list[str]) -> None:
    for name in measured:
        value = figures[name]["value"]
        assert isinstance(value, (int, float)) and value >= 0, (name, figures.get(name))
    for name in skipped:
        assert figures[name]["value"] == "skipped" and figures[name]["unit"], (name, figures[name])


def test_the_dry_run_measures_every_device_part_on_the_cpu(tmp_path):
    """The parts a lent GPU runs that nothing else in the suite does (the engine's streams, both trainer
    backends' steps, the weight transfer); the stage runs, which every stage test covers, are the long one's."""
    figures = _dry_run(tmp_path, "engine", "train", "transfer")
    _measured(figures, DEVICE_MEASURED, DEVICE_SKIPPED)
    assert figures["weight_transfer_gloo_s"]["met"] is True  # every sync was read back from the server
    assert 0 < figures["weight_transfer_gloo_share_of_step"]["value"] < 1
    assert not set(STAGES_MEASURED) & set(figures)  # the parts not asked for do not run


@pytest.mark.long
def test_the_dry_run_measures_every_part_on_the_cpu(tmp_path):
    figures = _dry_run(tmp_path)
    _measured(figures, DEVICE_MEASURED + STAGES_MEASURED, DEVICE_SKIPPED + STAGES_SKIPPED)
    assert figures["stage0_checks_passed"]["value"] >= 1


def test_an_unknown_part_is_refused_before_anything_runs():
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--parts", "engine,warp"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "warp" in proc.stderr


def test_the_pack_carries_deepspeed_and_leaves_the_targets_packages_to_it():
    from benchmarks.gpu_pack import PROVIDED, PROVIDED_DEPS, plan

    roots, wheels = plan(["core", "stages"], [], "3.12")
    assert "deepspeed" in roots and "deepspeed" in wheels and "pyarrow" in wheels
    assert not set(wheels) & {*PROVIDED, *PROVIDED_DEPS}  # torch, transformers, peft and what they need stay there
    _, on_image = plan(["core", "stages"], ["cuda-image"], "3.12")
    assert "pyarrow" not in on_image and "deepspeed" in on_image
    core_roots, _ = plan(["core"], [], "3.12")
    assert "pyarrow" not in core_roots and "fastapi" in core_roots
