"""SGLang is started from the whole config (dtype, context length, pipeline-parallel size, seed, log
level: the flags SGLang 0.5.23 names them by), `inference.pp_size` above 1 is refused at load by an
engine that does not honour it (the rows' `pipeline_parallel`, a plug-in's capabilities), and a
server's reported settings are compared with what the engine expects of the config, naming the key."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import types

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.engine import Setting
from agentrl_cli.engines.settings import differences, server_urls, settings_check
from agentrl_cli.engines.sglang import SGLangEngine


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def _flag(cmd: list[str], name: str) -> str:
    assert cmd.count(name) == 1, f"{name} appears {cmd.count(name)} times in {cmd}"
    return cmd[cmd.index(name) + 1]


def test_sglang_s_command_line_carries_the_model_s_dtype_context_length_pp_size_and_seed(tmp_path):
    cfg = config("inference.engine=sglang", "model.dtype=bfloat16", "model.context_length=4096", "inference.pp_size=2",
                 "inference.tp_size=2", "training.seed=77", "observe.log_level=warning")
    cmd = SGLangEngine().server_launch(cfg, "/models/m", 30001, key_dir=tmp_path).cmd
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert {flag: _flag(cmd, flag) for flag in ("--dtype", "--context-length", "--pp-size", "--tp-size", "--dp-size",
                                                "--random-seed", "--log-level")} == {
        "--dtype": "bfloat16", "--context-length": "4096", "--pp-size": "2", "--tp-size": "2", "--dp-size": "1",
        "--random-seed": "77", "--log-level": "warning"}
    defaults = SGLangEngine().server_launch(config("inference.engine=sglang"), "/models/m", 30001, key_dir=tmp_path).cmd
    assert (_flag(defaults, "--dtype"), _flag(defaults, "--context-length"), _flag(defaults, "--pp-size")) == ("float32", "2048", "1")


def test_serve_inference_execs_sglang_with_the_config_and_its_own_flags(tmp_path):
    """`agentrl serve inference --engine sglang` execs SGLang's launcher (here a stand-in interpreter
    that records its argv) with the config's settings and the command's --dtype and --context-length."""
    fake = tmp_path / "python-with-sglang"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then echo 0.5.23; exit 0; fi\nprintf \'%s\\n\' "$@" > "$ARGV_OUT"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "argv.txt"
    (tmp_path / "config.json").write_text("{}")  # a model directory, as far as agentrl looks before SGLang loads it
    done = subprocess.run([sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", "sglang", "--model", str(tmp_path),
                           "--port", "30007", "--dtype", "float16", "--context-length", "1024",
                           "--set", f"inference.python={fake}", "--set", "inference.pp_size=4", "--set", "training.seed=5"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "ARGV_OUT": str(out)})
    assert done.returncode == 0, done.stderr
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert [_flag(argv, f) for f in ("--dtype", "--context-length", "--pp-size", "--random-seed", "--port")] == [
        "float16", "1024", "4", "5", "30007"]


def test_pp_size_above_one_is_refused_for_the_embedded_engine_and_taken_by_sglang():
    with pytest.raises(ConfigError) as info:
        config("inference.pp_size=2")
    assert "inference.pp_size" in info.value.message and "'hf'" in info.value.message
    assert "inference.pp_size: 1" in info.value.hint and "sglang" in info.value.hint
    assert config("inference.engine=sglang", "inference.pp_size=2").inference.pp_size == 2
    assert config("inference.pp_size=1").inference.pp_size == 1


def test_the_refusal_exits_2_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "agentrl_cli", "config", "show", "--set", "inference.pp_size=2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "inference.pp_size" in done.stderr and "inference.engine 'hf'" in done.stderr


def test_a_plugin_engine_honours_pp_size_only_when_its_capabilities_say_so(monkeypatch):
    class Staged(EmbeddedEngine):
        capabilities = dataclasses.replace(EmbeddedEngine.capabilities, pipeline_parallel=True)

    module = types.ModuleType("planted_pp_engines")
    module.Staged, module.Plain = Staged, EmbeddedEngine
    monkeypatch.setitem(sys.modules, "planted_pp_engines", module)
    assert config("inference.engine=planted_pp_engines:Staged", "inference.pp_size=2").inference.pp_size == 2
    with pytest.raises(ConfigError, match="inference.pp_size"):
        config("inference.engine=planted_pp_engines:Plain", "inference.pp_size=2")
    with pytest.raises(ConfigError, match="inference.pp_size"):
        config("inference.engine=tests.engines.recipe_engine:RecipeEngine", "inference.pp_size=2")


def test_differences_name_the_setting_both_values_and_the_config_key():
    expected = {"context_length": Setting(2048, "model.context_length"), "dtype": Setting("float32", "model.dtype"),
                "batch_window_ms": Setting(5.0, "rollout.batch_window_ms"), "enable_metrics": True, "pp_size": Setting(1, "inference.pp_size")}
    reported = {"context_length": 1024, "dtype": "float32", "batch_window_ms": 0.005 * 1000.0, "enable_metrics": 1}
    assert differences(expected, reported) == [
        "context_length: the server reports 1024, the config says 2048 (model.context_length)",
        "enable_metrics: the server reports 1, the config says True",
        "pp_size: the server does not report it, the config says 1 (inference.pp_size)"]


def test_sglang_s_server_info_is_read_in_the_config_s_spelling():
    cfg = config("inference.engine=sglang", "model.dtype=float16", "inference.pp_size=2")
    engine = SGLangEngine()
    # the fields of SGLang's /server_info (its resolved ServerArgs) that the config sets
    info = {"dtype": "half", "context_length": 2048, "tp_size": 1, "dp_size": 1, "pp_size": 2, "random_seed": 1234,
            "enable_metrics": True, "internal_states": [{}], "version": "0.5.23"}
    assert differences(engine.expected_settings(cfg), engine.reported_settings(info)) == []
    assert differences(engine.expected_settings(cfg), engine.reported_settings({**info, "pp_size": 1})) == [
        "pp_size: the server reports 1, the config says 2 (inference.pp_size)"]


def test_an_engine_that_names_no_settings_is_skipped_with_the_reason():
    class Bare:
        title = "the bare engine"

    check = settings_check(config(), ["http://127.0.0.1:9"], Bare())
    assert check.status == CheckStatus.SKIP and "expected_settings" in check.detail


def test_the_settings_are_asked_of_the_servers_not_the_router():
    cfg = config("inference.engine=sglang", "inference.replicas=2", "inference.port=31000")
    assert server_urls(cfg, SGLangEngine()) == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert server_urls(config("inference.urls=[http://h:1/]"), EmbeddedEngine()) == ["http://h:1"]
