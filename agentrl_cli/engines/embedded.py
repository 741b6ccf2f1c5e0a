"""The embedded engine (`inference.engine: hf`): agentrl's own Hugging Face server on this host
(`agentrl serve inference --engine hf`, `inference/hf_server.py` over `inference/engine.py`), which
speaks SGLang's protocol (`sglang_dialect.py`). Belongs here: its command line, the environment that
hands it its key, threads and log level, its foreground serve, and what it honours. Does not: the
server itself (`inference/`), starting processes (`inference/launcher.py`)."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from typing import Callable

from agentrl_cli.core.logstreams import level_env
from agentrl_cli.engines.engine import SERVER, Capabilities, PortUse, ServeOptions, ServerLaunch, Setting
from agentrl_cli.engines.inference.launcher import cpu_thread_split, thread_env
from agentrl_cli.engines.registry import engine_ref
from agentrl_cli.engines.sglang_dialect import SGLangDialect


def hf_command(cfg, model_path: str, port: int, batch_window_ms: float, dtype: str, context_length: int,
               engine: str = "hf", dialect: str = "sglang") -> list[str]:
    """`agentrl serve inference` for one embedded server; `engine` is what `--engine` names (a subclass
    of the embedded engine serves through its own class), `dialect` the protocol it speaks."""
    cmd = [sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", engine, "--dialect", dialect,
           "--model", str(model_path),
           "--host", cfg.host, "--port", str(port), "--batch-window-ms", str(batch_window_ms),
           "--max-batch-size", str(cfg.max_batch_size), "--dtype", dtype, "--context-length", str(context_length),
           "--weight-version", "0", "--prefix-cache-tokens", str(cfg.prefix_cache_tokens),
           "--set", f"inference.enable_metrics={str(cfg.enable_metrics).lower()}"]
    return cmd  # no key: argv is readable by every user of the host; `key_env` hands it over


def key_env(cfg) -> dict[str, str]:
    """The environment that gives an embedded server its key (inference.api_key): none when the key
    comes from AGENTRL_INFERENCE__API_KEY_FILE, which the child inherits and follows through rotations."""
    if cfg.api_key is None or os.environ.get("AGENTRL_INFERENCE__API_KEY_FILE"):
        return {}
    return {"AGENTRL_INFERENCE__API_KEY": json.dumps(cfg.api_key.get_secret_value())}  # a YAML string, as the loader parses it


def _exposed(host: str) -> bool:
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


class EmbeddedEngine(SGLangDialect):
    """`inference.engine: hf`."""

    name = "hf"
    title = "the embedded server"
    dialect = "sglang"  # the native protocol its servers speak (`inference.dialect`; `embedded_vllm.py` speaks vLLM's)
    capabilities = Capabilities(transports=frozenset({"disk", "distributed"}), adapters=True,
                                pause_modes=("abort", "retract", "in_place"), constrained_tool_choice=False, host_cpu=True,
                                dialects=("sglang", "vllm"), generate_stream=True)
    lock_packages: tuple[str, ...] = ()
    import_modules: tuple[str, ...] = ()

    def check_installed(self, inference) -> str | None:
        return None  # part of agentrl

    def server_launch(self, config, model_path: str, port: int, *, key_dir=None, beside_trainer: bool = False) -> ServerLaunch:
        inf = config.inference
        cmd = hf_command(inf, model_path, port, config.rollout.batch_window_ms, config.model.dtype,
                         config.model.context_length, engine_ref(self), self.dialect)
        # the run's log level: the child's config loader reads it
        env = {**thread_env(cpu_thread_split(config, beside_trainer)[1]), **key_env(inf), **level_env(config.observe.log_level)}
        return ServerLaunch(cmd, env)

    def needs_router(self, replicas: int) -> bool:
        return False  # clients spread requests over the servers themselves

    def ports(self, inference) -> list[PortUse]:
        return [PortUse(inference.port, inference.port + inference.replicas - 1, SERVER,
                        f"{inference.replicas} embedded server(s)", True)]

    def router_launch(self, inference, worker_urls: list[str], port: int) -> ServerLaunch:
        raise NotImplementedError("the embedded engine has no router")

    def tp_size(self, inference) -> int:
        return 1  # one process, one rank, whatever inference.tp_size says

    def expected_settings(self, config) -> dict[str, Setting]:
        """What `server_launch` hands an embedded server and it reports (one process: no tp, dp or pp)."""
        m, inf = config.model, config.inference
        return {"dtype": Setting(m.dtype, "model.dtype"), "context_length": Setting(m.context_length, "model.context_length"),
                "max_batch_size": Setting(inf.max_batch_size, "inference.max_batch_size"),
                "batch_window_ms": Setting(config.rollout.batch_window_ms, "rollout.batch_window_ms"),
                "pp_size": Setting(inf.pp_size, "inference.pp_size"),
                "enable_metrics": Setting(inf.enable_metrics, "inference.enable_metrics")}

    def serve(self, config, model_path: str, options: ServeOptions, say: Callable[[str], None]) -> None:
        """The embedded server in the foreground. With inference.api_key it requires one of its keys on
        everything but /health* and /metrics and audits weight updates; on SIGTERM it drains."""
        import uvicorn

        from agentrl_cli.core.security import WEIGHT_UPDATE_PATHS, AuditLog, BearerAuth, service_keys
        from agentrl_cli.core.security.http import paths
        from agentrl_cli.engines.inference.engine import HFEngine
        from agentrl_cli.engines.inference.hf_server import DrainingServer, create_app

        o, inf = options, config.inference
        keys = service_keys(config, "inference")
        eng = HFEngine(model_path, dtype=o.dtype or config.model.dtype, max_batch_size=o.max_batch_size or inf.max_batch_size,
                       batch_window_ms=config.rollout.batch_window_ms if o.batch_window_ms < 0 else o.batch_window_ms,
                       context_length=o.context_length or config.model.context_length, weight_version=o.weight_version,
                       prefix_cache_tokens=inf.prefix_cache_tokens if o.prefix_cache_tokens < 0 else o.prefix_cache_tokens)
        if keys is None and _exposed(o.host):
            say(f"warning: binding {o.host}: the inference server has no authentication; keep it on a private network "
                "reachable only by the training run, or give it a key (AGENTRL_INFERENCE__API_KEY_FILE, written by "
                "`agentrl secrets rotate FILE`)")
        say(f"embedded inference server on http://{o.host}:{o.port} ({model_path}; {self.dialect}'s protocol)")
        server = create_app(eng, api_key=None, enable_metrics=inf.enable_metrics, dialect=self.dialect)
        # SGLang's 401 body; weight updates are audit lines
        server.add_middleware(BearerAuth, keys=keys, service="inference", audit=AuditLog.from_config(config, "inference"),
                              audited=paths(WEIGHT_UPDATE_PATHS), body={"error": "Unauthorized"})
        try:
            # on SIGTERM the server drains: new generation requests get 503 and those in flight answer at
            # once with their partial tokens (finish reason abort), which clients continue elsewhere; what
            # is still open after 5 s is cancelled
            DrainingServer(uvicorn.Config(server, host=o.host, port=o.port, log_level=config.observe.log_level,
                                          timeout_graceful_shutdown=5), drain=server.state.drain).run()
        finally:
            eng.close()
