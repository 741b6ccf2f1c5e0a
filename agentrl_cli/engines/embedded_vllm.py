"""The embedded server in vLLM's dialect (`inference.engine: hf` with `inference.dialect: vllm`):
agentrl's own Hugging Face server on this host, started as the embedded engine starts it, speaking
vLLM's protocol (`vllm_dialect.py`, served by `inference/vllm_server.py`), so stages 4-8, verify, chaos
and the gateway run on a CPU box through the client path a vLLM deployment takes.

What it honours differs from vLLM's servers only where this host differs: the weight transfer's group
is gloo (vLLM's is NCCL), and pause takes `abort` and `keep` (not `wait`). Belongs here: that class.
Does not: the wire (`vllm_dialect.py`), the server (`inference/`), how the embedded engine starts."""

from __future__ import annotations

from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.engine import Capabilities, Setting
from agentrl_cli.engines.vllm_dialect import VLLMDialect


class EmbeddedVLLMEngine(VLLMDialect, EmbeddedEngine):
    """`inference.engine: hf`, `inference.dialect: vllm`."""

    title = "the embedded server (vLLM's protocol)"
    dialect = "vllm"
    capabilities = Capabilities(transports=frozenset({"disk", "distributed"}), adapters=True, pause_modes=("abort", "keep"),
                                constrained_tool_choice=False, host_cpu=True,
                                dialects=("vllm", "sglang"))

    def expected_settings(self, config) -> dict[str, Setting]:
        """What `server_launch` hands an embedded server, by the names vLLM's /server_info uses."""
        m, inf = config.model, config.inference
        return {"dtype": Setting(m.dtype, "model.dtype"), "max_model_len": Setting(m.context_length, "model.context_length"),
                "max_num_seqs": Setting(inf.max_batch_size, "inference.max_batch_size"),
                "pipeline_parallel_size": Setting(inf.pp_size, "inference.pp_size"),
                "enable_prefix_caching": Setting(inf.prefix_cache_tokens != 0, "inference.prefix_cache_tokens")}
