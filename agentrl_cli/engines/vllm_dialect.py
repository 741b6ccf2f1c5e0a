"""vLLM's HTTP protocol as an engine's wire (vLLM 0.33, checked against its code by
`agentrl engine verify`): token ids in and out on `/inference/v1/generate`, the native weight
transfer in four phases (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`; the RL routes vLLM serves with `VLLM_SERVER_DEV_MODE=1`), a load from disk
through the workers' `reload_weights` (`/collective_rpc`), LoRA adapters under `/v1/`, pause
(`/pause?mode=keep|abort|wait`) and resume, and its Prometheus names (`vllm:num_requests_waiting`).
vLLM's servers speak it (`vllm.py`), and so does the embedded server with `inference.dialect: vllm`
(`embedded_vllm.py`). Belongs here: vLLM's wire format only. Does not: launching (`vllm.py`),
retries or rotation (`inference/client.py`).

What vLLM has no route for, the routes name "" and the client does without: reading a parameter
back (weight-sync verification falls back to the served weight version), and the seconds a server
spent inside a batch (the server-load check reports the busy fraction as not measured).
"""

from __future__ import annotations

import re

from agentrl_cli.engines.engine import MetricNames, Routes, WireCall
from agentrl_cli.engines.generation import Generation, SamplingParams
from agentrl_cli.engines.sglang_dialect import DTYPE_NAMES, first_gauge

ROUTES = Routes(
    health="/health", ready="/health", generate="/inference/v1/generate",
    update_weights_from_disk="/collective_rpc", init_weights_update_group="/init_weight_transfer_engine",
    update_weights_from_distributed="/update_weights", destroy_weights_update_group="/shutdown_weight_transfer_engine",
    get_weights_by_name="", weight_version=("/weight_info",), update_weight_version="/update_weight_version",
    load_lora_adapter="/v1/load_lora_adapter", unload_lora_adapter="/v1/unload_lora_adapter",
    pause="/pause", resume="/resume", server_info="/server_info", metrics="/metrics",
    openai=("/v1/chat/completions", "/v1/completions", "/v1/models"))
START_WEIGHT_UPDATE, FINISH_WEIGHT_UPDATE = "/start_weight_update", "/finish_weight_update"
ABORT = "/abort_requests"
METRICS = MetricNames(queue="vllm:num_requests_waiting", running="vllm:num_requests_running", busy_seconds="")
# vLLM's pause modes: "abort" hands back what is in flight, "wait" lets it finish, "keep" freezes it
# in the queue until /resume (the mode a weight update uses: nothing is lost across it)
PAUSE_MODES = ("abort", "wait", "keep")
UPDATE_PAUSE = "keep"
# a /generate for an adapter that is not loaded: vLLM answers 404 naming the model it does not serve
ADAPTER_NOT_FOUND = re.compile(r"(does not exist|not found)", re.I)


def sampling_params(sampling: SamplingParams) -> dict:
    """vLLM's `SamplingParams` fields for `sampling`: the sampled tokens' log-probs (`logprobs: 0`),
    special tokens kept (the trainer needs every token id; the text is decoded on our side)."""
    d = {"max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
         "top_k": sampling.top_k if sampling.top_k > 0 else 0, "logprobs": 0, "skip_special_tokens": False}
    if sampling.stop:
        d["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        d["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        d["seed"] = sampling.seed
    if sampling.ignore_eos:
        d["ignore_eos"] = True
    return d


def parse_generation(data: dict, latency: float, server: str, retries: int) -> Generation:
    """A `/inference/v1/generate` answer in `tokens` mode: the first choice's token ids, their
    log-probs (`logprobs.content[].logprob`), finish reason and the weight versions that sampled them
    (`weight_versions` spans; the last one labels the generation)."""
    choice = (data.get("choices") or [{}])[0]
    ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(c["logprob"]) if c.get("logprob") is not None else float("nan") for c in content]
    spans = choice.get("weight_versions") or []
    version = str(spans[-1]["version"]) if spans else "default"
    reason = choice.get("finish_reason") or "stop"
    usage = data.get("usage") or {}
    # `meta` as the resume path reads it (a dict finish reason with the abort's message)
    meta = {"finish_reason": {"type": reason, "message": choice.get("stop_reason")}, "weight_versions": spans,
            "request_id": data.get("request_id")}
    return Generation(output_ids=ids, output_logprobs=logprobs, finish_reason=reason, weight_version=version,
                      latency=latency, text="", prompt_tokens=int(usage.get("prompt_tokens", 0) or 0), server=server,
                      retries=retries, meta=meta)


class VLLMDialect:
    """The wire members of `InferenceEngine` (engine.py) as vLLM speaks them."""

    dialect = "vllm"
    routes = ROUTES
    metrics = METRICS

    # ---- generation ----------------------------------------------------------------------------
    def generate_body(self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None,
                      adapter: str | None = None) -> dict:
        """A LoRA adapter is asked for by its name as the request's `model` (vLLM serves each loaded
        adapter as a model of that name)."""
        body = {"token_ids": list(input_ids), "sampling_params": sampling_params(sampling)}
        if rid:
            body["request_id"] = rid
        if adapter is not None:
            body["model"] = adapter
        return body

    def parse_generation(self, data: dict, latency: float, server: str, retries: int) -> Generation:
        return parse_generation(data, latency, server, retries)

    def abort_body(self, rids: list[str]) -> dict:
        return {"request_ids": list(rids)}

    # ---- weights -------------------------------------------------------------------------------
    def disk_update_body(self, path: str, version: str, abort_all_requests: bool = False) -> dict:
        """The workers' `reload_weights(weights_path=...)` (vLLM passes collective_rpc kwargs as strings)."""
        return {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}

    def disk_update_calls(self, path: str, version: str, abort_all_requests: bool = False) -> list[WireCall]:
        """Requests held (`keep`; `abort` when asked to abort), the weights reloaded from `path`,
        relabelled `version`, requests let go again (the resume is sent whatever failed before it)."""
        return [self._pause_call("abort" if abort_all_requests else UPDATE_PAUSE),
                WireCall("disk weight update", "POST", self.routes.update_weights_from_disk,
                         self.disk_update_body(path, version, abort_all_requests)),
                WireCall("weight version", "POST", self.routes.update_weight_version,
                         self.version_update_body(version), reads=("new_version",)),
                self._resume_call()]

    def group_init_body(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                        group_name: str, backend: str) -> dict:
        """vLLM's NCCL init info (its weight-transfer backend is chosen at launch,
        `--weight-transfer-config`; one transfer engine per server, so no group name)."""
        return {"init_info": {"master_address": master_address, "master_port": int(master_port),
                              "rank_offset": rank_offset, "world_size": world_size}}

    def distributed_update_body(self, names, dtypes, shapes, version: str | None, *, group_name: str,
                                load_format: str | None = None, abort_all_requests: bool = False,
                                flush_cache: bool = False) -> dict:
        return {"update_info": {"names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}}

    def distributed_update_calls(self, names, dtypes, shapes, version: str | None, *, group_name: str,
                                 load_format: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = False) -> list[WireCall]:
        """The four phases between a pause and a resume: start, receive the broadcast tensors
        (`update_weights`, concurrently with the trainer's broadcast), finish labelled `version`."""
        if load_format not in (None, ""):
            raise ValueError(f"vLLM's update_weights takes tensors one by one here; load_format {load_format!r} is "
                             "SGLang's (use none)")
        finish = {} if version is None else {"weight_version": str(version)}
        return [self._pause_call("abort" if abort_all_requests else UPDATE_PAUSE),
                WireCall("start weight update", "POST", START_WEIGHT_UPDATE),
                WireCall("distributed weight update", "POST", self.routes.update_weights_from_distributed,
                         self.distributed_update_body(names, dtypes, shapes, version, group_name=group_name)),
                WireCall("finish weight update", "POST", FINISH_WEIGHT_UPDATE, finish),
                self._resume_call()]

    def group_destroy_body(self, group_name: str) -> dict:
        return {}

    def weights_by_name_body(self, name: str, truncate_size: int) -> dict:
        raise NotImplementedError("vLLM has no route that reads a parameter back")

    def version_update_body(self, version: str, abort_all_requests: bool = False) -> dict:
        return {"new_version": str(version)}

    def parse_weight_version(self, answer) -> str | None:
        if isinstance(answer, dict) and answer.get("weight_version") is not None:
            return str(answer["weight_version"])
        return None

    def answer_ok(self, status: int, answer) -> bool:
        """vLLM's RL routes answer 200 with a message (errors are 4xx/5xx with `error` or `detail`)."""
        return status == 200 and not (isinstance(answer, dict) and answer.get("success") is False)

    # ---- adapters ------------------------------------------------------------------------------
    def adapter_load_body(self, name: str, path: str) -> dict:
        return {"lora_name": name, "lora_path": str(path)}

    def adapter_unload_body(self, name: str) -> dict:
        return {"lora_name": name}

    def adapter_missing(self, status: int, text: str) -> bool:
        return status == 404 and bool(ADAPTER_NOT_FOUND.search(text))

    # ---- pause ---------------------------------------------------------------------------------
    def pause_body(self, mode: str) -> dict:
        return {}

    def pause_query(self, mode: str) -> dict:
        return {"mode": mode}

    def _pause_call(self, mode: str) -> WireCall:
        return WireCall("pause", "POST", self.routes.pause, query=self.pause_query(mode))

    def _resume_call(self) -> WireCall:
        return WireCall("resume", "POST", self.routes.resume, always=True)

    # ---- load ----------------------------------------------------------------------------------
    def queue_length(self, metrics_text: str) -> float | None:
        return first_gauge(self.metrics.queue, metrics_text)

    def busy_seconds(self, server_info: dict) -> float | None:
        return None  # vLLM reports no time spent inside batches

    # ---- settings ------------------------------------------------------------------------------
    server_info_query = {"config_format": "json"}  # /server_info's config as JSON, not its repr

    def reported_settings(self, server_info: dict) -> dict[str, object]:
        """vLLM's config sections (`vllm_config` of /server_info?config_format=json) flattened: model,
        parallel, scheduler and cache settings by their own names, a dtype in the config's spelling."""
        config = server_info.get("vllm_config") if isinstance(server_info, dict) else None
        if not isinstance(config, dict):
            return {}
        out: dict[str, object] = {}
        for section in ("model_config", "parallel_config", "scheduler_config", "cache_config"):
            out.update(config.get(section) or {})
        if isinstance(out.get("dtype"), str):
            name = out["dtype"].removeprefix("torch.")
            out["dtype"] = DTYPE_NAMES.get(name, name)
        return out

    # ---- conformance ---------------------------------------------------------------------------
    def wire_calls(self, config) -> list[WireCall]:
        """Every request the clients send a vLLM server, one of each, as they send it."""
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=20, stop=["</s>"],
                                  stop_token_ids=[2], seed=7, ignore_eos=True)
        r = self.routes
        gen = WireCall("generate", "POST", r.generate, self.generate_body([1, 2, 3], sampling, "r1", "policy-lora"),
                       reads=("choices[].token_ids", "choices[].logprobs.content[].logprob", "choices[].finish_reason",
                              "choices[].stop_reason", "choices[].weight_versions", "usage.prompt_tokens", "request_id"))
        return [gen,
                WireCall("health", "GET", r.health), WireCall("models", "GET", "/v1/models"),
                WireCall("metrics", "GET", r.metrics), WireCall("server info", "GET", r.server_info,
                                                                query={"config_format": "json"}, reads=("vllm_config",)),
                WireCall("weight version", "GET", r.weight_version[0], reads=("weight_version",)),
                WireCall("join the weight transfer", "POST", r.init_weights_update_group,
                         self.group_init_body("127.0.0.1", 29500, 1, 2, "", "nccl")),
                *self.distributed_update_calls(["model.embed_tokens.weight"], ["float32"], [[2, 2]], "3", group_name=""),
                WireCall("leave the weight transfer", "POST", r.destroy_weights_update_group),
                *self.disk_update_calls("/ckpt/3", "3"),
                WireCall("load adapter", "POST", r.load_lora_adapter, self.adapter_load_body("policy-lora", "/ckpt/lora")),
                WireCall("unload adapter", "POST", r.unload_lora_adapter, self.adapter_unload_body("policy-lora")),
                self._pause_call("abort"),
                WireCall("abort", "POST", ABORT, self.abort_body(["r1"]))]
