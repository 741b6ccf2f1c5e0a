"""The registries' tables as data (agentrl_cli/core/parts.py): every row's `module:Class` loads, the
built-in backends honour what their rows say, a knob the chosen backend does not honour is refused at
load (exit 2, naming the backend and the key), a plug-in is imported only when a knob asks something
of it, and the README's capability matrix is the one the rows generate."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core import capabilities, parts
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.plugins import import_target

ROOT = Path(__file__).resolve().parents[2]
ALL_ROWS = (parts.BACKENDS, parts.TRANSPORTS, parts.LORA_TRANSPORTS, parts.VERIFIERS, parts.STORES, parts.EXECUTORS)


@pytest.mark.parametrize("row", [r for rows in ALL_ROWS for r in rows], ids=lambda r: f"{r.name}:{r.target}")
def test_every_row_loads(row):
    assert isinstance(import_target(row.name, row.target), type)


def test_the_builtin_backends_honour_what_their_rows_say():
    for row in parts.BACKENDS:
        assert parts.POLICY_STEP <= row.honours
        assert parts.POLICY_STEP <= frozenset(import_target(row.name, row.target).honours)


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "my_backends.py").write_text(textwrap.dedent("""
        class Plain:  # a module:Class backend that declares nothing
            pass

        class Corrected:
            honours = {"correction"}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_plugin_backend_without_corrections_is_refused_when_a_correction_is_set(plugins):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["training.backend=my_backends:Plain", "training.correction=tis"], env={})
    message = str(info.value)
    assert "training.correction" in message and "my_backends:Plain" in message and "training.correction: none" in message


def test_a_plugin_backend_that_says_it_honours_corrections_is_accepted(plugins):
    cfg = load_config(None, ["training.backend=my_backends:Corrected", "training.correction=tis"], env={}).config
    assert cfg.training.correction == "tis"
    with pytest.raises(ConfigError, match="training.max_tokens_per_micro_batch"):
        load_config(None, ["training.backend=my_backends:Corrected", "training.max_tokens_per_micro_batch=512"], env={})


@pytest.mark.parametrize("knob", ["training.max_tokens_per_micro_batch=512", "training.loss_aggregation=seq_mean",
                                  "training.lora={rank: 4}"])
def test_each_backend_knob_is_refused_on_a_backend_that_does_not_honour_it(plugins, knob):
    with pytest.raises(ConfigError, match=knob.split("=")[0].replace(".", r"\.")):
        load_config(None, ["training.backend=my_backends:Plain", knob], env={})
    assert load_config(None, [knob], env={}).config.training.backend == "deepspeed"  # the built-in honours it


def test_the_refusal_exits_2_from_the_command_line(plugins):
    done = subprocess.run([sys.executable, "-m", "agentrl_cli", "config", "show", "--set", "training.backend=my_backends:Plain",
                           "--set", "training.correction=tis"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(plugins)})
    assert done.returncode == 2, done.stderr
    assert "training.correction" in done.stderr and "my_backends:Plain" in done.stderr


def test_a_plugin_is_imported_only_when_a_knob_asks_something_of_it():
    assert load_config(None, ["training.backend=no_such_module:Backend"], env={}).config.training.backend
    with pytest.raises(ConfigError, match="no_such_module"):
        load_config(None, ["training.backend=no_such_module:Backend", "training.correction=tis"], env={})


def test_the_readme_capability_matrix_is_generated_from_the_rows():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert capabilities.replace_block(readme, capabilities.matrix()) == readme, \
        "the README's capability matrix is stale: run `python -m agentrl_cli.core.capabilities README.md`"


def test_the_matrix_follows_the_rows():
    matrix = capabilities.matrix()
    assert "| `deepspeed` | yes | yes | yes | yes | yes | DeepSpeed ZeRO stage 0-3 (training.zero_stage) |" in matrix
    assert "| `distributed` | yes | - |" in matrix  # no row sends the adapter alone over the process group


def test_the_engine_rows_say_what_the_engine_classes_honour():
    for row in parts.ENGINES:
        caps = import_target(row.name, row.target).capabilities
        assert {h for h in row.honours if h.startswith("transport:")} == {f"transport:{t}" for t in caps.transports}
        assert {h for h in row.honours if h.startswith("pause:")} == {f"pause:{m}" for m in caps.pause_modes}
        assert ("adapters" in row.honours) == caps.adapters
        assert ("tool_choice" in row.honours) == caps.constrained_tool_choice
        assert ("pipeline_parallel" in row.honours) == caps.pipeline_parallel
        assert parts.engine_features(caps) == row.honours  # what a `module:Class` engine's capabilities say
        assert row.packages == tuple(import_target(row.name, row.target).lock_packages)
