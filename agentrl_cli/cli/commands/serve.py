"""`agentrl serve sandbox|inference|reward|env|gateway`: run a platform service in the foreground.

Each service takes its bearer keys from its config section's `api_key` (from the environment:
AGENTRL_<SECTION>__API_KEY_FILE or AGENTRL_<SECTION>__API_KEY; never a command-line option, which
every user of the host can read in `ps`), redacts secrets from everything it logs or prints, and
writes audit lines (`observe.audit_log`).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated, Optional

import typer
from rich.markup import escape

from agentrl_cli.cli.commands.common import ConfigOpt, SetOpt, err, load

app = typer.Typer(help="Run platform services: the sandbox pool, inference servers, the reward service, a harness as an OpenEnv environment, the recording gateway for OpenAI agents.",
                  no_args_is_help=True)


def _warn_if_exposed(host: str, what: str, clients: str, key_hint: str = "") -> None:
    try:
        exposed = not ipaddress.ip_address(host).is_loopback
    except ValueError:
        exposed = True
    if exposed:
        err().print(f"[yellow]warning: binding {host}: {what} has no authentication; "
                    f"keep it on a private network reachable only by {clients}{key_hint}[/]")


def _no_key_hint(section: str) -> str:
    return f", or give it a key (AGENTRL_{section.upper()}__API_KEY_FILE, written by `agentrl secrets rotate FILE`)"


def _protected(loaded):
    """Redaction on from here on (logs, prints, warnings), with the config's secrets known; the config."""
    from agentrl_cli.core.redaction import protect_process

    protect_process(loaded.config)
    return loaded.config


@app.command("sandbox")
def sandbox(
    host: Annotated[str, typer.Option("--host", help="Address to bind (default sandbox.host, loopback).", show_default=False)] = "",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8700,
    insecure_loopback: Annotated[bool, typer.Option("--insecure-loopback", help="Serve without a key (sandbox.api_key), which only a loopback --host allows: any process of this host may then run commands.")] = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the sandbox pool over HTTP (create, exec, files, reset, close, health, metrics) for
    harnesses on other machines; point them at it with sandbox.service_url. Callers need its key
    (sandbox.api_key, given by AGENTRL_SANDBOX__API_KEY_FILE); without one it refuses to start
    unless bound to loopback with --insecure-loopback. Executions are audit lines (observe.audit_log).
    A client whose harness has an image asks for its digest: served from sandbox.image_cache_dir
    (filled by `agentrl image unpack`) or the images this config's harnesses name, else refused.

    Examples:

    * `agentrl secrets rotate /etc/agentrl/sandbox.key && AGENTRL_SANDBOX__API_KEY_FILE=/etc/agentrl/sandbox.key agentrl serve sandbox --host 0.0.0.0`

    * `agentrl serve sandbox --insecure-loopback --set sandbox.pool_size=32`

    * `agentrl serve sandbox --insecure-loopback --host 127.0.0.2 --set sandbox.replica=127.0.0.2` (one of
      several replicas behind a load balancer; its clients set sandbox.replica_url to http://{replica}:8700)
    """
    import uvicorn

    from agentrl_cli.envs.sandbox import SandboxPool, SandboxSettings
    from agentrl_cli.envs.sandbox.bwrap import check_bwrap
    from agentrl_cli.envs.images import ImageError
    from agentrl_cli.envs.sandbox.service import check_exposure, create_app
    from agentrl_cli.envs.sandbox.service_images import ServiceImages
    from agentrl_cli.core.security import AuditLog, service_keys

    loaded = load(config, sets)
    c = loaded.config.sandbox
    host = host or c.host
    keys = service_keys(loaded.config, "sandbox")
    check_exposure(host, keys, insecure_loopback)
    cfg = _protected(loaded)
    if c.backend == "bwrap":
        check_bwrap(c.bwrap)  # fail closed before binding
    def make_pool(settings: SandboxSettings) -> SandboxPool:
        return SandboxPool(settings, size=c.pool_size, max_concurrency=c.max_concurrency, lease_timeout_s=c.lease_timeout_s)

    pool = make_pool(SandboxSettings.from_config(c))
    images = ServiceImages(SandboxSettings.from_config(c), make_pool, tuple(h.image for h in loaded.config.harnesses))
    for h in loaded.config.harnesses:  # warm the pools of the images the config pins; the others on first request
        if h.image and h.image_digest:
            try:
                images.pool(h.image, h.image_digest)
            except ImageError as exc:
                err().print(f"harness {h.name}: {exc.message} (its sandboxes will be refused)", markup=False)
    err().print(f"sandbox service on http://{host}:{port} (backend {c.backend}, pool {c.pool_size}, max {c.max_concurrency}, "
                f"{'replica ' + c.replica + ', ' if c.replica else ''}"
                f"images {', '.join(images.digests()) or 'none'} in {c.image_cache_dir}, "
                f"{'keys ' + ', '.join(keys.ids()) if keys else 'no key: loopback only'})", markup=False)
    try:
        uvicorn.run(create_app(pool, keys=keys, audit=AuditLog.from_config(cfg, "sandbox"), replica=c.replica, images=images),
                    host=host, port=port, log_level=cfg.observe.log_level)
    finally:
        images.close()
        pool.close()


@app.command("inference")
def inference(
    engine: Annotated[str, typer.Option("--engine", help="hf (embedded server), sglang or vllm (execs the engine's server) or the module:Class path of an engine (docs/engines.md).")] = "hf",
    model: Annotated[str, typer.Option("--model", help="Model directory or builtin:tiny-agent (default model.path).")] = "",
    host: Annotated[str, typer.Option("--host", help="Address to bind (default inference.host, loopback).", show_default=False)] = "",
    port: Annotated[int, typer.Option("--port", help="Port to bind (default inference.port).")] = 0,
    batch_window_ms: Annotated[float, typer.Option("--batch-window-ms", help="Batching window (default rollout.batch_window_ms).")] = -1.0,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", help="Most requests per forward pass (default inference.max_batch_size).")] = 0,
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16 (default model.dtype).")] = "",
    context_length: Annotated[int, typer.Option("--context-length", help="Context length (default model.context_length).")] = 0,
    weight_version: Annotated[str, typer.Option("--weight-version", help="Initial weight_version reported.")] = "default",
    prefix_cache_tokens: Annotated[int, typer.Option("--prefix-cache-tokens", help="Tokens of KV kept for requests that extend an earlier one (default inference.prefix_cache_tokens; 0 disables).")] = -1,
    dialect: Annotated[str, typer.Option("--dialect", help="The embedded server's protocol: sglang or vllm (default inference.dialect; sglang).")] = "",
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve a model: the embedded Hugging Face server on CPU (engine hf) in SGLang's or vLLM's
    protocol (--dialect), or SGLang or vLLM itself (engine sglang, vllm: execs its server with the
    config's settings), or an engine of your own (its module:Class path). With inference.api_key (given by
    AGENTRL_INFERENCE__API_KEY_FILE) the embedded server requires one of its keys on everything but
    /health* and /metrics, and audits weight updates (observe.audit_log). On SIGTERM the embedded
    server drains: it refuses new generations (503) and hands back those in flight with their
    partial tokens, so a run continues them on its other servers.

    Examples:

    * `agentrl serve inference --engine hf --model builtin:tiny-agent --port 30000`

    * `agentrl serve inference --engine hf --dialect vllm --model builtin:tiny-agent --port 30000`

    * `agentrl serve inference --engine sglang --model /models/Qwen2.5-0.5B-Instruct`

    * `agentrl serve inference --engine vllm --model /models/Qwen2.5-0.5B-Instruct`
    """
    from agentrl_cli.core.errors import NotFoundError, UsageError
    from agentrl_cli.core.parts import DIALECTS
    from agentrl_cli.engines.engine import ServeOptions
    from agentrl_cli.engines.registry import ENGINES, engine_named
    from agentrl_cli.model.resolve import resolve_model_path

    if dialect and dialect not in DIALECTS:
        raise UsageError(f"bad --dialect {dialect!r}", f"use {' or '.join(DIALECTS)} (the embedded server speaks either)")
    try:
        engine_named(engine)
    except NotFoundError as exc:
        raise UsageError(f"bad --engine {engine!r} ({exc.message})",
                         f"use {' or '.join(ENGINES)}, or the module:Class path of an engine") from None
    # the engine served is the config's: a key it does not honour (inference.pp_size...) or a dialect it
    # does not speak is refused
    chosen = [f"inference.engine={engine}", *([f"inference.dialect={dialect}"] if dialect else [])]
    cfg = _protected(load(config, [*(sets or []), *chosen]))
    served = engine_named(engine, cfg.inference.dialect)
    path = resolve_model_path(model or cfg.model.path, cfg.model.cache_dir)
    options = ServeOptions(host=host or cfg.inference.host, port=port or cfg.inference.port, batch_window_ms=batch_window_ms,
                           max_batch_size=max_batch_size, dtype=dtype, context_length=context_length,
                           weight_version=weight_version, prefix_cache_tokens=prefix_cache_tokens)
    served.serve(cfg, path, options, _say)


def _say(line: str) -> None:
    """An engine's line for the person at the terminal (stderr; a warning in yellow)."""
    if line.startswith("warning:"):
        err().print(f"[yellow]{escape(line)}[/]")
    else:
        err().print(line, markup=False)


@app.command("reward")
def reward(
    host: Annotated[str, typer.Option("--host", help="Address to bind (default reward.host, loopback).", show_default=False)] = "",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8710,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the reward scorer over HTTP (POST /score, POST /score_batch, /health, /info, /metrics);
    point the rollout at it with reward.service_url. Hidden-test verifiers run in this host's
    sandboxes (or sandbox.service_url). With reward.api_key (given by AGENTRL_REWARD__API_KEY_FILE)
    callers need one of its keys.

    Examples:

    * `agentrl serve reward --port 8710`

    * `agentrl serve reward --set reward.timeout_s=60 --set reward.max_retries=3`
    """
    import uvicorn

    from agentrl_cli.runtime.reward.scorer import Scorer
    from agentrl_cli.runtime.reward.service import create_app
    from agentrl_cli.core.security import AuditLog, service_keys

    cfg = _protected(load(config, sets))
    host = host or cfg.reward.host
    keys = service_keys(cfg, "reward")
    if keys is None:
        _warn_if_exposed(host, "the reward service", "the training run", _no_key_hint("reward"))
    scorer = Scorer.from_config(cfg)
    err().print(f"reward service on http://{host}:{port} (verifiers {scorer.versions()})", markup=False)
    try:
        uvicorn.run(create_app(scorer, keys=keys, audit=AuditLog.from_config(cfg, "reward")), host=host, port=port,
                    log_level=cfg.observe.log_level)
    finally:
        scorer.close()


@app.command("env")
def env(
    name: Annotated[str, typer.Argument(help="Harness to serve: a registered name or a module:Class path.")],
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default; the API has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8720,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Most WebSocket sessions (harness instances) at once.")] = 8,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve a harness as an OpenEnv environment (the openenv package's server: reset/step/state over
    WebSocket /ws, /schema, /health, task routes), so OpenEnv clients (TRL, SkyRL, the package's
    EnvClient) can use it. reset picks a task by task_id, index or seed; step takes
    {"text": ..., "tool_calls": [...]}; the final step's reward is the one training gives the episode
    (agentrl's reward scorer). The harness's options come from its harnesses[] entry.

    Examples:

    * `agentrl serve env terminal_like --port 8720`

    * `agentrl serve env my_pkg.envs:MyHarness --set rollout.max_steps_per_trajectory=8`
    """
    import uvicorn

    from harnesses.adapters.openenv_server import create_env_app, served_harness

    loaded = load(config, sets)
    _protected(loaded)
    served = served_harness(name, loaded.config)
    _warn_if_exposed(host, "the environment API", "your trainer")
    err().print(f"OpenEnv environment {name} on http://{host}:{port} (tasks {served.tasks.version}, reward "
                f"{served.reward_source}, max {max_sessions} sessions, {served.max_steps} steps)", markup=False)
    try:
        uvicorn.run(create_env_app(served, max_sessions=max_sessions), host=host, port=port,
                    log_level=loaded.config.observe.log_level)
    finally:
        served.close()


@app.command("gateway")
def gateway(
    inference_url: Annotated[Optional[list[str]], typer.Option("--inference-url", metavar="URL", help="An inference server or router (repeatable; default: the config's inference servers).", show_default=False)] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (default gateway.host, loopback).", show_default=False)] = "",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8730,
    session_ttl_s: Annotated[float, typer.Option("--session-ttl-s", min=1, help="Seconds an idle session lives.")] = 600.0,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=0, help="Sessions (and calls) in flight before new ones get 429 with Retry-After; 0 = no limit.")] = 0,
    public_url: Annotated[str, typer.Option("--public-url", help="The address agents reach the gateway at, for the base_url of new sessions (default: the address a request came in on).")] = "",
    model: Annotated[str, typer.Option("--model", help="Model whose tokenizer and chat template the servers serve (default model.path).")] = "",
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the recording gateway: agents written with the openai SDK point base_url and api_key at a
    session (POST /sessions), their chat calls go to the inference servers through the run's client,
    and every call is recorded token-exact (GET /sessions/ID; rewards: POST /sessions/ID/reward).
    Session management needs the admin key (gateway.api_key, given by AGENTRL_GATEWAY__API_KEY_FILE;
    AGENTRL_GATEWAY_ADMIN_KEY is read too); its writes are audit lines (observe.audit_log).

    Examples:

    * `agentrl serve gateway --inference-url http://127.0.0.1:30000 --port 8730`

    * `agentrl secrets rotate gateway.key && AGENTRL_GATEWAY__API_KEY_FILE=gateway.key agentrl serve gateway --max-sessions 64`
    """
    import uvicorn

    from agentrl_cli.engines.gateway.app import create_app
    from agentrl_cli.engines.gateway.backend import backend_from_config, config_urls
    from agentrl_cli.engines.gateway.service import Gateway
    from agentrl_cli.core.security import AuditLog, KeyRing, service_keys

    cfg = _protected(load(config, sets))
    host = host or cfg.gateway.host
    urls = [u.rstrip("/") for u in inference_url or []] or config_urls(cfg)
    keys = service_keys(cfg, "gateway") or KeyRing.from_secret(os.environ.get("AGENTRL_GATEWAY_ADMIN_KEY"))
    if keys is None:
        _warn_if_exposed(host, "session management (creating sessions, posting rewards)", "the training run",
                         _no_key_hint("gateway"))
    backend = backend_from_config(cfg, urls, model)
    gw = Gateway(backend, limit=(lambda: max_sessions) if max_sessions else None, ttl_s=session_ttl_s)
    err().print(f"gateway on http://{host}:{port} -> {', '.join(urls)} (model {backend.model_name()}, sessions idle "
                f"{session_ttl_s:g} s expire, limit {max_sessions or 'none'})", markup=False)
    uvicorn.run(create_app(gw, admin_key=keys, public_url=public_url or None, audit=AuditLog.from_config(cfg, "gateway")),
                host=host, port=port, log_level=cfg.observe.log_level)
