"""Data benchmark: trajectories/s and MB/s written to Parquet (zstd) through the trajectory writer
(redaction, schema validation, fsync, footer check, publish) against the raw sequential write speed
of the same disk (the same bytes written with `write` + `fsync`), measured side by side in one run;
the compression ratio; and reward-service scores/s for a batch of 1,000 over HTTP.
Target (issue 5): Parquet writing >= 50% of raw disk write throughput.

MB/s counts the trajectories' Arrow (in-memory, uncompressed) bytes, so both sides move the same
data: the raw side writes exactly those bytes, the Parquet side encodes and compresses them. One
untimed warm-up round of each side goes first (a writer lives as long as its run: thread pools,
allocator arenas and the page cache are warm after its first file), then `--rounds` interleaved ones.

    python benchmarks/data.py [--json] [--trajectories 2000] [--rounds 5] [--scores 1000]
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.core.redact import Redactor  # noqa: E402
from agentrl_cli.runtime.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord, to_table  # noqa: E402
from agentrl_cli.runtime.data.local_store import LocalStore  # noqa: E402
from agentrl_cli.runtime.data.writer import TrajectoryWriter  # noqa: E402
from benchmarks._common import figure, parser, report  # noqa: E402

HARNESSES = ("terminal_like", "code_sandbox_like", "tool_api_like")


def trajectories(n: int, seed: int = 0) -> list[TrajectoryRecord]:
    """Trajectories shaped like the rollout's: 2-12 steps of shell/tool text; token ids are the
    episode's text through the built-in byte-level tokenizer, the loss mask covers the actions, the
    log-probs follow a confident policy; numeric columns as numpy arrays, the form the rollout hands
    over (the trainer takes them as tensors). Seeded, so both sides of a round write the same data."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    words = ["ls", "-l", "cat", "notes.txt", "grep", "-c", "alpha", "total", "exit", "code", "0", "$", "echo",
             "awk", "{print", "$2}", "inventory.csv", "result", "=", "def", "solve(xs):", "return", "sum(x)"]
    out = []
    for i in range(n):
        steps, ids, mask = [], [], []
        for j in range(rng.randint(2, 12)):
            action = "<tool_call>\n" + " ".join(rng.choices(words, k=rng.randint(5, 30))) + "\n</tool_call>"
            obs = "\n".join(" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(rng.randint(1, 20)))
            steps.append(StepRecord(index=j, action=action, observation=obs, observation_status="ok",
                                    tool_calls=[ToolCallRecord("run_shell", "{}", "ok", rng.uniform(1, 300))],
                                    weight_version=str(i // 64)))
            for text, trained in ((action, 1), (obs, 0)):
                ids.append(np.frombuffer(text.encode(), dtype=np.uint8))
                mask.append(np.full(len(text.encode()), trained, dtype=np.int8))
        token_ids = np.concatenate(ids).astype(np.int32)
        out.append(TrajectoryRecord(
            run_id="bench", task_id=f"{HARNESSES[i % 3]}/arith/train/{i % 90:04d}", harness=HARNESSES[i % 3],
            harness_version="1.0", task_type="arith", steps=steps, turns=len(steps), tool_calls=len(steps),
            reward=rng.random(), reward_components={"outcome": 1.0, "format": 1.0}, reward_status="ok", outcome="success",
            token_ids=token_ids, loss_mask=np.concatenate(mask),
            logprobs=np.minimum(0.0, -nprng.exponential(0.3, len(token_ids))).astype(np.float32),
            trajectory_id=uuid.uuid4().hex))
    return out


def raw_write(path: Path, payload: bytes, chunk: int = 1 << 20) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(0, len(payload), chunk):
            f.write(payload[i:i + chunk])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def parquet_write(root: Path, records: list[TrajectoryRecord]) -> tuple[float, dict]:
    store = LocalStore(root)
    t0 = time.perf_counter()
    with TrajectoryWriter(store, rows_per_file=len(records), redactor=Redactor()) as w:
        for r in records:
            w.write(r)
    return time.perf_counter() - t0, dict(w.stats)


def arrow_payload(records: list[TrajectoryRecord]) -> bytes:
    """The trajectories' Arrow IPC bytes: what the raw side writes."""
    import pyarrow as pa

    table = to_table([r.to_row() for r in records])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def reward_rate(n: int) -> tuple[float, int]:
    """Scores/s of the reward service (HTTP, loopback) for one batch of `n` answer-checked trajectories."""
    from agentrl_cli.runtime.reward.client import HttpRewardClient
    from agentrl_cli.runtime.reward.models import ScoreRequest
    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.reward.service import create_app
    from agentrl_cli.core.serving import ServerThread
    from harnesses.tasks import load_tasks

    tasks = load_tasks("terminal_like", "train", "arith") + load_tasks("tool_api_like", "train", "arith")
    batch = [ScoreRequest.model_validate({
        "task": {"task_id": t.task_id, "harness": t.harness, "prompt": t.prompt, "answer": t.answer, "meta": t.meta},
        "trajectory_id": f"bench-{i}", "steps": [{"action": "<tool_call>{}</tool_call>", "observation": "42"},
                                                 {"action": f"ANSWER: {t.answer if i % 3 else -1}"}],
        "final_answer": str(t.answer if i % 3 else -1)}) for i, t in enumerate(tasks[j % len(tasks)] for j in range(n))]
    scorer = Scorer()
    server = ServerThread(create_app(scorer), name="reward").start()
    client = HttpRewardClient(server.url, timeout_s=600)
    try:
        t0 = time.perf_counter()
        results = client.score_batch(batch)
        rate = len(results) / (time.perf_counter() - t0)
        return rate, sum(r.status == "infra_error" for r in results)
    finally:
        client.close()
        server.stop()
        scorer.close()


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=2000, help="trajectories per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved raw/Parquet rounds (median ratio)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds of each side first")
    p.add_argument("--scores", type=int, default=1000, help="reward-service batch size")
    p.add_argument("--dir", default="", help="directory on the disk to measure (default: the system temp dir)")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="agentrl-bench-data-", dir=args.dir or None))
    figures: dict = {}
    try:
        records = trajectories(args.trajectories)
        payload = arrow_payload(records)
        mb = len(payload) / 1e6
        ratios, pq_rates, raw_rates, traj_rates, stats = [], [], [], [], {}
        for w in range(args.warmup):
            raw_write(base / f"warmup-{w}.bin", payload)
            parquet_write(base / f"warmup-store-{w}", records)
            shutil.rmtree(base / f"warmup-store-{w}")
            (base / f"warmup-{w}.bin").unlink()
        for r in range(args.rounds):  # interleaved, order alternating
            order = ("raw", "parquet") if r % 2 == 0 else ("parquet", "raw")
            took = {}
            for side in order:
                if side == "raw":
                    took["raw"] = raw_write(base / f"raw-{r}.bin", payload)
                else:
                    took["parquet"], stats = parquet_write(base / f"store-{r}", records)
            raw_rates.append(mb / took["raw"])
            pq_rates.append(mb / took["parquet"])
            traj_rates.append(len(records) / took["parquet"])
            ratios.append(pq_rates[-1] / raw_rates[-1])
        ratio = statistics.median(ratios)
        figures["parquet_trajectories_per_s"] = figure(statistics.median(traj_rates), "trajectories/s")
        figures["parquet_write_mb_per_s"] = figure(statistics.median(pq_rates), "MB/s (Arrow bytes)")
        figures["raw_disk_write_mb_per_s"] = figure(statistics.median(raw_rates), "MB/s")
        figures["parquet_vs_raw_disk"] = figure(ratio, "x (median of rounds)", ">= 0.5", ratio >= 0.5)
        figures["parquet_vs_raw_disk_min"] = figure(min(ratios), "x (worst round)")
        figures["compression_ratio"] = figure(len(payload) / stats["bytes"], "x (Arrow bytes / Parquet file bytes)")
        figures["payload_mb"] = figure(mb, "MB per round")
        rate, errors = reward_rate(args.scores)
        figures["reward_scores_per_s_batch"] = figure(rate, f"scores/s (batch of {args.scores}, HTTP)")
        figures["reward_infra_errors"] = figure(errors, "count", "0", errors == 0)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
