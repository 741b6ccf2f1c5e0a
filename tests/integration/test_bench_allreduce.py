"""The all-reduce benchmark with real ranks (gloo on loopback, started by torch's launcher): its
timing against a plain torch.distributed timing loop written here, and a rank that never joins.
The launched benchmark's figures end to end: tests/e2e/test_stage1_network.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from agentrl_cli.ops.bench.allreduce import AllreduceSpec, checks, run_allreduce
from tests.conftest import free_port

pytestmark = pytest.mark.integration
SIZE, ITERS, ROUNDS, PAIRS = 4 << 20, 5, 2, 24

# One torchrun job times rounds with the benchmark's code and with a plain loop in turns (ours,
# plain, ours, ...), so both sample the same load on this shared CPU; per round the slowest rank
# counts, and the medians of the two sides are compared.
PAIRED = textwrap.dedent("""
    import json, os, statistics, sys, time
    import torch, torch.distributed as dist
    from agentrl_cli.ops.bench.allreduce import figures
    from agentrl_cli.ops.bench.allreduce_worker import time_allreduce
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    size, iters, pairs = (int(a) for a in sys.argv[1:4])
    t = torch.zeros(size // 4)
    for _ in range(2):
        dist.all_reduce(t)

    def plain_round():
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        return (time.perf_counter() - start) / iters

    ours, mine = [], []
    for _ in range(pairs):
        ours.append(time_allreduce(t, iters, 1))
        mine.append(plain_round())
    both = torch.tensor([ours, mine], dtype=torch.float64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    n = dist.get_world_size()
    if dist.get_rank() == 0:
        ours_busbw = figures(size, statistics.median(both[0].tolist()), n)["busbw_gbps"]
        plain_busbw = size / statistics.median(both[1].tolist()) / 1e9 * 2 * (n - 1) / n
        print("RESULT " + json.dumps({"ours": ours_busbw, "plain": plain_busbw}))
    dist.destroy_process_group()
""")


def _paired(script) -> dict:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", str(free_port()), str(script), str(SIZE), str(ITERS), str(PAIRS)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")).removeprefix("RESULT "))


def test_busbw_agrees_with_a_plain_timing_loop_within_10_percent(tmp_path):
    script = tmp_path / "paired.py"
    script.write_text(PAIRED)
    runs = []
    for _ in range(3):  # a burst of other work can still tilt one run; it is measured again, at most three times
        runs.append(_paired(script))
        if abs(runs[-1]["ours"] - runs[-1]["plain"]) / runs[-1]["plain"] <= 0.10:
            break
    assert abs(runs[-1]["ours"] - runs[-1]["plain"]) / runs[-1]["plain"] <= 0.10, runs


def test_a_rank_that_never_joins_is_killed_at_the_deadline_and_named(tmp_path):
    # rank 1 hangs before it reaches the benchmark (as on a host stuck importing from a dead mount)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, time\n"
        "if os.environ.get('RANK') == '1' and 'TORCHELASTIC_RUN_ID' in os.environ:\n"
        "    time.sleep(3600)\n")
    spec = AllreduceSpec(ranks=2, sizes=(4096,), iters=5, deadline_s=15, env={"PYTHONPATH": str(hook)})
    result = run_allreduce(spec)
    assert result.timed_out and result.missing_ranks == [1]
    assert result.elapsed_s < 15 + 30  # ended at the deadline, not at the process group's own timeout
    (check,) = checks(result, 0.05)
    assert check.status == "fail" and "rank 1" in check.detail and check.hint
    leftover = subprocess.run(["pgrep", "-f", "agentrl_cli.ops.bench.allreduce_worker"], capture_output=True, text=True).stdout
    assert _started_with(leftover.split(), f"PYTHONPATH={hook}") == [], "ranks left running after the deadline"


def _started_with(pids: list[str], variable: str) -> list[str]:
    """The pids whose environment holds `variable` (this test's ranks, not a stage-1 benchmark's that a
    parallel pytest worker runs at the same time)."""
    mine = []
    for pid in pids:
        try:
            if variable.encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                mine.append(pid)
        except OSError:  # gone meanwhile
            pass
    return mine
