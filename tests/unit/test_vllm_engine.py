"""The vLLM engine's command line from the whole config (parallel sizes, dtype, context length, GPU
share, running-request cap, LoRA, parsers, seed, prefix cache, weight-transfer backend), its key and
RL routes by the environment and never argv; its ports and router; its wire (sampling, answers,
the calls a weight update sends, pause by query); and `inference.dialect` refused at load where the
engine does not speak it."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.engines.engine import ROUTER, SERVER, disk_update_calls, distributed_update_calls, pause_call
from agentrl_cli.engines.generation import SamplingParams
from agentrl_cli.engines.registry import engine_for
from agentrl_cli.engines.vllm import VLLMEngine


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_launch_carries_the_whole_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    cfg = config("inference.engine=vllm", "inference.tp_size=2", "inference.dp_size=1", "inference.mem_fraction_static=0.7",
                 "inference.max_running_requests=96", "model.dtype=bfloat16", "model.context_length=4096",
                 "training.seed=99", "inference.prefix_cache_tokens=0", "training.lora.rank=16")
    launch = VLLMEngine().server_launch(cfg, str(tmp_path), 30005)
    cmd = launch.cmd
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(tmp_path)]
    assert flag(cmd, "--port") == "30005" and flag(cmd, "--tensor-parallel-size") == "2"
    assert flag(cmd, "--data-parallel-size") == "1" and flag(cmd, "--pipeline-parallel-size") == "1"
    assert flag(cmd, "--dtype") == "bfloat16" and flag(cmd, "--max-model-len") == "4096"
    assert flag(cmd, "--gpu-memory-utilization") == "0.7" and flag(cmd, "--max-num-seqs") == "96"
    assert flag(cmd, "--seed") == "99" and "--no-enable-prefix-caching" in cmd
    assert "--enable-lora" in cmd and flag(cmd, "--max-lora-rank") == "16"
    assert flag(cmd, "--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in cmd
    assert flag(cmd, "--reasoning-parser") == "qwen3"  # the model family's
    assert json.loads(flag(cmd, "--weight-transfer-config")) == {"backend": "nccl"}
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1" and launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_a_family_without_a_reasoning_parser_gets_none_and_the_key_stays_off_argv(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cfg = config("inference.engine=vllm", "inference.api_key=sekrit-0123456789")
    launch = VLLMEngine().server_launch(cfg, str(tmp_path), 30000)
    assert "--reasoning-parser" not in launch.cmd and "sekrit-0123456789" not in " ".join(launch.cmd)
    assert launch.env["VLLM_API_KEY"] == "sekrit-0123456789" and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in launch.env


def test_lora_with_several_data_parallel_ranks_is_refused_naming_the_fix():
    cfg = config("inference.engine=vllm", "inference.dp_size=2", "training.lora.rank=8")
    with pytest.raises(ConfigError) as info:
        VLLMEngine().server_launch(cfg, "/m", 30000)
    assert "dp_size" in info.value.message and "inference.replicas" in info.value.hint


def test_ports_put_vllms_router_after_the_replicas():
    inf = config("inference.engine=vllm", "inference.replicas=3", "inference.port=31000").inference
    engine = VLLMEngine()
    assert [(p.first, p.last, p.role, p.serves_clients) for p in engine.ports(inf)] == [
        (31000, 31002, SERVER, False), (31003, 31003, ROUTER, True), (31004, 31004, ROUTER, False)]
    router = engine.router_launch(inf, ["http://a:1", "http://b:2"], 31003).cmd
    assert router[1:3] == ["-m", "vllm_router.launch_router"] and flag(router, "--policy") == "round_robin"
    assert flag(router, "--prometheus-port") == "31004"


def test_the_wire_maps_sampling_and_parses_a_tokens_answer():
    engine = VLLMEngine()
    body = engine.generate_body([1, 2], SamplingParams(max_new_tokens=3, seed=7, stop_token_ids=[9], top_k=-1), "r1", "policy")
    assert body == {"token_ids": [1, 2], "request_id": "r1", "model": "policy",
                    "sampling_params": {"max_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs": 0,
                                        "skip_special_tokens": False, "stop_token_ids": [9], "seed": 7}}
    g = engine.parse_generation({"choices": [{"index": 0, "token_ids": [4, 9], "finish_reason": "length",
                                              "logprobs": {"content": [{"token_id": 4, "logprob": -0.5},
                                                                       {"token_id": 9, "logprob": -1.0}]},
                                              "weight_versions": [{"version": "3", "start": 0, "end": 2}]}],
                                 "usage": {"prompt_tokens": 2}}, 0.1, "u", 0)
    assert (g.output_ids, g.output_logprobs, g.finish_reason, g.weight_version, g.prompt_tokens) == (
        [4, 9], [-0.5, -1.0], "length", "3", 2)
    assert engine.queue_length('vllm:num_requests_waiting{model_name="m"} 2.0\n') == 2.0
    assert engine.busy_seconds({}) is None  # vLLM reports none


def test_a_weight_update_is_paused_keep_phased_and_always_resumed():
    engine = VLLMEngine()
    calls = distributed_update_calls(engine, ["w"], ["float32"], [[2]], "5", group_name="g")
    assert [c.route for c in calls] == ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/resume"]
    assert calls[0].query == {"mode": "keep"} and calls[-1].always and not any(c.always for c in calls[:-1])
    assert calls[2].body == {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}}
    assert calls[3].body == {"weight_version": "5"}
    disk = disk_update_calls(engine, "/ckpt/5", "5")
    assert [c.route for c in disk] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    assert disk[1].body == {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/5"}}
    assert pause_call(engine, "abort").query == {"mode": "abort"}
    with pytest.raises(ValueError, match="load_format"):
        distributed_update_calls(engine, ["w"], ["float32"], [[2]], "5", group_name="g", load_format="flattened_bucket")


def test_a_dialect_the_engine_does_not_speak_is_refused_at_load():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["inference.engine=sglang", "inference.dialect=vllm"], env={})
    assert "inference.dialect" in info.value.message and "sglang" in info.value.message
    assert engine_for(config("inference.dialect=vllm")).dialect == "vllm"
    assert engine_for(config("inference.engine=vllm", "inference.dialect=vllm")).title == "vLLM"


def test_the_trainer_opens_vllms_transfer_with_vllms_own_rendezvous_and_says_what_it_needs():
    """vLLM's workers join through vLLM's StatelessProcessGroup; the trainer's rank 0 must too. Where
    vLLM or CUDA is missing (this machine), opening it names both and the disk transport."""
    from agentrl_cli.engines.embedded_vllm import EmbeddedVLLMEngine
    from agentrl_cli.engines.weight_group import listen

    opener = VLLMEngine().trainer_group()
    sock = listen("127.0.0.1")
    with pytest.raises(RuntimeError) as info:
        opener("127.0.0.1", sock.getsockname()[1], 0, 2, listener=sock)
    assert "vLLM" in str(info.value) and "training.weight_sync: disk" in str(info.value)
    assert sock.fileno() == -1  # the reserved port was handed back for vLLM's store
    assert not hasattr(EmbeddedVLLMEngine(), "trainer_group")  # the embedded server joins agentrl's own group


def test_the_dialect_key_takes_exactly_the_dialects_the_rows_name():
    from typing import get_args

    from agentrl_cli.config.sections.inference import InferenceConfig
    from agentrl_cli.core import parts

    assert set(get_args(InferenceConfig.model_fields["dialect"].annotation)) == {"", *parts.DIALECTS}
