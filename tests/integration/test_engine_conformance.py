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
from agentrl_cli.engines.vllm import VLLMEngine

pytestmark = pytest.mark.integration
ROOT = Path(os.environ.get("AGENTRL_ENGINE_VENVS", Path.home() / ".cache/agentrl/engines"))


def engine_python(name: str) -> str:
    python = ROOT / f"{name}-{VERIFIED[name]}" / "bin" / "python"
    if not (python.parent.parent / ".complete").exists():
        pytest.skip(f"no {name} {VERIFIED[name]} environment at {python.parent.parent}: build it with bash scripts/engine-venvs.sh")
    return str(python)


@pytest.fixture(scope="module")
def vllm_surface():
    """What the vLLM engine itself sends, with LoRA and a running-request cap so those flags are checked too."""
    config = PlatformConfig.model_validate({"inference": {"engine": "vllm", "max_running_requests": 64,
                                                          "mem_fraction_static": 0.8},
                                            "training": {"lora": {"rank": 8}}, "model": {"dtype": "bfloat16"}})
    return surface(VLLMEngine(), config)


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


def test_vllm_surface_passes_against_pinned_vllm(vllm_surface):
    assert "--enable-lora" in vllm_surface["argv"] and "--max-num-seqs" in vllm_surface["argv"]
    result = run_probe("vllm", engine_python("vllm"), vllm_surface["argv"], vllm_surface["calls"])
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


def test_planted_vllm_mistakes_fail_naming_the_thing_and_where(vllm_surface):
    argv = [*vllm_surface["argv"], "--tensor-paralel-size", "1"]
    calls = json.loads(json.dumps(vllm_surface["calls"]))
    generate = next(c for c in calls if c["route"] == "/inference/v1/generate")
    generate["body"]["sampling_params"]["max_tokenz"] = generate["body"]["sampling_params"].pop("max_tokens")
    generate["body"]["token_idz"] = generate["body"].pop("token_ids")
    next(c for c in calls if c["route"] == "/update_weights")["route"] = "/update_weights_from_dsk"
    next(c for c in calls if c["route"] == "/pause")["query"] = {"mode": "kep"}
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


def test_stage_4_checks_an_installed_engine_against_its_own_code(cli, isolated, tmp_path, random_model_dir):
    """Stage 4 with vLLM installed for inference.python: the conformance and version checks pass before
    the server start (which needs a GPU this machine lacks)."""
    python = engine_python("vllm")
    result, report = cli.json("stage", "run", "4", "--set", "inference.engine=vllm", "--set", f"inference.python={python}",
                              "--set", "inference.startup_timeout_s=5", "--set", f"model.cache_dir={tmp_path}",
                              "--set", f"model.path={random_model_dir}")
    assert result.exit_code == 1  # the server cannot start without a GPU
    checks = {c["name"]: c for c in report["reports"][0]["checks"]}
    assert checks["engine conforms to its own code"]["status"] == "pass", checks["engine conforms to its own code"]
    assert checks["engine version verified"]["status"] == "pass"
