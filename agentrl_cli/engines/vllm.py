"""The vLLM engine (`inference.engine: vllm`): vLLM's OpenAI-compatible server (`vllm serve`, run as
`python -m vllm.entrypoints.cli.main serve` with `inference.python`, since vLLM usually lives in its
own environment or image) with its RL routes on, and vLLM's router (`vllm-router`) in front of several
replicas. They speak vLLM's protocol (`vllm_dialect.py`).

The command line comes from the whole config: tensor, pipeline and data parallel sizes, dtype, context
length (`--max-model-len`), GPU memory share, running-request cap, LoRA (`--enable-lora`, the
adapter's rank), the tool-call parser of agentrl's chat convention (Hermes `<tool_call>` blocks) and the
reasoning parser of the model's family, the run's seed, the prefix cache, and the weight-transfer
backend. The key goes by the environment (`VLLM_API_KEY`), never argv; `VLLM_SERVER_DEV_MODE=1` turns
on the routes a trainer needs (pause, the weight transfer, collective_rpc, server_info).

Belongs here: vLLM's launch and router command lines, its installation check and what it honours.
Does not: the wire (`vllm_dialect.py`), starting and watching processes (`inference/launcher.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.engines.engine import ROUTER, SERVER, Capabilities, PortUse, ServeOptions, ServerLaunch, Setting
from agentrl_cli.engines.inference.launcher import InferenceUnavailable
from agentrl_cli.engines.vllm_dialect import PAUSE_MODES, VLLMDialect

TOOL_CALL_PARSER = "hermes"  # vLLM's parser of Hermes `<tool_call>` blocks: agentrl's chat convention
# the reasoning parser for a model family (config.json `model_type`); families not listed have none
REASONING_PARSERS = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "deepseek_v3": "deepseek_r1", "glm4_moe": "glm45"}
WEIGHT_TRANSFER_BACKEND = "nccl"  # between trainer ranks and servers; vLLM takes "ipc" for colocated GPUs
ROUTER_POLICY = {"least_loaded": "power_of_two"}  # vllm-router has no least_loaded; power-of-two is its nearest
DEV_ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # the RL routes: pause, weight transfer, collective_rpc, server_info
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # /v1/load_lora_adapter answers only with it
INSTALL_HINT = ("on a GPU host: pip install 'agentrl-cli[vllm]' (or `pip install vllm vllm-router`), or set "
                "inference.python to the interpreter of the environment that has vLLM; on a CPU box use "
                "inference.engine: hf (with inference.dialect: vllm to speak vLLM's protocol)")


def model_type(model_path: str) -> str | None:
    """`model_type` from the model directory's config.json (None when it cannot be read: a hub id)."""
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def vllm_command(config, model_path: str, port: int) -> list[str]:
    """`vllm serve` for one server of the run's config (the whole platform config: model, training
    and inference sections)."""
    inf, model, lora = config.inference, config.model, config.training.lora
    cmd = [inf.python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_path), "--host", inf.host, "--port", str(port),
           "--served-model-name", str(model_path),
           "--tensor-parallel-size", str(inf.tp_size), "--pipeline-parallel-size", str(inf.pp_size),
           "--data-parallel-size", str(inf.dp_size), "--dtype", model.dtype, "--max-model-len", str(model.context_length),
           "--seed", str(config.training.seed), "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER,
           "--weight-transfer-config", json.dumps({"backend": WEIGHT_TRANSFER_BACKEND}, separators=(",", ":"))]
    reasoning = REASONING_PARSERS.get(model_type(model_path) or "")
    if reasoning:
        cmd += ["--reasoning-parser", reasoning]
    if inf.mem_fraction_static is not None:
        cmd += ["--gpu-memory-utilization", str(inf.mem_fraction_static)]
    if inf.max_running_requests is not None:
        cmd += ["--max-num-seqs", str(inf.max_running_requests)]
    if inf.prefix_cache_tokens == 0:
        cmd.append("--no-enable-prefix-caching")
    if lora is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank)]
    return cmd


def vllm_env(inference, lora) -> dict[str, str]:
    """The environment a vLLM server needs beside this one: the RL routes, runtime LoRA loading, and
    the key (inference.api_key) where every user of the host cannot read it."""
    env = dict(DEV_ENV)
    if lora is not None:
        env.update(LORA_ENV)
    if inference.api_key is not None:
        env["VLLM_API_KEY"] = inference.api_key.get_secret_value()
    return env


def router_command(inference, worker_urls: list[str], port: int) -> list[str]:
    """vllm-router in front of `worker_urls` on `port`, its Prometheus metrics on the next port (its
    default, 29000, would collide with a second router on the host)."""
    return [inference.python, "-m", "vllm_router.launch_router", "--worker-urls", *worker_urls,
            "--policy", ROUTER_POLICY.get(inference.router_policy, inference.router_policy),
            "--host", inference.host, "--port", str(port),
            "--prometheus-host", inference.host, "--prometheus-port", str(port + 1)]


def check_vllm(python: str) -> str:
    """vLLM's version under `python`; InferenceUnavailable saying how to install it when it does not import."""
    try:
        proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise InferenceUnavailable(f"vLLM is not installed for {python} ({exc})", INSTALL_HINT) from None
    if proc.returncode != 0:
        problem = (proc.stderr.strip().splitlines() or ["not found"])[-1]
        raise InferenceUnavailable(f"vLLM is not installed for {python} ({problem})", INSTALL_HINT)
    return proc.stdout.strip()


class VLLMEngine(VLLMDialect):
    """`inference.engine: vllm`."""

    name = "vllm"
    title = "vLLM"
    capabilities = Capabilities(transports=frozenset({"disk", "distributed"}), adapters=True, pause_modes=PAUSE_MODES,
                                constrained_tool_choice=True, host_cpu=False, pipeline_parallel=True,
                                dialects=("vllm",))
    lock_packages = ("vllm", "vllm-router")
    import_modules = ("vllm", "vllm_router")

    def check_installed(self, inference) -> str | None:
        return check_vllm(inference.python)

    def server_launch(self, config, model_path: str, port: int, *, key_dir=None, beside_trainer: bool = False) -> ServerLaunch:
        if config.training.lora is not None and config.inference.dp_size > 1:
            raise ConfigError(f"vLLM loads LoRA adapters at run time on every data-parallel rank only through "
                              f"one API server; inference.dp_size is {config.inference.dp_size}",
                              "set inference.dp_size: 1 and start more servers with inference.replicas, or unset training.lora")
        cmd = vllm_command(config, model_path, port) + ["--uvicorn-log-level", config.observe.log_level.lower()]
        return ServerLaunch(cmd, vllm_env(config.inference, config.training.lora))

    def expected_settings(self, config) -> dict[str, Setting]:
        """What `vllm_command` puts on vLLM's command line and its /server_info reports back."""
        m, inf = config.model, config.inference
        expected = {"dtype": Setting(m.dtype, "model.dtype"), "max_model_len": Setting(m.context_length, "model.context_length"),
                    "tensor_parallel_size": Setting(inf.tp_size, "inference.tp_size"),
                    "pipeline_parallel_size": Setting(inf.pp_size, "inference.pp_size"),
                    "data_parallel_size": Setting(inf.dp_size, "inference.dp_size"),
                    "seed": Setting(config.training.seed, "training.seed"),
                    "enable_prefix_caching": Setting(inf.prefix_cache_tokens != 0, "inference.prefix_cache_tokens")}
        if inf.max_running_requests is not None:
            expected["max_num_seqs"] = Setting(inf.max_running_requests, "inference.max_running_requests")
        return expected

    def needs_router(self, replicas: int) -> bool:
        return replicas > 1

    def ports(self, inference) -> list[PortUse]:
        last = inference.port + inference.replicas - 1
        routed = self.needs_router(inference.replicas)
        uses = [PortUse(inference.port, last, SERVER, f"{inference.replicas} vLLM server(s)", not routed)]
        if routed:
            uses.append(PortUse(last + 1, last + 1, ROUTER, "vLLM's router in front of the replicas", True))
            uses.append(PortUse(last + 2, last + 2, ROUTER, "vLLM's router's Prometheus metrics", False))
        return uses

    def router_launch(self, inference, worker_urls: list[str], port: int) -> ServerLaunch:
        return ServerLaunch(router_command(inference, worker_urls, port))

    def trainer_group(self):
        """How the trainer opens rank 0 of the weight-transfer group its servers join: vLLM's own
        (`vllm_transfer.py`), not agentrl's (`weight_group.open_group`)."""
        from agentrl_cli.engines.vllm_transfer import open_vllm_group

        return open_vllm_group

    def tp_size(self, inference) -> int:
        return inference.tp_size * inference.pp_size  # every GPU of a server joins the transfer

    def serve(self, config, model_path: str, options: ServeOptions, say: Callable[[str], None]) -> None:
        """Exec `vllm serve` with the config's settings (the embedded server's batching flags do not apply)."""
        from agentrl_cli.config.load import with_overrides

        config = with_overrides(config, {"inference.host": options.host}, "--host")
        check_vllm(config.inference.python)
        cmd = vllm_command(config, str(model_path), options.port)
        say("exec: " + " ".join(cmd))
        os.execvpe(cmd[0], cmd, {**os.environ, **vllm_env(config.inference, config.training.lora)})
