"""Call-log query benchmark: how long `agentrl data calls --task T` takes to answer from the call log
of a run of 10,000 tool calls (issue 35: under a second).

Synthetic trajectories (three harnesses, several steps each, one or two calls a step with arguments
and outputs of realistic size) go through the real writer (`TrajectoryWriter(call_log=True)`:
trajectory files, then call-log files of the same partitions) into a temporary local store. The
query is timed the way the command runs it, in this process: `read_calls` with the `--task` filter
(and once more with `--status error`), reading the store from disk each time; the median and the
worst of `--rounds` are reported, and the answer's row count is checked against the calls written.
The whole command in a new process (interpreter start, imports, config) is timed once beside it.

    python benchmarks/calls_query.py [--json] [--calls 10000] [--rounds 7]
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.runtime.data.calls import calls_filter, read_calls  # noqa: E402
from agentrl_cli.runtime.data.local_store import LocalStore  # noqa: E402
from agentrl_cli.runtime.data.record_from_episode import clip_output  # noqa: E402
from agentrl_cli.runtime.data.schema import StepRecord, ToolCallRecord, TrajectoryRecord  # noqa: E402
from agentrl_cli.runtime.data.writer import TrajectoryWriter  # noqa: E402
from benchmarks._common import figure, parser, report  # noqa: E402

HARNESSES = {"terminal_like": "run_shell", "code_sandbox_like": "run_python", "tool_api_like": "calculator"}


def trajectories(calls: int, seed: int = 0) -> list[TrajectoryRecord]:
    """Trajectories holding exactly `calls` tool calls, over 200 tasks, one run."""
    rng = random.Random(seed)
    start = dt.datetime(2026, 12, 1, 12, tzinfo=dt.timezone.utc)
    records, made, n = [], 0, 0
    while made < calls:
        harness = rng.choice(list(HARNESSES))
        steps = []
        for s in range(rng.randint(2, 6)):
            step_calls = []
            for _ in range(min(rng.randint(1, 2), calls - made)):
                output = "".join(rng.choice("abcdefghij \n") for _ in range(rng.randint(50, 2000)))
                clipped, size, digest = clip_output(output, 1024)
                status = "error" if rng.random() < 0.1 else "ok"
                step_calls.append(ToolCallRecord(HARNESSES[harness], json.dumps({"command": f"echo {made}"}), status,
                                                 rng.uniform(1, 300), 0, 1 if status == "error" else 0, clipped, size, digest))
                made += 1
            steps.append(StepRecord(s, "<tool_call>...</tool_call>", "observation", tool_calls=step_calls,
                                    started_at=start, ended_at=start))
        records.append(TrajectoryRecord(run_id="bench", task_id=f"task-{n % 200:04d}", harness=harness, harness_version="1",
                                        steps=steps, tool_calls=sum(len(s.tool_calls) for s in steps),
                                        trajectory_id=f"bench-train-g{n}-0", started_at=start, ended_at=start))
        n += 1
    return records


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="agentrl-calls-bench-"))
    figures = {}
    try:
        records = trajectories(args.calls)
        store = LocalStore(base / "store")
        t = time.perf_counter()
        with TrajectoryWriter(store, rows_per_file=256, call_log=True) as writer:
            for r in records:
                writer.write(r)
        write_s = time.perf_counter() - t
        logged = writer.stats["calls_logged"]
        task = records[0].task_id
        expected = sum(len(s.tool_calls) for r in records if r.task_id == task for s in r.steps)
        took, rows = [], 0
        read_calls(store, calls_filter(task=task))  # warm-up: the page cache and Arrow's allocator
        for _ in range(args.rounds):
            t = time.perf_counter()
            rows = read_calls(store, calls_filter(task=task)).num_rows
            took.append(time.perf_counter() - t)
        t = time.perf_counter()
        errors = read_calls(store, calls_filter(run="bench", status="error")).num_rows
        error_s = time.perf_counter() - t
        median = statistics.median(took)
        t = time.perf_counter()  # the whole command, a process of its own: interpreter, imports, config, query
        proc = subprocess.run([sys.executable, "-m", "agentrl_cli", "data", "calls", "--task", task, "--json",
                               "--set", f"data.root={store.root}"], capture_output=True, text=True, cwd=base, check=False)
        cli_s = time.perf_counter() - t
        cli_rows = json.loads(proc.stdout)["matched"] if proc.returncode == 0 else -1
        figures["calls_logged"] = figure(logged, "calls", f"== {args.calls}", logged == args.calls)
        figures["calls_files"] = figure(len(store.list("calls/")), "call-log files")
        figures["query_task_rows"] = figure(rows, "calls", f"== {expected}", rows == expected)
        figures["query_task_s"] = figure(median, f"s (median of {args.rounds}, --task over {args.calls} calls)",
                                         "< 1", median < 1.0)
        figures["query_task_worst_s"] = figure(max(took), "s (worst round)")
        figures["cli_task_s"] = figure(cli_s, f"s (`agentrl data calls --task T --json`, a new process; {cli_rows} rows)",
                                       None, None if cli_rows == expected else False)
        figures["query_status_error_s"] = figure(error_s, f"s (--run --status error, {errors} rows)")
        figures["write_s"] = figure(write_s, f"s ({len(records)} trajectories and their call log)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
