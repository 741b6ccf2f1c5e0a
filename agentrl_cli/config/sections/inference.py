"""`inference`: the inference servers - engine, replicas, router, timeouts, keys. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from agentrl_cli.config.sections.base import (ENGINE_NAMES, Section)
from agentrl_cli.core import parts
from agentrl_cli.core.plugins import PLUGIN_PATH


class InferenceConfig(Section):
    engine: str = Field("hf", description="hf = embedded server on this host; sglang = SGLang servers; vllm = vLLM servers; or the `module:Class` path of an InferenceEngine of your own (docs/engines.md)",
                        json_schema_extra={"choices": ENGINE_NAMES, "plugin": "module:Class"})
    dialect: Literal["", "sglang", "vllm"] = Field("", description="The native HTTP protocol the servers speak: '' = the engine's own (SGLang's for hf); the embedded server (hf) speaks sglang or vllm, so the whole loop runs here through the client path of either engine")
    host: str = Field("127.0.0.1", description="Address the inference server binds to")
    port: int = Field(30000, ge=1, le=65535, description="Port of the first inference server (replicas take the next ports)")
    replicas: int = Field(1, ge=1, le=1024, description="Number of inference servers; more than one puts the SGLang router in front")
    router_policy: Literal["round_robin", "random", "cache_aware", "power_of_two", "least_loaded"] = Field(
        "round_robin", description="How requests are spread over replicas")
    urls: list[str] = Field(default_factory=list, description="Use already running servers at these URLs instead of starting any")
    router_url: str = Field("", description="A router already running in front of inference.urls (SGLang's or vLLM's): generation requests go to it, while weight updates, version checks and health checks go to each of inference.urls, which must then name the servers themselves ('' = no router: the client spreads requests over inference.urls)")
    python: str = Field("python3", description="Interpreter that has the engine (SGLang or vLLM) installed: they often live in their own environment")
    tp_size: int = Field(1, ge=1, description="Tensor-parallel size per server (SGLang, vLLM)")
    dp_size: int = Field(1, ge=1, description="Data-parallel size per server (SGLang, vLLM)")
    pp_size: int = Field(1, ge=1, description="Pipeline-parallel size per server: the model's layers split over this many GPUs (SGLang's --pp-size, vLLM's --pipeline-parallel-size; the embedded server runs one process and refuses more than 1)")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="Fraction of GPU memory for weights and KV cache (SGLang's --mem-fraction-static, vLLM's --gpu-memory-utilization; None = automatic)")
    max_running_requests: int | None = Field(None, ge=1, description="Cap on concurrently running requests per server (None = automatic)")
    api_key: SecretStr | None = Field(None, description="Bearer token the servers require (never written to reports)")
    enable_metrics: bool = Field(True, description="Expose Prometheus metrics at /metrics")
    max_batch_size: int = Field(64, ge=1, description="Embedded server: most requests decoded together in one forward pass")
    prefix_cache_tokens: int = Field(65536, ge=0, description="Embedded server: tokens of KV kept for requests that extend an earlier one, e.g. an agent's next turn (SGLang's radix cache; 0 disables it, and passes --disable-radix-cache to SGLang)")
    startup_timeout_s: float = Field(300.0, gt=0, description="Deadline for a server to become healthy")
    request_timeout_s: float = Field(120.0, gt=0, description="Deadline for one /generate request")
    max_retries: int = Field(3, ge=0, le=20, description="Retries for connection errors and 5xx answers")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature for rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold for rollouts")
    max_new_tokens: int = Field(128, ge=1, description="Most tokens generated per model turn")
    cpu_threads: int = Field(0, ge=0, le=1024, description="Embedded server on CPU: torch threads of each server process; 0 = auto: this host's cores split evenly between the embedded servers and the trainer ranks a run starts here (measured on 2 shared cores: one thread each beats two each by 1.5-3x)")

    @field_validator("engine")
    @classmethod
    def _engine_name(cls, value: str) -> str:
        if value not in ENGINE_NAMES and not PLUGIN_PATH.match(value):
            raise ValueError(f"must be one of {', '.join(ENGINE_NAMES)} or a `module:Class` path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _router_needs_servers(self):
        if self.router_url and not self.urls:
            raise ValueError(f"inference.router_url {self.router_url!r} names a router in front of servers this run did not start, "
                             "but inference.urls is empty: list the servers themselves in inference.urls (weight updates "
                             "reach each of them), or unset inference.router_url (a run that starts several servers starts "
                             "its own router)")
        if self.router_url.rstrip("/") in [u.rstrip("/") for u in self.urls]:
            raise ValueError("inference.router_url is also one of inference.urls: inference.urls must name the servers "
                             "behind the router, not the router (weight updates reach each server)")
        return self

    @model_validator(mode="after")
    def _dialect_of_engine(self):
        row = parts.row(parts.ENGINES, self.engine)
        if self.dialect and row is not None and f"dialect:{self.dialect}" not in row.honours:
            spoken = sorted(h.split(":", 1)[1] for h in row.honours if h.startswith("dialect:"))
            raise ValueError(f"inference.dialect {self.dialect!r}: the {self.engine} engine speaks {' or '.join(spoken)}; "
                             f"unset inference.dialect (or set it to {spoken[0]!r}); the embedded server "
                             "(inference.engine: hf) speaks either")
        return self
