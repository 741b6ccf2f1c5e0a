"""OpenTelemetry spans of a run (`observe.traces: PATH`), appended to PATH as OTLP JSON: one
`ExportTraceServiceRequest` per line, encoded by OpenTelemetry's own OTLP/JSON encoder (hex trace and
span ids, integer enums), which an OpenTelemetry Collector's `otlpjsonfile` receiver reads.

The spans (names, then attributes, all under `agentrl.`):
- `episode`, a trace of its own per episode: `trajectory_id`, `run_id`, `harness`, `task_id`,
  `phase`, then `termination`, `reward`, `reward_status` when it ends; its children:
  - `model_call` per generation: `step`, then `output_tokens`, `weight_version`;
  - `tool_call` per environment step (the action's tool calls, or its text, to the harness):
    `step`, `tools` (the names of the action's tool calls), then `status`, `done`;
  - `reward` when the episode is scored: then `reward`, `reward_status`.
- `train_step`, a trace of its own per trainer step: `run_id`, `step`, then `loss`, `reward_mean`.
A span that ends by an exception has status ERROR and the exception as an event. Episodes played by
the recording gateway (`agent` harnesses) have their root and reward spans only.

How it is wired: the few places that open spans call `episode`, `train_step` (roots) and `child`
here. A root puts its tracer in the OpenTelemetry context (which asyncio tasks inherit), so `child`
traces only inside a traced episode or step and costs one context read otherwise. Tracers are kept
per file for the process, so every run, restart and phase of a process appends to one file handle
(relative paths resolve against the working directory, like observe.runs_dir). Export is synchronous
(SimpleSpanProcessor): a span is in the file once it ends; a failed write is logged by the SDK and
never reaches the run. Span text passes the process's secret redaction.
Belongs here: span names, attributes and the exporter; not what the spans time.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
NS = "agentrl."
_TRACERS: dict[str, Any] = {}  # absolute file -> its Tracer (one TracerProvider and exporter per file)
_LOCK = threading.Lock()
_KEY = None  # the OpenTelemetry context key of the current root's tracer (created on first use)


def _context_key():
    global _KEY
    if _KEY is None:
        from opentelemetry import context

        _KEY = context.create_key("agentrl-tracer")
    return _KEY


class JsonLinesSpanExporter:
    """The SDK's SpanExporter interface (export, shutdown, force_flush): each batch of spans appended
    to a file as one OTLP JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = None

    def export(self, spans) -> Any:
        from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        from agentrl_cli.core.redaction import current

        request = encode_spans(spans)
        if not request.resource_spans:
            return SpanExportResult.SUCCESS
        line = current().text(json.dumps(request.to_dict(), separators=(",", ":"))) + "\n"
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
            self._file.write(line)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def tracer_for(path: str):
    """The tracer that appends to `path` (one per file for the process), or None for "" (off)."""
    if not path:
        return None
    key = str(Path(path).absolute())
    with _LOCK:
        tracer = _TRACERS.get(key)
        if tracer is None:
            tracer = _TRACERS[key] = _new_tracer(Path(key))
    return tracer


def _new_tracer(path: Path):
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    except ImportError as exc:
        from agentrl_cli.core.errors import ConfigError
        from agentrl_cli.runtime.observe.trackers import INSTALL

        raise ConfigError(f"observe.traces is set, but the OpenTelemetry SDK is not installed here ({exc})",
                          f"{INSTALL}, or set observe.traces to ''") from exc
    from agentrl_cli import __version__

    provider = TracerProvider(resource=Resource.create({"service.name": "agentrl", "service.version": __version__}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    return provider.get_tracer("agentrl", __version__)


@contextmanager
def _root(tracer, name: str, attributes: dict) -> Iterator[Any]:
    """A span that starts a trace of its own (whatever span is current), its tracer in the context."""
    from opentelemetry import context

    token = context.attach(context.set_value(_context_key(), tracer))
    try:
        with tracer.start_as_current_span(name, context=context.Context(), attributes=_attrs(attributes)) as span:
            yield span
    finally:
        context.detach(token)


async def episode(observe, awaitable: Awaitable[T], *, trajectory_id: str, run_id: str, harness: str, task_id: str,
                  phase: str) -> T:
    """Await an episode (the controller's `(result, scored, record)`) inside its root span, when
    `observe.traces` is set; the termination and reward are set on the span when it ends."""
    tracer = tracer_for(observe.traces)
    if tracer is None:
        return await awaitable
    with _root(tracer, "episode", {"trajectory_id": trajectory_id, "run_id": run_id, "harness": harness,
                                   "task_id": task_id, "phase": str(phase)}) as span:
        out = await awaitable
        result, scored = (out[0], out[1]) if isinstance(out, tuple) and len(out) >= 2 else (out, None)
        span.set_attributes(_attrs({"termination": str(getattr(result, "termination", "")), **reward_attributes(scored)}))
        return out


async def train_step(observe, run_id: str, step: int, awaitable: Awaitable[T]) -> T:
    """Await a trainer step (its metrics row) inside its root span, when `observe.traces` is set."""
    tracer = tracer_for(observe.traces)
    if tracer is None:
        return await awaitable
    with _root(tracer, "train_step", {"run_id": run_id, "step": step}) as span:
        row = await awaitable
        if isinstance(row, dict):
            span.set_attributes(_attrs({"loss": row.get("train/loss"), "reward_mean": row.get("reward/mean")}))
        return row


async def child(name: str, awaitable: Awaitable[T], attributes: dict | None = None,
                after: Callable[[T], dict] | None = None) -> T:
    """Await `awaitable` in a child span of the current episode or step (no span outside one);
    `after(result)` gives attributes to add when it returns."""
    from opentelemetry import context

    tracer = context.get_value(_context_key()) if _KEY is not None else None
    if tracer is None:
        return await awaitable
    with tracer.start_as_current_span(name, attributes=_attrs(attributes or {})) as span:
        out = await awaitable
        if after is not None:
            span.set_attributes(_attrs(after(out)))
        return out


# ---- attributes of the children (what run_episode and the controller pass) ---------------------------

def model_call_attributes(gen) -> dict:
    return {"output_tokens": len(getattr(gen, "output_ids", []) or []), "weight_version": str(getattr(gen, "weight_version", ""))}


def tool_call_attributes(step: int, action) -> dict:
    return {"step": step, "tools": [c.name for c in getattr(action, "tool_calls", []) or []]}


def observation_attributes(obs) -> dict:
    return {"status": str(getattr(obs, "status", "")), "done": bool(getattr(obs, "done", False))}


def reward_attributes(scored) -> dict:
    if scored is None:
        return {}
    return {"reward": getattr(scored, "reward", None), "reward_status": str(getattr(scored, "status", ""))}


def _attrs(values: dict) -> dict:
    """`agentrl.`-named attributes with the values OpenTelemetry takes (None left out)."""
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = [str(v) for v in value]
        elif not isinstance(value, (str, bool, int, float)):
            value = str(value)
        out[NS + key] = value
    return out
