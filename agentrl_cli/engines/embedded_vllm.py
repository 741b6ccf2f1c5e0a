"""The embedded server in vLLM's dialect (`inference.engine: hf` with `inference.dialect: vllm`):
agentrl's own Hugging Face server on this host, started as the embedded engine starts it, speaking
vLLM's protocol (`vllm_dialect.py`, served by `inference/vllm_server.py`), so stages 4-8, verify, chaos
and the gateway run on a CPU box through the client path a vLLM deployment takes.

What it honours differs from vLLM's servers only where this host differs: the weight transfer's group
is gloo (vLLM's is NCCL), and pause takes `abort` and `keep` (not `wait`). Belongs here: that class.
Does not: the wire (`vllm_dialect.py`), the server (`inference/`), how the embedded engine starts."""

from __future__ import annotations

from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.engine import Capabilities
from agentrl_cli.engines.vllm_dialect import VLLMDialect


class EmbeddedVLLMEngine(VLLMDialect, EmbeddedEngine):
    """`inference.engine: hf`, `inference.dialect: vllm`."""

    title = "the embedded server (vLLM's protocol)"
    dialect = "vllm"
    capabilities = Capabilities(transports=frozenset({"disk", "distributed"}), adapters=True, pause_modes=("abort", "keep"),
                                constrained_tool_choice=False, host_cpu=True)
