"""`/metrics` for the embedded server: a Prometheus collector that reads the engine's counters at
scrape time and names them as SGLang does (`sglang:num_running_reqs`, ...), label `model_name`.
Each app gets its own `CollectorRegistry`; nothing registers globally."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

GAUGES = {"num_running_reqs": "The number of running requests.",
          "num_queue_reqs": "The number of requests in the waiting queue.",
          "gen_throughput": "The generation throughput (token/s)."}
COUNTERS = {"prompt_tokens": "Number of prefill tokens processed.",
            "generation_tokens": "Number of generation tokens processed.",
            "cached_tokens": "Number of cached prompt tokens.",
            "num_requests": "Number of requests processed.",
            "num_aborted_requests": "Number of requests aborted."}


class EngineCollector:
    def __init__(self, engine, model_name: Callable[[], str]) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self):
        snap, labels = self.engine.snapshot(), [self.model_name()]
        for key, doc in GAUGES.items():
            family = GaugeMetricFamily(f"sglang:{key}", doc, labels=["model_name"])
            family.add_metric(labels, float(snap[key]))
            yield family
        for key, doc in COUNTERS.items():
            family = CounterMetricFamily(f"sglang:{key}", doc, labels=["model_name"])
            family.add_metric(labels, float(snap[f"{key}_total"]))
            yield family
        hist = snap["e2e_latency"]
        family = HistogramMetricFamily("sglang:e2e_request_latency_seconds",
                                       "Histogram of End-to-end request latency in seconds", labels=["model_name"])
        buckets = [("+Inf" if bound == float("inf") else repr(float(bound)), count) for bound, count in hist["buckets"]]
        family.add_metric(labels, buckets, sum_value=hist["sum"])
        yield family


def engine_registry(engine, model_name: Callable[[], str]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry
