"""SGLang's native HTTP protocol as an engine's wire: its routes, request bodies, answer parsing
and Prometheus names. SGLang's servers speak it, and so does the embedded server (so clients cannot
tell them apart); an engine that speaks it too subclasses `SGLangDialect` and adds how its servers
start (`embedded.py`, `sglang.py`). Belongs here: SGLang's wire format only. Does not: launching,
retries or rotation (`inference/launcher.py`, `inference/client.py`)."""

from __future__ import annotations

import re
from functools import lru_cache

from agentrl_cli.engines.engine import MetricNames, Routes, WireCall
from agentrl_cli.engines.generation import Generation, SamplingParams

ROUTES = Routes(
    health="/health", ready="/health_generate", generate="/generate",
    update_weights_from_disk="/update_weights_from_disk", init_weights_update_group="/init_weights_update_group",
    update_weights_from_distributed="/update_weights_from_distributed",
    destroy_weights_update_group="/destroy_weights_update_group", get_weights_by_name="/get_weights_by_name",
    weight_version=("/get_weight_version", "/model_info"), update_weight_version="/update_weight_version",
    load_lora_adapter="/load_lora_adapter", unload_lora_adapter="/unload_lora_adapter",
    pause="/pause_generation", resume="/continue_generation", server_info="/server_info", metrics="/metrics",
    openai=("/v1/chat/completions", "/v1/completions", "/v1/models"))
METRICS = MetricNames(queue="sglang:num_queue_reqs", running="sglang:num_running_reqs", busy_seconds="busy_seconds_total")
# SGLang's (and the embedded server's) 400 for a lora_path it has not loaded: a server that restarted
# and has not been given the policy's adapter again yet, so the request is tried on another server
ADAPTER_NOT_LOADED = "requested LoRA adapters are not loaded"


def sampling_params(sampling: SamplingParams) -> dict:
    """SGLang's `sampling_params` for `sampling`."""
    d = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
         "top_k": sampling.top_k, "no_stop_trim": True, "skip_special_tokens": False}
    if sampling.stop:
        d["stop"] = sampling.stop
    if sampling.stop_token_ids:
        d["stop_token_ids"] = sampling.stop_token_ids
    if sampling.seed is not None:
        d["sampling_seed"] = sampling.seed
    if sampling.ignore_eos:
        d["ignore_eos"] = True
    return d


def parse_generation(data: dict, latency: float, server: str, retries: int) -> Generation:
    """A /generate answer (`meta_info.output_token_logprobs` pairs of log-prob and token id)."""
    meta = data.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = data.get("output_ids") or [p[1] for p in pairs]
    logprobs = [float(p[0]) if p[0] is not None else float("nan") for p in pairs]
    reason = (meta.get("finish_reason") or {}).get("type", "stop") if isinstance(meta.get("finish_reason"), dict) else "stop"
    return Generation(output_ids=list(ids), output_logprobs=logprobs, finish_reason=reason,
                      weight_version=str(meta.get("weight_version", "default")), latency=latency, text=data.get("text", ""),
                      prompt_tokens=int(meta.get("prompt_tokens", 0) or 0), server=server, retries=retries, meta=meta)


# SGLang's other spellings of a dtype (its --dtype choices, torch's names) as the config spells it
DTYPE_NAMES = {"half": "float16", "float": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
               "torch.float32": "float32"}


@lru_cache(maxsize=None)
def _gauge(name: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", re.M)


def first_gauge(name: str, metrics_text: str) -> float | None:
    """The value of the Prometheus gauge `name`'s first series in `metrics_text`, None when absent."""
    m = _gauge(name).search(metrics_text)
    return float(m.group(1)) if m else None


class SGLangDialect:
    """The wire members of `InferenceEngine` (engine.py) as SGLang speaks them."""

    dialect = "sglang"
    routes = ROUTES
    metrics = METRICS

    def generate_body(self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None,
                      adapter: str | None = None) -> dict:
        body = {"input_ids": list(input_ids), "sampling_params": sampling_params(sampling), "return_logprob": True}
        if rid:
            body["rid"] = rid
        if adapter is not None:
            body["lora_path"] = adapter
        return body

    def parse_generation(self, data: dict, latency: float, server: str, retries: int) -> Generation:
        return parse_generation(data, latency, server, retries)

    def disk_update_body(self, path: str, version: str, abort_all_requests: bool = False) -> dict:
        return {"model_path": str(path), "weight_version": str(version), "abort_all_requests": abort_all_requests}

    def group_init_body(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                        group_name: str, backend: str) -> dict:
        return {"master_address": master_address, "master_port": int(master_port), "rank_offset": rank_offset,
                "world_size": world_size, "group_name": group_name, "backend": backend}

    def distributed_update_body(self, names, dtypes, shapes, version: str | None, *, group_name: str,
                                load_format: str | None = None, abort_all_requests: bool = False,
                                flush_cache: bool = False) -> dict:
        return {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                "group_name": group_name, "flush_cache": flush_cache, "abort_all_requests": abort_all_requests,
                "weight_version": None if version is None else str(version), "load_format": load_format}

    def group_destroy_body(self, group_name: str) -> dict:
        return {"group_name": group_name}

    def weights_by_name_body(self, name: str, truncate_size: int) -> dict:
        return {"name": name, "truncate_size": truncate_size}

    def version_update_body(self, version: str, abort_all_requests: bool = False) -> dict:
        return {"new_version": str(version), "abort_all_requests": abort_all_requests}

    def parse_weight_version(self, answer) -> str | None:
        return str(answer["weight_version"]) if isinstance(answer, dict) and "weight_version" in answer else None

    def adapter_load_body(self, name: str, path: str) -> dict:
        return {"lora_name": name, "lora_path": str(path)}

    def adapter_unload_body(self, name: str) -> dict:
        return {"lora_name": name}

    def adapter_missing(self, status: int, text: str) -> bool:
        return status == 400 and ADAPTER_NOT_LOADED in text

    def pause_body(self, mode: str) -> dict:
        return {"mode": mode}

    def queue_length(self, metrics_text: str) -> float | None:
        return first_gauge(self.metrics.queue, metrics_text)

    def busy_seconds(self, server_info: dict) -> float | None:
        states = (server_info.get("internal_states") if isinstance(server_info, dict) else None) or [{}]
        value = states[0].get(self.metrics.busy_seconds) if self.metrics.busy_seconds else None
        return float(value) if value is not None else None

    def reported_settings(self, server_info: dict) -> dict[str, object]:
        """The settings at the top of a /server_info answer (SGLang's resolved ServerArgs; the embedded
        server reports the same names), a dtype in the config's spelling."""
        if not isinstance(server_info, dict):
            return {}
        reported = {k: v for k, v in server_info.items() if k != "internal_states"}
        if isinstance(reported.get("dtype"), str):
            reported["dtype"] = DTYPE_NAMES.get(reported["dtype"], reported["dtype"])
        return reported

    # ---- conformance ---------------------------------------------------------------------------
    def wire_calls(self, config) -> list[WireCall]:
        """One of each request the client, the weight sync, server-load measurement and stage 4 send,
        built by the body methods above, with the answer fields they read (engines/conformance/)."""
        r = self.routes
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=-1, stop=["</s>"],
                                  stop_token_ids=[2], seed=7, ignore_eos=True)
        generate = self.generate_body([1, 2, 3], sampling, rid="r1", adapter="policy-lora")
        calls = [
            WireCall("generate", "POST", r.generate, generate,
                     reads=("output_ids", "text", "meta_info.output_token_logprobs", "meta_info.finish_reason",
                            "meta_info.weight_version", "meta_info.prompt_tokens")),
            WireCall("disk weight update", "POST", r.update_weights_from_disk, self.disk_update_body("/ckpt/3", "3", True)),
            WireCall("join the weight-update group", "POST", r.init_weights_update_group,
                     self.group_init_body("127.0.0.1", 29500, 1, 2, "agentrl", "nccl")),
            WireCall("distributed weight update", "POST", r.update_weights_from_distributed,
                     self.distributed_update_body(["w"], ["float32"], [(2, 2)], "3", group_name="agentrl",
                                                  load_format=None, abort_all_requests=True, flush_cache=True)),
            WireCall("leave the weight-update group", "POST", r.destroy_weights_update_group, self.group_destroy_body("agentrl")),
            WireCall("read a weight back", "POST", r.get_weights_by_name, self.weights_by_name_body("w", 4)),
            WireCall("relabel the weights", "POST", r.update_weight_version, self.version_update_body("3", True)),
            WireCall("load an adapter", "POST", r.load_lora_adapter, self.adapter_load_body("policy-lora", "/adapters/3")),
            WireCall("unload an adapter", "POST", r.unload_lora_adapter, self.adapter_unload_body("policy-lora")),
            *[WireCall(f"pause ({mode})", "POST", r.pause, self.pause_body(mode)) for mode in self.capabilities.pause_modes],
            WireCall("resume", "POST", r.resume, {}),
            WireCall("health", "GET", r.health),
            WireCall("ready", "GET", r.ready),
            *[WireCall("weight version", "GET", path, reads=("weight_version",)) for path in r.weight_version],
            WireCall("server info", "GET", r.server_info,
                     reads=(f"internal_states[].{self.metrics.busy_seconds}",) if self.metrics.busy_seconds else ()),
            WireCall("metrics", "GET", r.metrics, reads=(self.metrics.queue, self.metrics.running)),
        ]
        return calls + [WireCall("OpenAI API", "GET" if path.endswith("/models") else "POST", path) for path in r.openai]

