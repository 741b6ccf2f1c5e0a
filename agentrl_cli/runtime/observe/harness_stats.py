"""Per-harness service levels of a run's environments, recorded while the rollout runs.

Environment creation latency and failures by error, step latency, tool calls by status and tool
(with their latency when given), generation latency, and what each episode's sandbox used (CPU
time, peak memory, processes, open files: `env/<h>/cpu_s_mean|max`, `env/<h>/peak_mem_mb_max|p99`,
`env/<h>/processes_max`, `env/<h>/open_files_max`, over the episodes ended since the previous row).
The rollout records; `snapshot()` names the figures (`env/<harness>/…`, `infer/<harness>/…`) for
the step's metrics row: p50/p99 over a recent window, counts so far, and the latency samples
recorded since the previous snapshot (`…_samples`, at most SAMPLES_PER_ROW a series, so the run's
report can draw their histograms).
Belongs here: recording and summarising; the rollout decides what to record.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque

from agentrl_cli.runtime.observe import keys

WINDOW = 4096  # most recent samples kept per latency series (p50/p99 over a recent window)
SAMPLES_PER_ROW = 256  # newest samples since the last snapshot written into one row, per series


def percentile(values, q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class HarnessStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.create_s: dict[str, deque] = defaultdict(lambda: deque(maxlen=WINDOW))
        self.step_s: dict[str, deque] = defaultdict(lambda: deque(maxlen=WINDOW))
        self.tool_s: dict[str, deque] = defaultdict(lambda: deque(maxlen=WINDOW))
        self.generate_s: dict[str, deque] = defaultdict(lambda: deque(maxlen=WINDOW))
        self.create_failures: dict[str, Counter] = defaultdict(Counter)  # harness -> error kind -> count
        self.tools: dict[str, Counter] = defaultdict(Counter)  # harness -> (tool, status) -> count
        self._fresh: dict[tuple[str, str], deque] = defaultdict(lambda: deque(maxlen=SAMPLES_PER_ROW))
        self.resources: dict[str, list[dict]] = defaultdict(list)  # harness -> sandbox use of episodes since the last row

    def _sample(self, series: dict, kind: str, harness: str, seconds: float) -> None:
        series[harness].append(seconds)
        self._fresh[(kind, harness)].append(seconds)

    def record_create(self, harness: str, seconds: float, error: str | None = None) -> None:
        with self._lock:
            if error is None:
                self._sample(self.create_s, "create", harness, seconds)
            else:
                self.create_failures[harness][error] += 1

    def record_step(self, harness: str, seconds: float) -> None:
        with self._lock:
            self._sample(self.step_s, "step", harness, seconds)

    def record_tool(self, harness: str, tool: str, status: str, seconds: float | None = None) -> None:
        with self._lock:
            self.tools[harness][(tool, status)] += 1
            if seconds is not None:
                self._sample(self.tool_s, "tool", harness, seconds)

    def record_generation(self, harness: str, seconds: float) -> None:
        """One generation request of an episode of `harness` (the inference server's latency as the rollout saw it)."""
        with self._lock:
            self._sample(self.generate_s, "generate", harness, seconds)

    def record_resources(self, harness: str, usage: dict) -> None:
        """What one episode's sandbox used (`Sandbox.resources`: cpu_s, peak_memory_bytes, processes, open_files)."""
        with self._lock:
            self.resources[harness].append(usage)

    def _resource_figures(self, out: dict) -> None:
        for h, episodes in self.resources.items():
            if not episodes:
                continue
            cpu = [e["cpu_s"] for e in episodes if e.get("cpu_s") is not None]
            mem = [e["peak_memory_bytes"] / keys.MIB for e in episodes if e.get("peak_memory_bytes") is not None]
            procs = [e["processes"] for e in episodes if e.get("processes") is not None]
            files = [e["open_files"] for e in episodes if e.get("open_files") is not None]
            if cpu:
                out[keys.env_resource(h, "cpu_s_mean")] = round(sum(cpu) / len(cpu), 4)
                out[keys.env_resource(h, "cpu_s_max")] = round(max(cpu), 4)
            if mem:
                out[keys.env_resource(h, "peak_mem_mb_max")] = round(max(mem), 3)
                out[keys.env_resource(h, "peak_mem_mb_p99")] = round(percentile(mem, 0.99), 3)
            if procs:
                out[keys.env_resource(h, "processes_max")] = max(procs)
            if files:
                out[keys.env_resource(h, "open_files_max")] = max(files)
            episodes.clear()

    def snapshot(self) -> dict:
        """Flat, namespaced figures: `env/<h>/create_ms_p50|p99`, `env/<h>/create_failures/<error>`,
        `env/<h>/step_ms_p50|p99`, `env/<h>/tool_ms_p50|p99`, `env/<h>/tool/<tool>/<status>`,
        `infer/<h>/generate_ms_p50|p99`, and `…_ms_samples` lists of the samples since the last snapshot."""
        out: dict = {}
        with self._lock:
            for ns, name, series in (("env", "create_ms", self.create_s), ("env", "step_ms", self.step_s),
                                     ("env", "tool_ms", self.tool_s), ("infer", "generate_ms", self.generate_s)):
                for h, values in series.items():
                    for q in (0.5, 0.99):
                        v = percentile(values, q)
                        out[f"{ns}/{h}/{name}_p{round(q * 100)}"] = None if v is None else round(v * 1000, 3)
            for (kind, h), fresh in self._fresh.items():
                if fresh:
                    ns = "infer" if kind == "generate" else "env"
                    out[f"{ns}/{h}/{kind}_ms_samples"] = [round(s * 1000, 3) for s in fresh]
                    fresh.clear()
            for h, errors in self.create_failures.items():
                for error, n in errors.items():
                    out[keys.env_create_failures(h, error)] = n
            for h, calls in self.tools.items():
                for (tool, status), n in calls.items():
                    out[keys.env_tool(h, tool, status)] = n
            self._resource_figures(out)
        return out
