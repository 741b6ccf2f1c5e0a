"""Inference: the embedded Hugging Face engine and the server that speaks SGLang's HTTP protocol,
beside the engine-driven client and the launcher (the engines themselves, `InferenceEngine` and one
module per engine, are one level up: `agentrl_cli/engines/`).

Embedded server modules: `engine` (scheduler thread, batching, pause/abort, weight updates),
`batch` (decoding one batch over the KV cache), `sampling` (sampling settings, token choice,
log-probs, stop rules), `protocol` (request validation and response shapes), `hf_server` (the
FastAPI app), `metrics` (Prometheus names), `stats` (engine counters).

`HFEngine` and `create_app` are imported lazily, so importing the client does not load torch.
"""

from __future__ import annotations

__all__ = ["HFEngine", "create_app"]


def __getattr__(name: str):
    if name == "HFEngine":
        from agentrl_cli.engines.inference.engine import HFEngine
        return HFEngine
    if name == "create_app":
        from agentrl_cli.engines.inference.hf_server import create_app
        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
