"""The measurements of the GPU check (`gpu_check.py`): the matrix-multiply rate, the embedded
engine's tokens/s at a number of concurrent streams, one training step of a backend, the weight
transfer from a trainer process to a server process, and a stage run. The step and the transfer run
in processes of their own (`run_worker`), each with a fresh process group, as a run's trainer does.

Every function measures on the device it is given ("cuda" or "cpu") and returns plain numbers;
turning them into figures, skips and ratios is `gpu_check.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# SmolLM2-135M-Instruct's architecture (its config.json), for a model of that shape with random weights
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048, rope_theta=100000.0)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_matmul(device: str, dtype: str, size: int, seconds: float) -> dict:
    """C = A @ B (size x size, `dtype`) on `device`, repeated for `seconds` after warm-up; FLOP/s of the
    median call (each call timed alone, the device synchronized around it) and of the fastest."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, generator=gen, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, generator=gen, device=device, dtype=getattr(torch, dtype))
    c = torch.empty_like(a)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    synchronize(device)
    calls: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(calls) < 3:
        t = time.perf_counter()
        torch.matmul(a, b, out=c)
        synchronize(device)
        calls.append(time.perf_counter() - t)
    flop = 2.0 * size ** 3
    return {"size": size, "dtype": dtype, "calls": len(calls), "flops": flop / statistics.median(calls),
            "best_flops": flop / min(calls)}


def build_model(kind: str, dest: Path) -> Path:
    """A model directory: "tiny" (the built-in architecture) or "smollm2-shape" (SmolLM2-135M's), random weights."""
    from agentrl_cli.model.tiny import build_random

    return build_random(dest, seed=0, **(SMOLLM2_SHAPE if kind == "smollm2-shape" else {}))


def matmul_weights(model_dir: Path) -> int:
    """N of `benchmarks/gemm.py`'s FLOP rule: the weights of every matrix multiply (2N per generated
    token, 6N per trained token)."""
    from benchmarks.gemm import linear_shapes, model_flops

    return model_flops(linear_shapes(model_dir))["matmul_weights"]


def engine_streams(model_dir: Path, device: str, dtype: str, streams: list[int], new_tokens: int) -> dict[int, dict]:
    """Tokens/s of the embedded engine (`HFEngine`, in this process, through its submit API) with `n`
    requests submitted at once for each n of `streams`: every request generates `new_tokens` tokens
    (EOS ignored), so the work is fixed; the wall time runs from submitting to the last result."""
    from agentrl_cli.engines.inference.engine import HFEngine

    engine = HFEngine(model_dir, dtype=dtype, max_batch_size=max(streams), batch_window_ms=10, device=device)
    try:
        prompts = [_prompt(engine.tokenizer, i) for i in range(max(streams))]
        _generate(engine, prompts[:2], 4)  # warm-up: kernels, allocator
        out = {}
        for n in streams:
            t0 = time.perf_counter()
            results = _generate(engine, prompts[:n], new_tokens)
            wall = time.perf_counter() - t0
            tokens = sum(r["completion_tokens"] for r in results)
            out[n] = {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}
        return out
    finally:
        engine.close()


def _prompt(tokenizer, i: int) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": f"Compute the value of {i} + {2 * i + 1}."}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)


def _generate(engine, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    specs = [{"input_ids": p, "sampling": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0,
                                           "sampling_seed": i}} for i, p in enumerate(prompts)]
    return [f.result(timeout=1800) for f in engine.submit_many(specs)]


def train_samples(n: int, seq_len: int, model_dir: Path, seed: int) -> list:
    from agentrl_cli.acceptance.select.stress_worker import samples

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    return samples(n, seq_len, vocab, seed)


def train_step(spec: dict) -> dict:
    """One rank of `spec["backend"]` (deepspeed, fsdp) in this process, in `spec["precision"]`: an
    untimed warm-up step, then `spec["steps"]` timed steps of `micro_batch` samples of `seq_len` tokens."""
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.backend import backend_class

    cfg = TrainingConfig(backend=spec["backend"], precision=spec["precision"], micro_batch_size=spec["micro_batch"],
                         gradient_accumulation_steps=1, world_size=1, learning_rate=1e-5, resume_from_latest=False)
    backend = backend_class(cfg)(str(spec["model"]), cfg)
    try:
        backend.train_step(train_samples(spec["micro_batch"], spec["seq_len"], spec["model"], seed=0))
        times, losses = [], []
        for step in range(spec["steps"]):
            batch = train_samples(spec["micro_batch"], spec["seq_len"], spec["model"], seed=step + 1)
            t0 = time.perf_counter()
            metrics = backend.train_step(batch)  # its loss is read back: the device has finished the step
            times.append(time.perf_counter() - t0)
            losses.append(float(metrics["loss"]))
        return {"step_s": statistics.median(times), "steps": len(times), "device": str(backend.device),
                "losses": losses, "tokens": spec["micro_batch"] * spec["seq_len"]}
    finally:
        backend.close()


def transfer(spec: dict) -> dict:
    """A DeepSpeed trainer in this process (on CUDA when there is one) and one embedded server in its own
    process: the train step's time, then `rounds` verified syncs over a `distributed` weight-update
    group with `spec["group_backend"]` (nccl or gloo); the first opens the group."""
    from agentrl_cli.config import load_config
    from agentrl_cli.engines.inference.launcher import launch
    from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend

    sets = [f"inference.port={free_port()}", "inference.max_batch_size=8", f"training.precision={spec['precision']}",
            f"training.micro_batch_size={spec['micro_batch']}", "training.gradient_accumulation_steps=1"]
    cfg = load_config(None, sets, env={}).config
    logs = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    servers, urls = launch(cfg, str(spec["model"]), logs)
    backend = None
    try:
        backend = DeepSpeedBackend(str(spec["model"]), cfg.training)
        batch = train_samples(spec["micro_batch"], spec["seq_len"], spec["model"], seed=0)
        backend.train_step(batch)
        t0 = time.perf_counter()
        backend.train_step(batch)
        step_s = time.perf_counter() - t0
        try:
            history = asyncio.run(_syncs(backend, urls[0], spec["group_backend"], spec["rounds"], spec["timeout_s"]))
        except Exception as exc:  # noqa: BLE001 - the error and the server's log are the finding
            tail = servers[0].log_tail(1500) if servers else ""
            return {"error": f"{type(exc).__name__}: {exc}", "server_log": tail, "step_s": step_s}
        return {"step_s": step_s, "device": str(backend.device), "history": history}
    finally:
        if backend is not None:
            backend.close()
        for s in servers:
            s.stop()


async def _syncs(backend, url: str, group_backend: str, rounds: int, timeout_s: float) -> list[dict]:
    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.weightsync.distributed import DistributedTransport
    from agentrl_cli.weightsync.publisher import WeightPublisher

    client = InferenceClient(url, timeout_s=600)
    publisher = WeightPublisher(DistributedTransport(client, backend=group_backend, group_name=f"gpu-check-{group_backend}",
                                                     timeout_s=timeout_s), client)
    try:
        for version in range(1, rounds + 1):
            await publisher.sync(backend, version)
        return publisher.history
    finally:
        await publisher.close()
        await client.close()


def stage_run(stage: str, sets: list[str], workdir: Path, timeout_s: float) -> dict:
    """`agentrl stage run <stage> --json` with `sets` in a process of its own, in `workdir`: its status, the
    checks that did not pass, and its wall time."""
    args = [sys.executable, "-m", "agentrl_cli", "stage", "run", *stage.split(), "--json", *sets]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    wall = time.perf_counter() - t0
    try:
        report = json.loads(proc.stdout)["reports"][0]
    except (ValueError, KeyError, IndexError):
        raise RuntimeError(f"agentrl stage run {stage} printed no report (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-1500:]}") from None
    checks = report["checks"]
    return {"status": report["status"], "wall_s": wall, "checks": sum(c["status"] != "info" for c in checks),
            "info": sum(c["status"] == "info" for c in checks), "passed": sum(c["status"] == "pass" for c in checks),
            "not_passed": [f"{c['name']}: {c['status']}" for c in checks if c["status"] not in ("pass", "info")]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKERS = {"train_step": train_step, "transfer": transfer}


def run_worker(spec: dict) -> int:
    """The body of `gpu_check.py --worker SPEC`: run one part, write its result (or its error) to spec["out"]."""
    try:
        result = WORKERS[spec["part"]](spec)
    except Exception as exc:  # noqa: BLE001 - the parent reports it as the part's failure
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def in_process(spec: dict, timeout_s: float) -> dict:
    """Run a worker part in a new process (`gpu_check.py --worker`) and return its result."""
    out = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-")) / "result.json"
    spec = {**spec, "model": str(spec["model"]), "out": str(out)}
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--worker", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:g} s"}
    if not out.is_file():
        return {"error": f"the worker exited {proc.returncode} without a result: {proc.stderr[-1500:]}"}
    return json.loads(out.read_text())
