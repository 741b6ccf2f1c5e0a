"""The inference engine seam: everything the rest of the platform needs to know about an engine,
as one Protocol (`InferenceEngine`) and the small records its members return.

An engine is chosen by `inference.engine`: a row of `agentrl_cli/engines/registry.py` (`hf`, the
embedded server; `sglang`) or the `module:Class` path of a class of your own (docs/engines.md).
The launcher, the client, the weight sync, the image lock, the network plan, `agentrl serve
inference` and stages 2 and 4 ask the engine object instead of comparing its name.

Belongs here: the Protocol and its records (routes, metric names, capabilities, a server's launch,
its ports, a setting it must report, the options of a foreground serve). Does not: any engine's
code (one module per engine: `embedded.py`, `sglang.py`), SGLang's wire format shared by both
(`sglang_dialect.py`), starting processes (`inference/launcher.py`), comparing what servers report
(`settings.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

SERVER, ROUTER = "server", "router"


@dataclass(frozen=True)
class Routes:
    """The HTTP paths an engine's servers answer, by what they do."""

    health: str                            # GET: 200 while the server serves (rotation, supervision)
    ready: str                             # GET: 200 once it can generate; polled after every (re)start
    generate: str                          # POST: token ids in, token ids + log-probs out
    update_weights_from_disk: str          # POST: load a model directory (transport `disk`)
    init_weights_update_group: str         # POST: join the trainer's weight-update group (`distributed`)
    update_weights_from_distributed: str   # POST: receive the broadcast tensors (`distributed`)
    destroy_weights_update_group: str      # POST: leave the group
    get_weights_by_name: str               # POST: read a parameter back (sync verification)
    weight_version: tuple[str, ...]        # GET, tried in order: the weight version served
    update_weight_version: str             # POST: relabel the weights, loading nothing
    load_lora_adapter: str                 # POST: load an adapter directory under a name
    unload_lora_adapter: str               # POST: unload it
    pause: str                             # POST: hold generation (`Capabilities.pause_modes`)
    resume: str                            # POST: generate again
    server_info: str                       # GET: settings, version and internal counters
    metrics: str                           # GET: Prometheus text
    openai: tuple[str, ...] = ()           # the OpenAI-compatible routes it serves (/v1/...)


@dataclass(frozen=True)
class MetricNames:
    """What server-load measurement and a router read off a server."""

    queue: str         # Prometheus gauge: requests waiting for a batch
    running: str       # Prometheus gauge: requests being decoded
    busy_seconds: str  # counter in `server_info`'s internal_states[0]: seconds spent inside a batch ("" = none)


@dataclass(frozen=True)
class Capabilities:
    """What an engine honours, as data: a setting it does not honour is refused at start, never ignored."""

    transports: frozenset[str]         # training.weight_sync transports its servers take: "disk", "distributed"
    adapters: bool                     # loads and unloads LoRA adapters at run time (training.lora)
    pause_modes: tuple[str, ...]       # pause modes its pause route takes ("abort", "retract", "in_place")
    constrained_tool_choice: bool      # a named tool_choice constrains the output to a call of that tool
    host_cpu: bool                     # its servers run torch on this host's CPU cores, shared with the trainer
    pipeline_parallel: bool = False    # its servers split the model's layers over inference.pp_size GPUs
    dialects: tuple[str, ...] = ()     # the native protocols its servers speak (inference.dialect; the first is its own)
    generate_stream: bool = False      # its generate route streams tokens as sampled (SGLang's /generate stream: true)


@dataclass
class ServerLaunch:
    """How to start one server (or a router): its command, the environment added to this one, and
    hooks run around each start (a key file written before, removed once it is healthy)."""

    cmd: list[str]
    env: dict[str, str] | None = field(default=None, repr=False)  # may hold a key: never logged
    before_start: Callable[[], None] | None = field(default=None, repr=False)
    after_healthy: Callable[[], None] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class PortUse:
    """Ports a run's servers of this engine listen on, from `inference.port` (host `inference.host`)."""

    first: int
    last: int
    role: str  # SERVER or ROUTER
    what: str  # for the network plan's note
    serves_clients: bool  # clients (the rollout, the gateway) send their requests here


@dataclass(frozen=True)
class WireCall:
    """One request a client of the engine sends, as it sends it: built by the same body methods the
    client uses, so a conformance check (`engines/conformance/`) can hold it against the engine's own
    argument parser, request models and route table. `reads`: the answer's fields the client reads
    (dotted paths; `[]` for "each item of a list")."""

    what: str                                  # for people: "generate", "disk weight update", ...
    method: str                                # "GET" or "POST"
    route: str                                 # the path, without a query string
    body: dict | None = None                   # the JSON body (None: none is sent)
    query: dict | None = None                  # query parameters
    reads: tuple[str, ...] = ()                # fields of the answer the client reads
    always: bool = False                       # in a sequence: sent even when an earlier call failed (a resume)


@dataclass(frozen=True)
class Setting:
    """A setting a server started from the config must report (`expected_settings`): its value and
    the config key it comes from, named when a server reports another value."""

    value: object
    key: str = ""                              # "model.context_length"; "" = not one key of the config


@dataclass(frozen=True)
class ServeOptions:
    """`agentrl serve inference`'s options; 0, -1 or "" mean "from the config"."""

    host: str
    port: int
    batch_window_ms: float = -1.0
    max_batch_size: int = 0
    dtype: str = ""
    context_length: int = 0
    weight_version: str = "default"
    prefix_cache_tokens: int = -1


@runtime_checkable
class InferenceEngine(Protocol):
    """An inference engine. `inference` arguments are the config's `inference` section, `config`
    the whole platform config. Instances are built with no arguments and hold no state."""

    name: str                         # the engine's name in process and log names ("hf", "sglang")
    title: str                        # for people ("SGLang", "the embedded server")
    routes: Routes
    metrics: MetricNames
    capabilities: Capabilities
    lock_packages: tuple[str, ...]    # distributions the image's inference role adds (`agentrl image lock`)
    import_modules: tuple[str, ...]   # modules `inference.python` must import (image verify); () = part of agentrl

    # ---- servers -------------------------------------------------------------------------------
    def check_installed(self, inference) -> str | None:
        """Raise `InferenceUnavailable` (launcher.py) naming what is missing and how to install it;
        return what was found (a version) or None when there is nothing to check."""

    def server_launch(self, config, model_path: str, port: int, *, key_dir, beside_trainer: bool) -> ServerLaunch:
        """One server on `port`: the key (inference.api_key) goes by file or environment, never argv."""

    def ports(self, inference) -> list[PortUse]:
        """The ports the run's own servers take (and a router's, when `needs_router`)."""

    def needs_router(self, replicas: int) -> bool:
        """Whether `replicas` servers get a router in front (clients then send requests there)."""

    def router_launch(self, inference, worker_urls: list[str], port: int) -> ServerLaunch:
        """The router in front of `worker_urls` (only asked when `needs_router`)."""

    def tp_size(self, inference) -> int:
        """Weight-update group ranks each server joins (one per tensor-parallel GPU)."""

    def serve(self, config, model_path: str, options: ServeOptions, say: Callable[[str], None]) -> None:
        """`agentrl serve inference --engine NAME`: serve in the foreground (or exec the engine's server)."""

    # ---- the wire ------------------------------------------------------------------------------
    def generate_body(self, input_ids: list[int], sampling, rid: str | None, adapter: str | None) -> dict:
        """The generate request: token ids, sampling (`SamplingParams`), log-probs asked for."""

    def parse_generation(self, data: dict, latency: float, server: str, retries: int):
        """A generate answer as a `Generation` (token ids, log-probs, finish reason, weight version)."""

    def disk_update_body(self, path: str, version: str, abort_all_requests: bool) -> dict: ...

    def group_init_body(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                        group_name: str, backend: str) -> dict: ...

    def distributed_update_body(self, names, dtypes, shapes, version: str | None, *, group_name: str,
                                load_format: str | None, abort_all_requests: bool, flush_cache: bool) -> dict: ...

    def group_destroy_body(self, group_name: str) -> dict: ...

    def weights_by_name_body(self, name: str, truncate_size: int) -> dict: ...

    def version_update_body(self, version: str, abort_all_requests: bool) -> dict: ...

    def parse_weight_version(self, answer) -> str | None:
        """The version in a `routes.weight_version` answer, None when it holds none."""

    def adapter_load_body(self, name: str, path: str) -> dict: ...

    def adapter_unload_body(self, name: str) -> dict: ...

    def adapter_missing(self, status: int, text: str) -> bool:
        """Whether an answer says the request's adapter is not loaded there (tried on another server)."""

    def pause_body(self, mode: str) -> dict: ...

    def queue_length(self, metrics_text: str) -> float | None:
        """The waiting-queue gauge in a `routes.metrics` answer (its first series), None when absent."""

    def busy_seconds(self, server_info: dict) -> float | None:
        """Seconds spent inside a batch, from a `routes.server_info` answer."""

    # ---- settings (optional: without them stage 4 skips its settings check, saying why) ----------
    def expected_settings(self, config) -> dict[str, Setting]:
        """What a server started from `config` must report, keyed by the names `reported_settings`
        gives them: each setting of the config the engine's launch carries (a plain value stands for
        a `Setting` without a key)."""

    def reported_settings(self, server_info: dict) -> dict[str, object]:
        """The settings a `routes.server_info` answer reports, by name, in the config's spelling
        (a dtype as "bfloat16", not "torch.bfloat16")."""

    # ---- conformance ---------------------------------------------------------------------------
    def wire_calls(self, config) -> list[WireCall]:
        """Every request its clients send (one of each, with a representative body from the body
        methods above) and the answer fields they read: what `agentrl engine verify` checks against
        the engine's own code. An engine without it is reported as not checkable, never as passing."""


# ---- sequences of calls, with defaults for engines written before them ------------------------------
# An engine may need several requests where SGLang needs one (vLLM: pause, reload, relabel, resume).
# These ask the engine for its sequence and fall back to SGLang's single request, so an engine class
# written against the first version of this protocol keeps working.

def disk_update_calls(engine, path: str, version: str, abort_all_requests: bool = False) -> list[WireCall]:
    """The requests that load the model directory `path` as `version` on one server, in order."""
    own = getattr(engine, "disk_update_calls", None)
    if own is not None:
        return own(path, version, abort_all_requests)
    return [WireCall("disk weight update", "POST", engine.routes.update_weights_from_disk,
                     engine.disk_update_body(path, version, abort_all_requests))]


def distributed_update_calls(engine, names, dtypes, shapes, version: str | None, **kw) -> list[WireCall]:
    """The requests that receive one broadcast of the trainer's tensors, in order (one of them answers
    only once the broadcast has arrived)."""
    own = getattr(engine, "distributed_update_calls", None)
    if own is not None:
        return own(names, dtypes, shapes, version, **kw)
    return [WireCall("distributed weight update", "POST", engine.routes.update_weights_from_distributed,
                     engine.distributed_update_body(names, dtypes, shapes, version, **kw))]


def pause_call(engine, mode: str) -> WireCall:
    """The pause request for `mode` (a query parameter on some engines, the body on SGLang's)."""
    query = getattr(engine, "pause_query", None)
    return WireCall("pause", "POST", engine.routes.pause, engine.pause_body(mode),
                    query=query(mode) if query is not None else None)


def answer_ok(engine, status: int, answer) -> bool:
    """Whether a weight or version update's answer says it succeeded (SGLang's: 200 and success true)."""
    own = getattr(engine, "answer_ok", None)
    if own is not None:
        return own(status, answer)
    return status == 200 and isinstance(answer, dict) and bool(answer.get("success", False))
