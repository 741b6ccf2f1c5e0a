"""The live run's metrics on a Prometheus endpoint (`observe.prometheus_port`, bound to
`observe.prometheus_addr`): the newest value of every numeric key of the metrics rows, as gauges.

Key to metric: `train/loss` -> `agentrl_train_loss`; per-harness keys carry the harness as a label
(`env/<h>/step_ms_p99` -> `agentrl_env_step_ms_p99{harness="<h>"}`, `eval/<h>/success_rate` ->
`agentrl_eval_success_rate{harness="<h>"}`), tool counts carry tool and status
(`agentrl_env_tool_calls{harness,tool,status}`), creation failures the error
(`agentrl_env_create_failures{harness,error}`), the sandbox pools' counters the harness
(`sandbox/<h>/leaked_processes` -> `agentrl_sandbox_leaked_processes{harness="<h>"}`), watchdog
counts the component (`agentrl_watchdog_stuck{component}`), the gateway's per-harness counters the
harness under a name of their own beside the run's total (`gateway/<h>/malformed_tool_calls` ->
`agentrl_gateway_harness_malformed_tool_calls{harness="<h>"}`). Every series also carries `run_id`.
Belongs here: naming and serving; the figures come from the rows.
"""

from __future__ import annotations

import re
import threading

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily

from agentrl_cli.core.errors import ConfigError

PREFIX = "agentrl_"
_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(parts: list[str]) -> str:
    return PREFIX + _BAD.sub("_", "_".join(p for p in parts if p))


def series(key: str) -> tuple[str, dict[str, str]] | None:
    """The metric name and labels of a row key; None for keys that are not series (step, version)."""
    labels: dict[str, str] = {}
    m = re.fullmatch(r"(.*)\{(.*)\}", key)
    if m:
        key, labels["component"] = m.group(1), m.group(2)
    parts = key.split("/")
    if len(parts) < 2:
        return None
    ns = parts[0]
    if ns == "gateway" and len(parts) == 3:  # `gateway/<counter>` is the run's total, with no label
        return metric_name(["gateway", "harness", parts[2]]), {"harness": parts[1]}
    if ns in ("env", "eval", "infer", "sandbox") and len(parts) >= 3:
        labels["harness"] = parts[1]
        rest = parts[2:]
        if ns == "env" and rest[0] == "tool" and len(rest) == 3:
            return metric_name(["env", "tool_calls"]), {**labels, "tool": rest[1], "status": rest[2]}
        if ns == "env" and rest[0] == "create_failures" and len(rest) == 2:
            return metric_name(["env", "create_failures"]), {**labels, "error": rest[1]}
        return metric_name([ns, *rest]), labels
    return metric_name(parts), labels


class _RowCollector:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.values: dict[tuple[str, tuple], float] = {}
        self.lock = threading.Lock()

    def update(self, row: dict) -> None:
        with self.lock:
            for key, value in row.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                named = series(key) if key not in ("step", "version") else (metric_name([key]), {})
                if named is None:
                    continue
                name, labels = named
                self.values[(name, tuple(sorted(labels.items())))] = float(value)

    def collect(self):
        with self.lock:
            items = sorted(self.values.items())
        families: dict[tuple[str, tuple], GaugeMetricFamily] = {}
        for (name, labels), value in items:
            names = ("run_id", *(k for k, _ in labels))
            fam = families.get((name, names))
            if fam is None:
                if any(n == name for n, _ in families):
                    continue  # one family per name: a key whose label set differs is left out
                fam = families[(name, names)] = GaugeMetricFamily(name, f"agentrl metric {name[len(PREFIX):]}", labels=names)
            fam.add_metric([self.run_id, *(v for _, v in labels)], value)
        yield from families.values()


class PrometheusExporter:
    """Serves the newest row values on http://ADDR:PORT/metrics until `close()`."""

    def __init__(self, port: int, addr: str = "127.0.0.1", run_id: str = "") -> None:
        from prometheus_client import start_http_server

        self.registry = CollectorRegistry()
        self.collector = _RowCollector(run_id)
        self.registry.register(self.collector)
        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve Prometheus metrics on {addr}:{port}: {exc.strerror or exc}",
                              "choose a free port with --set observe.prometheus_port=PORT, or turn it off with "
                              "--set observe.prometheus_port=null") from exc
        self.port = self.server.server_address[1]

    def update(self, row: dict) -> None:
        self.collector.update(row)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
