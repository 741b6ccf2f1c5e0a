"""The engine seam: nothing but an engine's own module (and the registry) branches on an engine's
name; the rest of the platform, the launcher, client and gateway of the engines wing included, asks
the engine object (`agentrl_cli/engines/engine.py`). The registry and the config accept the same names,
both engines satisfy the Protocol, and each answers the questions the rest of the platform asks
(lock packages, ports and router, ranks per server, capabilities, launch command, wire format)."""

from __future__ import annotations

import ast
import dataclasses
import sys
import types
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.config.models import ENGINE_NAMES
from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.engine import ROUTER, SERVER, InferenceEngine
from agentrl_cli.engines.generation import SamplingParams
from agentrl_cli.engines.registry import ENGINES, engine_class, engine_for, engine_named, engine_packages, engine_ref
from agentrl_cli.engines.sglang import SGLangEngine

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"hf", "sglang", "vllm"}  # today's engines and the next one
# where an engine's name may be spelled out: the engines themselves and the table of names
OWN = {"agentrl_cli/engines/embedded.py", "agentrl_cli/engines/sglang.py", "agentrl_cli/engines/vllm.py",
       "agentrl_cli/engines/embedded_vllm.py", "agentrl_cli/engines/registry.py"}


def _is_name(node: ast.AST) -> bool:
    """An expression that holds an engine's name: `engine`, `x.engine`, `inference_engine`..."""
    ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return ident == "engine" or ident.endswith("_engine")


def _names_an_engine(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_an_engine(e) for e in node.elts)
    return False


def _literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) or \
        isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in node.elts)


def engine_name_branches(source: str, where: str) -> list[str]:
    """`where:line: code` for each comparison of an engine's name in `source`: an engine's name
    (`"sglang"`, `("hf", "sglang")`...) on one side, or an engine-named expression against a literal;
    `match engine:` cases on a name count too."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            hit = any(_names_an_engine(o) for o in operands) or \
                (any(_is_name(o) for o in operands) and any(_literal(o) for o in operands))
        elif isinstance(node, ast.match_case):
            hit = isinstance(node.pattern, ast.MatchValue) and _names_an_engine(node.pattern.value)
        if hit:
            found.append(f"{where}:{node.lineno}: {lines[node.lineno - 1].strip()}" if hasattr(node, "lineno")
                         else f"{where}: case {ast.unparse(node.pattern)}")
    return found


def test_nothing_but_an_engine_s_own_module_branches_on_an_engine_s_name():
    found = []
    for folder in ("agentrl_cli", "stages"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in OWN:
                found += engine_name_branches(path.read_text(encoding="utf-8"), rel)
    assert not found, "ask the engine object (agentrl_cli/engines/engine.py) instead of comparing its name:\n" + "\n".join(found)


@pytest.mark.parametrize("code", ['if cfg.inference.engine == "sglang":\n    pass\n',
                                  'x = 1 if engine != "hf" else 2\n',
                                  'ok = inference_engine in ("sglang", "vllm")\n',
                                  'ok = "sglang" == name\n',
                                  'ok = inf.engine == "my.mod:Engine"\n',
                                  'match cfg.inference.engine:\n    case "sglang":\n        pass\n'])
def test_the_check_sees_each_form_of_a_branch_on_an_engine_s_name(code):
    assert engine_name_branches(code, "planted.py")


@pytest.mark.parametrize("code", ['if engine.needs_router(3):\n    pass\n', 'ok = backend == "deepspeed"\n',
                                  'ok = engine.capabilities.host_cpu is True\n'])
def test_the_check_leaves_questions_to_the_engine_alone(code):
    assert engine_name_branches(code, "fine.py") == []


def test_the_config_accepts_exactly_the_registered_engine_names():
    assert set(ENGINE_NAMES) == set(ENGINES)
    for name in ENGINES:
        assert isinstance(engine_named(name), InferenceEngine), name
        assert engine_ref(engine_named(name)) == name


def test_an_engine_path_is_accepted_by_the_config_and_one_that_does_not_load_says_why():
    cfg = load_config(None, ["inference.engine=no_such_module:Engine"], env={}).config
    with pytest.raises(NotFoundError) as info:
        engine_for(cfg)
    assert "inference.engine" in info.value.message and "no_such_module" in info.value.message
    with pytest.raises(ConfigError) as bad:
        load_config(None, ["inference.engine=tgi"], env={})
    assert "module:Class" in bad.value.hint


def config(*sets: str):
    return load_config(None, list(sets), env={}).config


def test_each_engine_answers_the_platform_s_questions():
    sglang, embedded = SGLangEngine(), EmbeddedEngine()
    inf = config("inference.engine=sglang", "inference.replicas=3", "inference.port=31000", "inference.tp_size=4").inference
    assert sglang.lock_packages == ("sglang", "sglang-router") and embedded.lock_packages == ()
    assert sglang.needs_router(3) and not sglang.needs_router(1) and not embedded.needs_router(3)
    assert [(p.first, p.last, p.role, p.serves_clients) for p in sglang.ports(inf)] == [
        (31000, 31002, SERVER, False), (31003, 31003, ROUTER, True)]
    assert [(p.first, p.last, p.serves_clients) for p in embedded.ports(inf)] == [(31000, 31002, True)]
    assert sglang.tp_size(inf) == 4 and embedded.tp_size(inf) == 1
    assert sglang.capabilities.constrained_tool_choice and not embedded.capabilities.constrained_tool_choice
    assert embedded.capabilities.host_cpu and not sglang.capabilities.host_cpu
    assert engine_packages() == ("sglang", "sglang-router", "vllm", "vllm-router")


def test_each_engine_s_launch_command_is_its_own_and_keeps_the_key_off_argv(tmp_path):
    cfg = config("inference.api_key=sekrit-0123456789", "inference.engine=sglang")
    sglang = SGLangEngine().server_launch(cfg, "/models/m", 30001, key_dir=tmp_path)
    assert sglang.cmd[1:3] == ["-m", "sglang.launch_server"] and "sekrit-0123456789" not in " ".join(sglang.cmd)
    sglang.after_healthy()  # the key file SGLang read at start-up goes
    assert not list(tmp_path.glob("sglang-*.yaml"))
    sglang.before_start()  # and comes back for a restart
    assert (tmp_path / "sglang-30001.yaml").exists()
    embedded = EmbeddedEngine().server_launch(cfg, "/models/m", 30002, key_dir=tmp_path)
    assert embedded.cmd[embedded.cmd.index("--engine") + 1] == "hf" and "sekrit-0123456789" not in " ".join(embedded.cmd)
    assert "sekrit-0123456789" in embedded.env["AGENTRL_INFERENCE__API_KEY"]


def test_the_sglang_wire_maps_sampling_and_parses_an_answer():
    engine = engine_class("hf")()
    body = engine.generate_body([1, 2], SamplingParams(max_new_tokens=3, seed=7, stop_token_ids=[9]), "r1", "policy")
    assert body["sampling_params"]["sampling_seed"] == 7 and body["lora_path"] == "policy" and body["rid"] == "r1"
    g = engine.parse_generation({"meta_info": {"output_token_logprobs": [[-0.5, 4, None], [-1.0, 9, None]],
                                               "finish_reason": {"type": "length"}, "weight_version": "3"}}, 0.1, "u", 0)
    assert (g.output_ids, g.output_logprobs, g.finish_reason, g.weight_version) == ([4, 9], [-0.5, -1.0], "length", "3")
    assert engine.queue_length('sglang:num_queue_reqs{model_name="m"} 2.0\n') == 2.0
    assert engine.busy_seconds({"internal_states": [{"busy_seconds_total": 1.5}]}) == 1.5


def test_a_transport_the_engine_does_not_take_is_refused_at_start(monkeypatch):
    from agentrl_cli.weightsync.registry import check_engine_takes

    class DiskOnly(EmbeddedEngine):
        capabilities = dataclasses.replace(EmbeddedEngine.capabilities, transports=frozenset({"disk"}))

    module = types.ModuleType("planted_engines")
    module.DiskOnly = DiskOnly
    monkeypatch.setitem(sys.modules, "planted_engines", module)
    with pytest.raises(ConfigError) as info:
        check_engine_takes(config("inference.engine=planted_engines:DiskOnly", "training.weight_sync=distributed"))
    assert "training.weight_sync" in info.value.message and "disk" in info.value.hint
    check_engine_takes(config("inference.engine=planted_engines:DiskOnly"))  # disk: taken


KEY = "sekrit-0123456789"


@pytest.mark.parametrize("name", [*ENGINES, "tests.engines.recipe_engine:RecipeEngine"])
def test_every_engine_keeps_the_contract(name, tmp_path):
    """What the platform relies on of any engine: the Protocol's members, routes that are paths,
    capabilities within what agentrl knows, ports from inference.port on with the clients' ones
    named, a launch command that never carries the key."""
    from agentrl_cli.weightsync.registry import TRANSPORTS

    engine = engine_named(name)
    assert isinstance(engine, InferenceEngine) and engine.name and engine.title
    # a path, or "" where the engine has no such route (vLLM cannot read a parameter back)
    assert all(p == "" or p.startswith("/") for p in dataclasses.astuple(engine.routes) if isinstance(p, str))
    assert all(p.startswith("/") for p in (*engine.routes.weight_version, *engine.routes.openai))
    caps = engine.capabilities
    assert caps.transports <= set(TRANSPORTS) and set(caps.pause_modes) <= {"abort", "retract", "in_place", "wait", "keep"}
    cfg = config(f"inference.api_key={KEY}", "inference.replicas=2", "inference.port=31000")
    uses = engine.ports(cfg.inference)
    assert uses[0].first == 31000 and uses[0].role == SERVER and any(u.serves_clients for u in uses)
    assert engine.needs_router(2) == any(u.role == ROUTER for u in uses) and engine.tp_size(cfg.inference) >= 1
    launch = engine.server_launch(cfg, "/models/m", 31000, key_dir=tmp_path, beside_trainer=False)
    assert launch.cmd and all(isinstance(a, str) for a in launch.cmd) and KEY not in " ".join(launch.cmd)


@pytest.mark.parametrize("name,why", [("bogus", "registered: hf, sglang"), ("no_such_module:Engine", "No module named")])
def test_serve_inference_refuses_an_engine_it_cannot_load_with_exit_2(cli, name, why):
    result = cli("serve", "inference", "--engine", name)
    assert result.exit_code == 2 and f"bad --engine {name!r}" in result.stderr and why in result.stderr
