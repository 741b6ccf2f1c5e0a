"""The SGLang engine: SGLang's servers (`python -m sglang.launch_server`, possibly with another
interpreter, `inference.python`, since SGLang usually lives in its own environment or image) and the
SGLang router in front of several replicas. They speak SGLang's protocol (`sglang_dialect.py`).
Belongs here: SGLang's launch and router command lines, its key file, its installation check and
what it honours. Does not: starting and watching processes (`inference/launcher.py`)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Callable

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.engines.engine import ROUTER, SERVER, Capabilities, PortUse, ServeOptions, ServerLaunch, Setting
from agentrl_cli.engines.inference.launcher import InferenceUnavailable
from agentrl_cli.engines.sglang_dialect import METRICS, ROUTES, SGLangDialect

ROUTER_POLICY = {"least_loaded": "power_of_two"}  # the router has no least_loaded; power-of-two is its nearest
TOOL_CALL_PARSER = "qwen25"  # SGLang's parser of Hermes `<tool_call>` blocks: the convention agentrl's chat renderer and embedded server use


def sglang_command(cfg, model_path: str, port: int, lora=None, key_dir: Path | None = None, *, model=None,
                   seed: int | None = None) -> list[str]:
    """SGLang's command line for `cfg` (the inference section). With `model` (the model section) the
    server serves in `model.dtype` with `model.context_length` tokens of context; with `seed`
    (training.seed) its sampling is seeded. With `lora` (training.lora) the server
    takes LoRA adapters loaded at run time (`--enable-lora`), sized for them: `--max-lora-rank` and
    `--lora-target-modules` are fixed at launch, and an adapter of a higher rank or other modules is refused.
    The key (inference.api_key) never goes on the command line, which every user of the host can read:
    it goes into a YAML file only this user can read, in `key_dir`, that SGLang reads with `--config`.
    `config_command` builds it from the whole config, as a run and `agentrl serve inference` start it."""
    if lora is not None and cfg.dp_size > 1:
        raise ConfigError(f"SGLang loads LoRA adapters at run time only with one data-parallel rank (its "
                          f"load_lora_adapter asserts dp_size == 1); inference.dp_size is {cfg.dp_size}",
                          "set inference.dp_size: 1 and start more servers with inference.replicas, or unset training.lora")
    cmd = [cfg.python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", cfg.host,
           "--port", str(port), "--tp-size", str(cfg.tp_size), "--dp-size", str(cfg.dp_size), "--pp-size", str(cfg.pp_size),
           "--weight-version", "0", "--tool-call-parser", TOOL_CALL_PARSER]
    if model is not None:
        cmd += ["--dtype", model.dtype, "--context-length", str(model.context_length)]
    if seed is not None:
        cmd += ["--random-seed", str(seed)]
    if cfg.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.max_running_requests is not None:
        cmd += ["--max-running-requests", str(cfg.max_running_requests)]
    if cfg.api_key is not None:
        cmd += ["--config", str(sglang_key_file(cfg.api_key.get_secret_value(), key_dir, port))]
    if cfg.enable_metrics:
        cmd.append("--enable-metrics")
    if cfg.prefix_cache_tokens == 0:
        cmd.append("--disable-radix-cache")
    if lora is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--lora-target-modules", *lora.target_modules]
    return cmd


def config_command(config, model_path: str, port: int, key_dir: Path | None = None) -> list[str]:
    """SGLang's command line from the whole config: the inference section's flags, the model's dtype
    and context length, training.seed, training.lora and observe.log_level (docs/engines.md lists
    which key becomes which flag)."""
    return sglang_command(config.inference, model_path, port, config.training.lora, key_dir, model=config.model,
                          seed=config.training.seed) + ["--log-level", config.observe.log_level]


def sglang_key_file(key: str, key_dir: Path | None, port: int) -> Path:
    """`api-key: KEY` in `key_dir/sglang-PORT.yaml` (mode 0600; a private temporary directory when
    `key_dir` is None), the form SGLang's `--config` reads."""
    import tempfile

    import yaml

    directory = Path(key_dir) if key_dir is not None else Path(tempfile.mkdtemp(prefix="agentrl-sglang-"))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"sglang-{port}.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump({"api-key": key}))
    os.chmod(path, 0o600)
    return path


def key_file_hooks(cfg, key_dir: Path, port: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(write SGLang's key file for `port` again, remove it): around each start of that server; the
    file is read at start-up, so no copy stays on disk once the server is healthy."""
    key = cfg.api_key.get_secret_value()

    def write() -> None:
        sglang_key_file(key, key_dir, port)

    def remove() -> None:
        (Path(key_dir) / f"sglang-{port}.yaml").unlink(missing_ok=True)
    return write, remove


def router_command(cfg, worker_urls: list[str], port: int) -> list[str]:
    return [cfg.python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
            "--policy", ROUTER_POLICY.get(cfg.router_policy, cfg.router_policy), "--host", cfg.host, "--port", str(port)]


def check_sglang(python: str) -> str:
    """SGLang's version under `python`; InferenceUnavailable saying how to install it when it does not import."""
    try:
        proc = subprocess.run([python, "-c", "import sglang, sys; print(sglang.__version__)"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        proc = None
        problem = str(exc)
    else:
        problem = proc.stderr.strip().splitlines()[-1] if proc.returncode else ""
    if proc is None or proc.returncode != 0:
        raise InferenceUnavailable(f"SGLang is not installed for {python} ({problem or 'import failed'})",
                                   "on a GPU host: pip install 'agentrl-cli[sglang]' (or `pip install sglang[all] sglang-router`), "
                                   "or set inference.python to the interpreter of the environment that has SGLang; "
                                   "on a CPU box use inference.engine: hf")
    return proc.stdout.strip()


class SGLangEngine(SGLangDialect):
    """`inference.engine: sglang`."""

    name = "sglang"
    title = "SGLang"
    capabilities = Capabilities(transports=frozenset({"disk", "distributed"}), adapters=True,
                                pause_modes=("abort", "retract", "in_place"), constrained_tool_choice=True, host_cpu=False,
                                pipeline_parallel=True, dialects=("sglang",), generate_stream=True)
    # SGLang 0.5.23 (engines/conformance VERIFIED) reads a weight version back at /model_info only (it has no
    # /get_weight_version), and its /server_info has no busy-seconds counter: `agentrl engine verify` says so
    routes = dataclasses.replace(ROUTES, weight_version=("/model_info",))
    metrics = dataclasses.replace(METRICS, busy_seconds="")
    lock_packages = ("sglang", "sglang-router")
    import_modules = ("sglang", "sglang_router")

    def check_installed(self, inference) -> str | None:
        return check_sglang(inference.python)

    def server_launch(self, config, model_path: str, port: int, *, key_dir, beside_trainer: bool = False) -> ServerLaunch:
        inf = config.inference
        launch = ServerLaunch(config_command(config, model_path, port, key_dir))
        if inf.api_key is not None:  # a restart needs the key file again, briefly
            launch.before_start, launch.after_healthy = key_file_hooks(inf, key_dir, port)
        return launch

    def needs_router(self, replicas: int) -> bool:
        return replicas > 1

    def ports(self, inference) -> list[PortUse]:
        last = inference.port + inference.replicas - 1
        routed = self.needs_router(inference.replicas)
        uses = [PortUse(inference.port, last, SERVER, f"{inference.replicas} SGLang server(s)", not routed)]
        if routed:
            uses.append(PortUse(last + 1, last + 1, ROUTER, "the SGLang router in front of the replicas", True))
        return uses

    def router_launch(self, inference, worker_urls: list[str], port: int) -> ServerLaunch:
        return ServerLaunch(router_command(inference, worker_urls, port))

    def tp_size(self, inference) -> int:
        return inference.tp_size

    def expected_settings(self, config) -> dict[str, Setting]:
        """What `config_command` puts on SGLang's command line and its /server_info reports back
        (the resolved ServerArgs)."""
        m, inf = config.model, config.inference
        return {"dtype": Setting(m.dtype, "model.dtype"), "context_length": Setting(m.context_length, "model.context_length"),
                "tp_size": Setting(inf.tp_size, "inference.tp_size"), "dp_size": Setting(inf.dp_size, "inference.dp_size"),
                "pp_size": Setting(inf.pp_size, "inference.pp_size"), "random_seed": Setting(config.training.seed, "training.seed"),
                "enable_metrics": Setting(inf.enable_metrics, "inference.enable_metrics")}

    def serve(self, config, model_path: str, options: ServeOptions, say: Callable[[str], None]) -> None:
        """Exec SGLang's launcher with the config's settings and the command's --host, --dtype,
        --context-length and --prefix-cache-tokens (the embedded server's batching flags do not apply to it)."""
        from agentrl_cli.config.load import with_overrides

        o = options
        overrides = {"inference.host": o.host, "model.dtype": o.dtype or None, "model.context_length": o.context_length or None,
                     "inference.prefix_cache_tokens": None if o.prefix_cache_tokens < 0 else o.prefix_cache_tokens}
        config = with_overrides(config, {k: v for k, v in overrides.items() if v is not None}, "agentrl serve inference")
        check_sglang(config.inference.python)
        cmd = config_command(config, str(model_path), o.port)
        say("exec: " + " ".join(cmd))
        os.execvp(cmd[0], cmd)
