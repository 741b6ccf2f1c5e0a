"""The embedded server in vLLM's dialect (`inference.dialect: vllm`): vLLM's routes over the same
`HFEngine` the SGLang dialect serves, so the whole loop runs on this machine through the client path
a vLLM deployment takes (`engines/vllm_dialect.py`).

Routes, as vLLM 0.33 answers them: `/inference/v1/generate` (token ids in, `tokens` output mode:
token ids, the sampled tokens' log-probs, finish reason, weight-version spans), `/abort_requests`,
`/pause?mode=abort|keep` and `/resume`, `/is_paused`, the weight transfer in four phases
(`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`,
`/shutdown_weight_transfer_engine`; on CPU the group is gloo where vLLM's is NCCL), a load from disk
through `/collective_rpc` `reload_weights`, `/update_weight_version`, `/weight_info`, LoRA adapters
under `/v1/`, `/server_info` and `/metrics` with vLLM's names. What this server cannot do it refuses
naming what it takes instead: pause mode `wait`, streaming, output modes other than `tokens`, any
collective_rpc method but `reload_weights`.

Belongs here: the vLLM routes and the translation of their bodies to the engine's calls. Does not:
the SGLang routes, draining and authentication (`hf_server.py`), the engine (`engine.py`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from agentrl_cli import __version__
from agentrl_cli.engines.inference.awaiting import await_results
from agentrl_cli.engines.inference.protocol import UNSUPPORTED_SUFFIX, ProtocolError, error_body, parse_generate
from agentrl_cli.engines.weight_group import DEFAULT_GROUP, DEFAULT_TIMEOUT_S, WeightGroups, parse_dtype

# what the embedded server takes of vLLM's GenerateRequest and SamplingParams (the rest is refused by name)
REQUEST_KEYS = {"request_id", "token_ids", "sampling_params", "model", "stream", "output_mode", "return_token_ids",
                "priority", "cache_salt"}
SAMPLING_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
                 "logprobs", "skip_special_tokens", "detokenize", "n", "min_tokens"}
PAUSE_MODES = {"abort": "abort", "keep": "in_place"}  # vLLM's mode -> the engine's
GATHER_BACKEND = "gloo"  # the weight transfer's group on this CPU host (vLLM's: NCCL)


def _sampling(sp: Any) -> tuple[dict, bool]:
    """vLLM's sampling_params as the engine's (SGLang-shaped) ones, and whether log-probs are asked for."""
    if not isinstance(sp, dict):
        raise ProtocolError("sampling_params must be a JSON object")
    unknown = sorted(set(sp) - SAMPLING_KEYS)
    if unknown:
        raise ProtocolError(f"sampling_params: {', '.join(unknown)} {UNSUPPORTED_SUFFIX}; "
                            f"it takes {', '.join(sorted(SAMPLING_KEYS))}")
    if sp.get("n", 1) != 1:
        raise ProtocolError(f"sampling_params.n={sp['n']!r} {UNSUPPORTED_SUFFIX}; send one request per sample")
    if sp.get("logprobs") not in (None, 0):
        raise ProtocolError(f"sampling_params.logprobs={sp['logprobs']!r} {UNSUPPORTED_SUFFIX}; use 0 (the sampled token's)")
    top_k = sp.get("top_k", 0)
    out = {"max_new_tokens": sp.get("max_tokens", 16), "temperature": sp.get("temperature", 1.0),
           "top_p": sp.get("top_p", 1.0), "top_k": -1 if top_k in (0, -1) else top_k,
           "skip_special_tokens": sp.get("skip_special_tokens", True), "no_stop_trim": True,
           "ignore_eos": sp.get("ignore_eos", False), "min_new_tokens": sp.get("min_tokens", 0)}
    for ours, theirs in (("stop", "stop"), ("stop_token_ids", "stop_token_ids"), ("sampling_seed", "seed")):
        if sp.get(theirs) is not None:
            out[ours] = sp[theirs]
    return out, sp.get("logprobs") is not None


def _choice(result: dict, return_logprob: bool) -> dict:
    """One `GenerateTokensChoice` of a finished request."""
    ids = [] if result.get("waiting_abort") else list(result["output_ids"])
    reason = result["finish_reason"]
    kind = reason.get("type", "stop") if isinstance(reason, dict) else str(reason)
    choice = {"index": 0, "finish_reason": kind, "stop_reason": reason.get("matched") if isinstance(reason, dict) else None,
              "token_ids": ids,
              "weight_versions": [{"version": str(result["weight_version"]), "start": 0, "end": len(ids)}]}
    if kind == "abort" and isinstance(reason, dict):
        choice["stop_reason"] = reason.get("message")
    if return_logprob:
        lps = [] if result.get("waiting_abort") else result["output_logprobs"]
        choice["logprobs"] = {"content": [{"token_id": t, "logprob": lp} for t, lp in zip(ids, lps)]}
    return choice


def vllm_registry(engine, model_name: Callable[[], str]) -> CollectorRegistry:
    """`/metrics` with vLLM's names (`vllm:num_requests_waiting`, ...), label `model_name`."""
    class Collector:
        def collect(self):
            snap, labels = engine.snapshot(), [model_name()]
            for name, key, doc in (("vllm:num_requests_running", "num_running_reqs", "Number of requests in model execution batches."),
                                   ("vllm:num_requests_waiting", "num_queue_reqs", "Number of requests waiting to be processed.")):
                family = GaugeMetricFamily(name, doc, labels=["model_name"])
                family.add_metric(labels, float(snap[key]))
                yield family
            for name, key, doc in (("vllm:prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed."),
                                   ("vllm:generation_tokens", "generation_tokens_total", "Number of generation tokens processed."),
                                   ("vllm:prefix_cache_hits", "cached_tokens_total", "Prefix cache hits, in terms of number of cached tokens."),
                                   ("vllm:request_success", "num_requests_total", "Count of successfully processed requests.")):
                family = CounterMetricFamily(name, doc, labels=["model_name"])
                family.add_metric(labels, float(snap[key]))
                yield family
            hist = snap["e2e_latency"]
            family = HistogramMetricFamily("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                                           labels=["model_name"])
            family.add_metric(labels, [("+Inf" if b == float("inf") else repr(float(b)), c) for b, c in hist["buckets"]],
                              sum_value=hist["sum"])
            yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return registry


def add_vllm_routes(app: FastAPI, engine, model_name: Callable[[], str], json_response, body_of) -> WeightGroups:
    """vLLM's routes on `app` over `engine`; returns the weight-transfer groups (closed with the app)."""
    groups = WeightGroups()
    staged: dict[str, Any] = {}  # the tensors received since /start_weight_update, loaded at /finish_weight_update

    def refused(message: str, status: int = 400):
        return json_response(error_body(message), status)

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        body = await body_of(request)
        if not isinstance(body, dict):
            raise ProtocolError("the request body must be a JSON object")
        unknown = sorted(set(body) - REQUEST_KEYS)
        if unknown:
            raise ProtocolError(f"{', '.join(unknown)} {UNSUPPORTED_SUFFIX}; a GenerateRequest here takes "
                                f"{', '.join(sorted(REQUEST_KEYS))}")
        if body.get("stream"):
            raise ProtocolError(f"stream=true {UNSUPPORTED_SUFFIX}; send stream=false")
        if body.get("output_mode", "tokens") != "tokens":
            raise ProtocolError(f"output_mode={body['output_mode']!r} {UNSUPPORTED_SUFFIX}; use 'tokens'")
        sampling, want_logprobs = _sampling(body.get("sampling_params", {}))
        model = body.get("model")
        adapter = None
        if model not in (None, "", model_name()):
            if model not in engine.loaded_adapters():
                return json_response({"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError",
                                                "param": "model", "code": 404}}, 404)
            adapter = model
        rid = str(body.get("request_id") or uuid.uuid4().hex)
        sglang_body = {"input_ids": body.get("token_ids"), "sampling_params": sampling, "return_logprob": want_logprobs,
                       "rid": rid, "lora_path": adapter}
        parsed = parse_generate(sglang_body, engine.tokenizer, engine.vocab_size, engine.context_length)
        if app.state.draining:
            return refused("the server is draining (shutting down); send the request to another server", 503)
        item = parsed.items[0]
        try:
            futures = engine.submit_many([dict(input_ids=item.input_ids, sampling=item.sampling, rid=item.rid,
                                               return_logprob=item.return_logprob, logprob_start_len=-1,
                                               lora_path=item.lora_path)])
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        except RuntimeError as exc:
            return refused(str(exc), 503)
        try:
            (result,) = await await_results(engine, futures, [rid])
        except Exception as exc:  # noqa: BLE001 - a failed batch: report it, keep serving
            return refused(f"generation failed: {type(exc).__name__}: {exc}", 500)
        prompt = len(item.input_ids)
        done = 0 if result.get("waiting_abort") else int(result.get("completion_tokens", len(result["output_ids"])))
        answer = {"request_id": rid, "model": model or model_name(), "created": int(time.time()),
                  "output_mode": "tokens", "choices": [_choice(result, want_logprobs)],
                  "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}}
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = list(item.input_ids)
        return json_response(answer)

    @app.post("/abort_requests")
    async def abort_requests(request: Request):
        body = await body_of(request)
        ids = body.get("request_ids") if isinstance(body, dict) else None
        aborted = sum(engine.abort(rid) for rid in ids) if ids else engine.abort(abort_all=True)
        return json_response({"status": "aborted", "aborted": aborted})

    @app.post("/pause")
    async def pause(mode: str = "abort", clear_cache: bool = True):
        if mode not in PAUSE_MODES:
            return refused(f"pause mode {mode!r} {UNSUPPORTED_SUFFIX}; use {' or '.join(PAUSE_MODES)}")
        await asyncio.to_thread(engine.pause, PAUSE_MODES[mode])
        return json_response({"status": "paused"})

    @app.post("/resume")
    async def resume():
        engine.resume()
        return json_response({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused():
        return json_response({"is_paused": engine.paused is not None})

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request):
        body = await body_of(request)
        info = body.get("init_info") if isinstance(body, dict) else None
        if not isinstance(info, dict) or not {"master_address", "master_port", "rank_offset", "world_size"} <= set(info):
            return refused("init_info must hold master_address, master_port, rank_offset and world_size")
        try:
            await asyncio.to_thread(groups.open, DEFAULT_GROUP, master_address=str(info["master_address"]),
                                    master_port=int(info["master_port"]), rank=int(info["rank_offset"]),
                                    world_size=int(info["world_size"]), backend=GATHER_BACKEND, timeout_s=DEFAULT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - bad rank, unreachable master, timeout: the caller's to fix
            return refused(f"Failed to initialize the weight transfer: {exc}")
        return json_response({"message": "Weight transfer initialized"})

    @app.post("/shutdown_weight_transfer_engine")
    async def shutdown_weight_transfer_engine():
        try:
            await asyncio.to_thread(groups.destroy, DEFAULT_GROUP)
        except KeyError:
            pass  # vLLM's shutdown of an engine never initialised answers the same
        staged.clear()
        return json_response({"message": "Weight transfer shut down"})

    @app.post("/start_weight_update")
    async def start_weight_update():
        staged.clear()
        return json_response({"message": "Weight update started"})

    @app.post("/update_weights")
    async def update_weights(request: Request):
        body = await body_of(request)
        info = body.get("update_info") if isinstance(body, dict) else None
        if not isinstance(info, dict):
            return refused("update_info must be a JSON object with names, dtype_names and shapes")
        names, dtypes, shapes = info.get("names", []), info.get("dtype_names", []), info.get("shapes", [])
        try:
            if not len(names) == len(dtypes) == len(shapes):
                raise ValueError(f"names, dtype_names and shapes differ in length ({len(names)}, {len(dtypes)}, "
                                 f"{len(shapes)}); give one entry per tensor")
            specs = [(n, parse_dtype(d), tuple(s)) for n, d, s in zip(names, dtypes, shapes)]
            tensors = await asyncio.to_thread(groups.get(DEFAULT_GROUP).receive, specs, None)
        except (ValueError, KeyError) as exc:
            return refused(f"Failed to update weights: {exc.args[0] if exc.args else exc}")
        except Exception as exc:  # noqa: BLE001 - a broken or timed-out collective
            return refused(f"Failed to update weights: {type(exc).__name__}: {exc}; the weights were not changed, "
                           "shut the weight transfer down and initialise it again", 500)
        staged.update(tensors)
        return json_response({"message": "Weights updated"})

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request):
        body = await body_of(request)
        version = body.get("weight_version") if isinstance(body, dict) else None
        tensors = dict(staged)
        staged.clear()
        if tensors:
            ok, message = await asyncio.to_thread(engine.update_weights_from_tensors, tensors,
                                                  weight_version=None if version is None else str(version),
                                                  abort_all_requests=False)
            if not ok:
                return refused(message)
        elif version is not None:
            await asyncio.to_thread(engine.set_weight_version, str(version), False)
        return json_response({"message": "Weight update finished"})

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        body = await body_of(request)
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            return refused(f"collective_rpc method {method!r} {UNSUPPORTED_SUFFIX}; it runs reload_weights only")
        path = (body.get("kwargs") or {}).get("weights_path")
        if not path:
            return refused("reload_weights needs kwargs.weights_path, the model directory to load")
        ok, message = await asyncio.to_thread(engine.update_weights_from_disk, str(path), weight_version=None,
                                              abort_all_requests=False)
        return json_response({"results": [None]}) if ok else refused(message)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await body_of(request)
        version = body.get("new_version") if isinstance(body, dict) else None
        if version is None:
            return refused("new_version is required")
        await asyncio.to_thread(engine.set_weight_version, str(version), False)
        return json_response({"success": True, "new_version": str(version)})

    @app.get("/weight_info")
    async def weight_info():
        return json_response({"weight_version": engine.weight_version})

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await body_of(request)
        name, path = (body.get("lora_name"), body.get("lora_path")) if isinstance(body, dict) else (None, None)
        if not name or not path:
            return refused("lora_name and lora_path are required")
        ok, message = await asyncio.to_thread(engine.load_lora_adapter, name, path)
        return json_response(f"Success: LoRA adapter '{name}' added successfully.") if ok else refused(message)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await body_of(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        ok, message = engine.unload_lora_adapter(name) if name else (False, "lora_name is required")
        return json_response(f"Success: LoRA adapter '{name}' removed successfully.") if ok else refused(message, 404)

    @app.get("/server_info")
    async def server_info(config_format: str = "text"):
        """vLLM's config as it reports it (the parts a run compares with its config)."""
        config = {"model_config": {"model": engine.model_path, "served_model_name": model_name(), "dtype": engine.dtype,
                                   "max_model_len": engine.context_length},
                  "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1},
                  "scheduler_config": {"max_num_seqs": engine.max_batch_size},
                  "cache_config": {"enable_prefix_caching": bool(getattr(engine, "prefix_cache_tokens", 0))}}
        return json_response({"vllm_config": config if config_format == "json" else str(config),
                              "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"},
                              "system_env": {"agentrl": f"agentrl-hf-{__version__}"}})

    return groups
