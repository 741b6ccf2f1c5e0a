"""The conformance check against the pinned engines' own code (scripts/engine-venvs.sh builds their
environments; CI runs it in .ci/setup): agentrl's SGLang surface passes, the vLLM surface the vLLM
engine sends passes, and each planted mistake fails naming the thing and where the engine defines it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.engines.conformance import VERIFIED
from agentrl_cli.engines.conformance.check import run_probe, surface
from agentrl_cli.engines.sglang import SGLangEngine

pytestmark = pytest.mark.integration
ROOT = Path(os.environ.get("AGENTRL_ENGINE_VENVS", Path.home() / ".cache/agentrl/engines"))


def engine_python(name: str) -> str:
    python = ROOT / f"{name}-{VERIFIED[name]}" / "bin" / "python"
    if not (python.parent.parent / ".complete").exists():
        pytest.skip(f"no {name} {VERIFIED[name]} environment at {python.parent.parent}: build it with bash scripts/engine-venvs.sh")
    return str(python)


VLLM_ARGV = ["-m", "vllm.entrypoints.cli.main", "serve", "/models/m", "--host", "127.0.0.1", "--port", "30000",
             "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--data-parallel-size", "1", "--dtype", "bfloat16",
             "--max-model-len", "2048", "--gpu-memory-utilization", "0.8", "--seed", "0", "--max-num-seqs", "64", "--enable-lora",
             "--max-lora-rank", "8", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
             "--weight-transfer-config", '{"backend":"nccl"}', "--served-model-name", "/models/m"]
VLLM_GENERATE = {"token_ids": [1, 2, 3], "request_id": "r1", "model": "policy-lora",
                 "sampling_params": {"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 7, "stop": ["</s>"],
                                     "stop_token_ids": [2], "ignore_eos": False, "logprobs": 0, "skip_special_tokens": False}}


def call(what, method, route, body=None, query=None, reads=()):
    return {"what": what, "method": method, "route": route, "body": body, "query": query, "reads": list(reads)}


VLLM_CALLS = [
    call("generate", "POST", "/inference/v1/generate", VLLM_GENERATE,
         reads=("choices[].token_ids", "choices[].logprobs.content[].logprob", "choices[].finish_reason",
                "choices[].weight_versions", "prompt_token_ids")),
    call("join", "POST", "/init_weight_transfer_engine",
         {"init_info": {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2}}),
    call("start", "POST", "/start_weight_update"),
    call("update", "POST", "/update_weights", {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2, 2]]}}),
    call("finish", "POST", "/finish_weight_update", {"weight_version": "3"}),
    call("leave", "POST", "/shutdown_weight_transfer_engine"),
    call("disk", "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/3"}}),
    call("relabel", "POST", "/update_weight_version", {"new_version": "3"}),
    call("version", "GET", "/weight_info", reads=("weight_version",)),
    call("load adapter", "POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}),
    call("unload adapter", "POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),
    call("pause", "POST", "/pause", query={"mode": "keep"}),
    call("resume", "POST", "/resume"),
    call("abort", "POST", "/abort_requests", {"request_ids": ["r1"]}),
    *[call(p, "GET", p) for p in ("/health", "/v1/models", "/metrics", "/server_info")],
]


@pytest.fixture(scope="module")
def sglang_surface():
    config = PlatformConfig()
    return surface(SGLangEngine(), config)


def problems(result) -> list[str]:
    return [f"{p['problem']} @ {p['where']}" for p in result.problems]


def test_agentrl_sglang_surface_passes_against_pinned_sglang(sglang_surface):
    result = run_probe("sglang", engine_python("sglang"), sglang_surface["argv"], sglang_surface["calls"])
    assert result.version == VERIFIED["sglang"]
    assert result.passed, problems(result)
    assert {"imported", "source"} >= {i["path"] for i in result.items}


def test_vllm_surface_passes_against_pinned_vllm():
    result = run_probe("vllm", engine_python("vllm"), VLLM_ARGV, VLLM_CALLS)
    assert result.version == VERIFIED["vllm"]
    assert result.passed, problems(result)
    rl_route = next(i for i in result.items if i["kind"] == "route" and "/init_weight_transfer_engine" in i["what"])
    assert "VLLM_SERVER_DEV_MODE=1" in rl_route["note"]


def test_planted_sglang_mistakes_fail_naming_the_thing_and_where(sglang_surface):
    argv = [*sglang_surface["argv"], "--tensor-paralel-size", "1"]
    calls = [dict(c) for c in sglang_surface["calls"]]
    generate = next(c for c in calls if c["route"] == "/generate")
    generate["body"] = {**{k: v for k, v in generate["body"].items() if k != "input_ids"}, "input_idz": [1, 2]}
    disk = next(c for c in calls if c["route"] == "/update_weights_from_disk")
    disk["route"] = "/update_weights_from_dsk"
    found = problems(run_probe("sglang", engine_python("sglang"), argv, calls))
    assert any("--tensor-paralel-size" in p and "sglang.srt.server_args" in p for p in found), found
    assert any("input_idz" in p and "GenerateReqInput" in p and "sglang.srt.managers.io_struct:" in p for p in found), found
    assert any("/update_weights_from_dsk" in p and "closest: /update_weights_from_disk" in p for p in found), found


def test_planted_vllm_mistakes_fail_naming_the_thing_and_where():
    argv = [*VLLM_ARGV, "--tensor-paralel-size", "1"]
    calls = json.loads(json.dumps(VLLM_CALLS))
    calls[0]["body"]["sampling_params"]["max_tokenz"] = calls[0]["body"]["sampling_params"].pop("max_tokens")
    calls[0]["body"]["token_idz"] = calls[0]["body"].pop("token_ids")
    calls[3]["route"] = "/update_weights_from_dsk"
    calls[11]["query"] = {"mode": "kep"}
    found = problems(run_probe("vllm", engine_python("vllm"), argv, calls))
    assert any("--tensor-paralel-size" in p and "make_arg_parser" in p for p in found), found
    assert any("token_idz" in p and "GenerateRequest" in p for p in found), found
    assert any("max_tokenz" in p and "vllm.sampling_params" in p for p in found), found
    assert any("/update_weights_from_dsk" in p and "not in vLLM's route table" in p for p in found), found
    assert any("'kep'" in p and "vllm.entrypoints.rl.online.api_router" in p for p in found), found


def test_sglang_wire_calls_are_built_by_the_dialects_body_methods():
    engine = SGLangEngine()
    calls = {c.route: c for c in engine.wire_calls(PlatformConfig())}
    assert calls["/generate"].body["sampling_params"]["sampling_seed"] == 7
    assert calls["/update_weights_from_disk"].body == engine.disk_update_body("/ckpt/3", "3", True)
    assert all(dataclasses.is_dataclass(c) for c in calls.values())
