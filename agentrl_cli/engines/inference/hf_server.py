"""The embedded inference server: a FastAPI app that speaks SGLang's native HTTP protocol
(`/generate`, health, info, weight updates, LoRA adapters, abort, metrics) and its OpenAI-compatible API
(`agentrl_cli.engines.openai_api`, mounted here over the same engine, and Anthropic's Messages API
translated onto it, `agentrl_cli.engines.messages_api`) over an `HFEngine`, so clients
cannot tell it from an SGLang server for the endpoints it supports. Validation and response shapes live in `protocol.py`, batching and weight
updates in `engine.py`, the weight-update process group in `weight_group.py`; this module only
routes, awaits the engine (and blocking collectives) off the event loop, and maps errors to status
codes. Serve it with `agentrl_cli.core.serving.ServerThread` or uvicorn.

`/generate` with `stream: true` (one prompt, n = 1) answers server-sent events as the engine samples
the tokens, in SGLang's `--incremental-streaming-output` shape (each chunk the new ids, text and
log-probs; `completion_tokens` cumulative; `finish_reason` on the last), then `data: [DONE]`. A
client that goes away mid-stream aborts its request, as `/abort_request` would.

Draining (`app.state.drain()`, and `DrainingServer` on every shutdown, SIGTERM included): new
generation requests (/generate, /v1/...) get 503 naming the reason, /health answers 503, and the
requests in flight are aborted as /abort_request aborts them: each answers at once with finish
reason "abort" and the tokens and log-probs generated so far, which the client continues on
another server (`engines/resume.py`). So a preemptible server hands back its work instead of
holding it until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from agentrl_cli import __version__
from agentrl_cli.engines.inference.awaiting import await_results, stream_request
from agentrl_cli.engines.inference.detokenize import Detokenizer
from agentrl_cli.engines.inference.metrics import engine_registry
from agentrl_cli.engines.inference.stats import PHASE_COUNTERS
from agentrl_cli.engines.inference.vllm_server import add_vllm_routes, vllm_registry
from agentrl_cli.engines.inference.protocol import (LOAD_FORMATS, UNSUPPORTED_SUFFIX, AbortIn, LoadLoRAAdapterIn, PauseIn,
                                            ProtocolError, UnloadLoRAAdapterIn, UpdateWeightsFromDiskIn,
                                            UpdateWeightVersionIn, build_output, dumps, error_body, output_text,
                                            parse_generate, parse_model, stream_chunk)
from agentrl_cli.engines.messages_api import ApiKeyHeader, add_messages_routes
from agentrl_cli.engines.openai_api import EngineBackend, add_openai_routes
from agentrl_cli.engines.openai_api.routes import LiveStreamingResponse
from agentrl_cli.core.security import WEIGHT_UPDATE_PATHS, AuditLog, BearerAuth, KeyRing
from agentrl_cli.core.security.http import paths
from agentrl_cli.engines.weight_group import (BUCKET, DEFAULT_GROUP, DEFAULT_TIMEOUT_S, WeightGroups, backend_problem,
                                                parse_dtype)

HEALTH_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
              "requests, the operation will not be performed.)\n")
GPU_ONLY_UPDATES = ("update_weights_from_tensor",)  # CUDA-IPC handles a CPU process cannot open
DRAINING = "the server is draining (shutting down); send the request to another server"
GENERATION_PATHS = ("/generate", "/v1/", "/inference/v1/")
log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains the app (`app.state.drain`) before it shuts down, so the answers
    of the aborted requests go out on their connections before uvicorn waits for them to close."""

    def __init__(self, config: uvicorn.Config, drain) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets=None) -> None:
        try:
            self._drain()
        except Exception:  # noqa: BLE001 - shutting down whatever happens
            log.exception("draining before shutdown failed")
        await super().shutdown(sockets)


class InitWeightsUpdateGroupIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    master_address: StrictStr
    master_port: StrictInt | StrictStr  # AReaL sends it as a string
    rank_offset: StrictInt
    world_size: StrictInt
    group_name: StrictStr = DEFAULT_GROUP
    backend: StrictStr = "nccl"


class UpdateWeightsFromDistributedIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    names: list[StrictStr]
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    group_name: StrictStr = DEFAULT_GROUP
    flush_cache: StrictBool = True  # a weight change always empties the prefix cache
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | StrictInt | None = None
    load_format: StrictStr | None = None


class DestroyWeightsUpdateGroupIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    group_name: StrictStr = DEFAULT_GROUP


class RefuseWhileDraining:
    """ASGI middleware: 503 for generation requests once the app drains (`state.draining`)."""

    def __init__(self, app, state) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] == "http" and self.state.draining and scope["method"] != "GET"
                and scope["path"].startswith(GENERATION_PATHS)):
            await json_response(error_body(DRAINING), 503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _rest(text: Detokenizer, result: dict, item) -> str:
    """The last stream chunk's text: the finished text (a matched stop trimmed) after what was sent."""
    whole = output_text(result["output_ids"], result["finish_reason"], text.tokenizer, skip_special_tokens=text.skip,
                        no_stop_trim=item.sampling.get("no_stop_trim", False))
    return whole[len(text.text):] if whole.startswith(text.text) else ""


def json_response(obj, status_code: int = 200) -> Response:
    return Response(dumps(obj), status_code=status_code, media_type="application/json")


def _constant(make, status_code: int = 200):
    """An endpoint without parameters answering `make()` as JSON."""
    async def endpoint():
        return json_response(make(), status_code)
    return endpoint


async def _body(request: Request):
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"the request body is not valid JSON: {exc}") from None


# the native protocols it speaks: (title, its /metrics, its routes; None = SGLang's, in this module)
DIALECTS = {"sglang": ("SGLang", engine_registry, None), "vllm": ("vLLM", vllm_registry, add_vllm_routes)}


def create_app(engine, *, served_model_name: str | None = None, api_key: KeyRing | str | None = None,
               enable_metrics: bool = True, audit: AuditLog | None = None, dialect: str = "sglang") -> FastAPI:
    """An app serving `engine`; `served_model_name` defaults to the (current) model path, as SGLang's.
    `api_key`: the key(s) required on everything but /health* and /metrics; `audit`: where weight
    updates and refused requests are recorded; `dialect`: the native protocol, "sglang" or "vllm"
    (`vllm_server.py`); the OpenAI-compatible routes are served in both."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}; got {dialect!r}")
    title, metric_names, native_routes = DIALECTS[dialect]
    app = FastAPI(title=f"agentrl embedded inference server ({title} protocol)")
    model_name = lambda: served_model_name or engine.model_path  # noqa: E731
    registry = metric_names(engine, model_name) if enable_metrics else None

    app.add_middleware(BearerAuth, keys=KeyRing.coerce(api_key), service="inference", audit=audit,
                       audited=paths(WEIGHT_UPDATE_PATHS), body={"error": "Unauthorized"})  # SGLang's 401 body
    app.add_middleware(ApiKeyHeader)  # runs before the key check: /v1/messages takes the key as x-api-key too
    app.state.draining = False

    def drain() -> int:
        """Refuse new generation requests and abort those in flight (they answer with their partial
        tokens); returns how many were aborted. Call it on the app's event loop."""
        first = not app.state.draining
        app.state.draining = True
        aborted = engine.abort(abort_all=True)
        if first:
            log.warning("draining: %d request(s) in flight aborted with their partial tokens; new generation "
                        "requests get 503", aborted)
        return aborted
    app.state.drain = drain

    app.add_middleware(RefuseWhileDraining, state=app.state)

    @app.exception_handler(ProtocolError)
    async def bad_request(_request: Request, exc: ProtocolError):
        return json_response(error_body(str(exc)), 400)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.alive and not app.state.draining else 503)

    # /v1/chat/completions, /v1/completions, /v1/models, and Anthropic's /v1/messages translated onto the chat
    # path: the same engine, batches and prefix cache as /generate
    backend = EngineBackend(engine, model_name)
    add_openai_routes(app, backend)
    add_messages_routes(app, backend)

    if registry is not None:
        @app.get("/metrics")
        async def metrics():
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if native_routes is not None:  # another engine's native routes (vLLM's: vllm_server.py)
        app.state.weight_groups = native_routes(app, engine, model_name, json_response, _body)
        return app

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        parsed = parse_generate(await _body(request), engine.tokenizer, engine.vocab_size, engine.context_length)
        if app.state.draining:  # began while the body was read: nothing was queued yet
            return json_response(error_body(DRAINING), 503)
        if parsed.stream:
            return generate_stream(parsed)
        try:
            futures = engine.submit_many([dict(input_ids=i.input_ids, sampling=i.sampling, rid=i.rid,
                                               return_logprob=i.return_logprob, logprob_start_len=i.logprob_start_len,
                                               lora_path=i.lora_path)
                                          for i in parsed.items])
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        except RuntimeError as exc:  # the engine is closed
            return json_response(error_body(str(exc)), 503)
        try:
            results = await await_results(engine, futures, [i.rid for i in parsed.items])
        except Exception as exc:  # noqa: BLE001 - a failed batch: report it, keep serving
            return json_response(error_body(f"generation failed: {type(exc).__name__}: {exc}"), 500)
        outputs = [build_output(item, result, engine.tokenizer, parsed.return_text_in_logprobs)
                   for item, result in zip(parsed.items, results)]
        return json_response(outputs if parsed.as_list else outputs[0])

    def generate_stream(parsed):
        (item,) = parsed.items
        try:
            tokens = stream_request(engine, dict(input_ids=item.input_ids, sampling=item.sampling, rid=item.rid,
                                                 return_logprob=item.return_logprob, lora_path=item.lora_path,
                                                 logprob_start_len=item.logprob_start_len))
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        except RuntimeError as exc:  # the engine is closed
            return json_response(error_body(str(exc)), 503)
        text = Detokenizer(engine.tokenizer, item.sampling.get("skip_special_tokens", True))

        async def events():
            done = 0
            try:
                async for ids, logprobs, version, result in tokens:
                    done += len(ids)
                    new = text.add(ids) if result is None else _rest(text, result, item)
                    chunk = stream_chunk(item, ids, logprobs, new, done, version, result,
                                         parsed.return_text_in_logprobs, engine.tokenizer)
                    yield b"data: " + dumps(chunk) + b"\n\n"
            except Exception as exc:  # noqa: BLE001 - a failed batch: SGLang's mid-stream error event
                yield b"data: " + dumps(error_body(f"generation failed: {type(exc).__name__}: {exc}")) + b"\n\n"
            finally:
                await tokens.aclose()
            yield b"data: [DONE]\n\n"

        return LiveStreamingResponse(events(), media_type="text/event-stream")

    @app.get("/health_generate")
    async def health_generate():
        if app.state.draining:
            return Response(status_code=503)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        try:
            future = engine.submit([0], {"max_new_tokens": 1, "temperature": 0.0}, rid=rid, internal=True)
            await asyncio.wait_for(asyncio.wrap_future(future), HEALTH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure or timeout means unhealthy
            engine.abort(rid)
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info():
        config = engine.model_config
        return {"model_path": engine.model_path, "tokenizer_path": engine.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": engine.weight_version,
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": getattr(config, "model_type", None),
                "architectures": getattr(config, "architectures", None)}

    def server_info():
        snap = engine.snapshot()
        args = {"model_path": engine.model_path, "tokenizer_path": engine.tokenizer_path,
                "served_model_name": model_name(), "tp_size": 1, "dp_size": 1, "pp_size": 1, "dtype": engine.dtype,
                "context_length": engine.context_length, "max_running_requests": engine.max_batch_size,
                "max_batch_size": engine.max_batch_size, "batch_window_ms": engine.batch_window_s * 1000.0,
                "weight_version": engine.weight_version, "enable_metrics": enable_metrics,
                "skip_tokenizer_init": False, "enable_lora": True}
        return {**args, "loaded_lora_adapters": engine.loaded_adapters(), "status": "ready",
                "max_total_num_tokens": engine.context_length * engine.max_batch_size,
                "max_req_input_len": engine.context_length - 1,
                "internal_states": [{**args, "last_gen_throughput": snap["gen_throughput"],
                                     "recent_batch_sizes": snap["recent_batch_sizes"], "recent_joins": snap["recent_joins"],
                                     "busy_seconds_total": snap["busy_seconds_total"],
                                     **{key: snap[key] for key in PHASE_COUNTERS}}],
                "version": f"agentrl-hf-{__version__}"}

    for path, fn in (("/model_info", model_info), ("/get_model_info", model_info),
                     ("/server_info", server_info), ("/get_server_info", server_info)):
        app.add_api_route(path, _constant(fn), methods=["GET"])

    @app.get("/get_weight_version")
    @app.get("/weight_version")
    async def weight_version():
        return json_response({"weight_version": engine.weight_version})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return Response(FLUSH_TEXT, status_code=200 if engine.flush_cache() else 400)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        req = parse_model(UpdateWeightsFromDiskIn, await _body(request))
        if req.load_format not in LOAD_FORMATS:
            return json_response({"success": False, "message": f"load_format {req.load_format!r} {UNSUPPORTED_SUFFIX}",
                                  "num_paused_requests": 0}, 400)
        version = None if req.weight_version is None else str(req.weight_version)
        ok, message = await asyncio.to_thread(engine.update_weights_from_disk, req.model_path,
                                              weight_version=version, abort_all_requests=req.abort_all_requests)
        return json_response({"success": ok, "message": message, "num_paused_requests": 0}, 200 if ok else 400)

    def lora_answer(ok: bool, message: str) -> Response:
        """SGLang's LoRAUpdateOutput: 200 on success, 400 with the reason otherwise."""
        return json_response({"success": ok, "error_message": message, "loaded_adapters": engine.loaded_adapters()},
                             200 if ok else 400)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        req = parse_model(LoadLoRAAdapterIn, await _body(request))
        return lora_answer(*await asyncio.to_thread(engine.load_lora_adapter, req.lora_name, req.lora_path))

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        req = parse_model(UnloadLoRAAdapterIn, await _body(request))
        return lora_answer(*engine.unload_lora_adapter(req.lora_name))

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        req = parse_model(UpdateWeightVersionIn, await _body(request))
        version = str(req.new_version)
        await asyncio.to_thread(engine.set_weight_version, version, req.abort_all_requests)
        return json_response({"success": True, "message": f"Weight version updated to {version}",
                              "new_version": version})

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        req = parse_model(PauseIn, await _body(request))
        await asyncio.to_thread(engine.pause, req.mode)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation():
        engine.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/abort_request")
    async def abort_request(request: Request):
        req = parse_model(AbortIn, await _body(request))
        engine.abort(req.rid, req.abort_all)
        return Response(status_code=200)

    async def get_weights_by_name(request: Request):
        """SGLang's check that a weight sync landed: the first `truncate_size` rows of a parameter."""
        body = dict(request.query_params) if request.method == "GET" else await _body(request)
        name, size = body.get("name"), body.get("truncate_size", 100)
        try:
            size = int(size)
        except (TypeError, ValueError):
            raise ProtocolError(f"truncate_size must be an integer, got {size!r}") from None
        param = dict(engine.named_parameters()).get(name) if isinstance(name, str) else None
        if param is None:
            return json_response({"error": f"no parameter named {name!r}"}, 400)
        return json_response(param.detach()[:size].float().tolist())

    app.add_api_route("/get_weights_by_name", get_weights_by_name, methods=["GET", "POST"])

    app.state.weight_groups = _add_weight_group_routes(app, engine)

    for name in GPU_ONLY_UPDATES:
        refusal = {"success": False, "message": f"{name} {UNSUPPORTED_SUFFIX}; use update_weights_from_disk"}
        app.add_api_route(f"/{name}", _constant(lambda refusal=refusal: refusal, 400), methods=["POST"])

    return app


def _add_weight_group_routes(app: FastAPI, engine) -> WeightGroups:
    """SGLang's distributed weight update: join a group, receive broadcasts, leave it.
    Tensors are received in full before anything is checked, so a refused update never leaves the
    trainer's broadcasts unanswered; they are loaded only when every name and shape fits."""
    groups = WeightGroups()

    def answer(ok: bool, message: str) -> Response:
        return json_response({"success": ok, "message": message}, 200 if ok else 400)

    async def parsed(model, request: Request):
        try:
            return parse_model(model, await _body(request)), None
        except ProtocolError as exc:
            return None, answer(False, str(exc))

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        req, refused = await parsed(InitWeightsUpdateGroupIn, request)
        if refused:
            return refused
        problem = backend_problem(req.backend)
        if problem:
            return answer(False, f"Failed to initialize custom process group: {problem}.")
        try:
            await asyncio.to_thread(groups.open, req.group_name, master_address=req.master_address,
                                    master_port=int(req.master_port), rank=req.rank_offset, world_size=req.world_size,
                                    backend=req.backend, timeout_s=DEFAULT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - bad rank, unreachable master, timeout: all the caller's to fix
            return answer(False, f"Failed to initialize custom process group: {exc}.")
        return answer(True, "Succeeded to initialize custom process group.")

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        req, refused = await parsed(UpdateWeightsFromDistributedIn, request)
        if refused:
            return refused
        try:
            if not len(req.names) == len(req.dtypes) == len(req.shapes):
                raise ValueError(f"names, dtypes and shapes differ in length ({len(req.names)}, {len(req.dtypes)}, "
                                 f"{len(req.shapes)}); give one entry per tensor")
            if req.load_format not in (None, BUCKET):
                raise ValueError(f"load_format {req.load_format!r} {UNSUPPORTED_SUFFIX}; use null or {BUCKET!r}")
            specs = [(n, parse_dtype(d), tuple(s)) for n, d, s in zip(req.names, req.dtypes, req.shapes)]
            group = groups.get(req.group_name)
            tensors = await asyncio.to_thread(group.receive, specs, req.load_format)
        except (ValueError, KeyError) as exc:
            return answer(False, f"Failed to update parameter online: {exc.args[0] if exc.args else exc}")
        except Exception as exc:  # noqa: BLE001 - a broken or timed-out collective
            return answer(False, f"Failed to update parameter online: {type(exc).__name__}: {exc}. "
                                 "The weights were not changed; destroy and re-initialize the group.")
        version = None if req.weight_version is None else str(req.weight_version)
        ok, message = await asyncio.to_thread(engine.update_weights_from_tensors, tensors, weight_version=version,
                                              abort_all_requests=req.abort_all_requests)
        return answer(ok, message)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        req, refused = await parsed(DestroyWeightsUpdateGroupIn, request)
        if refused:
            return refused
        try:
            await asyncio.to_thread(groups.destroy, req.group_name)
        except KeyError:
            return answer(False, "The group to be destroyed does not exist.")
        return answer(True, "Succeeded to destroy custom process group.")

    return groups
