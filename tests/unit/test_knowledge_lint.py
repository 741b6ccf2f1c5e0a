"""The knowledge base names only what exists: every signal is one the runtime emits (and the code
that emits it says so), every config key is a key of the config, every detector kind is built."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl_cli.runtime.observe import keys
from agentrl_cli.acceptance.troubleshoot import signals
from agentrl_cli.acceptance.troubleshoot.detectors import DETECTORS
from agentrl_cli.acceptance.troubleshoot.knowledge import load_knowledge_base

ROOT = Path(__file__).resolve().parents[2]
SIGNAL_IN_TEXT = re.compile(r"\b(?:train|reward|rollout|perf|tool|env|data|sync|inference|eval|ckpt|comm|sandbox|storage|"
                            r"controlplane|cluster|observe|replay|time|traj|canary|verify|watchdog)/[a-z_<>]*[a-z_>]")


def _source(*parts: str) -> str:
    return (ROOT.joinpath(*parts)).read_text(encoding="utf-8")


def test_every_signal_named_by_an_entry_is_emitted():
    kb = load_knowledge_base()
    unknown = [(e.id, s) for e in kb.entries for s in e.signals if s not in signals.ALL]
    assert not unknown, f"signals no code emits: {unknown}"
    in_text = [(e.id, m) for e in kb.entries for item in (*e.causes, *e.checks, *e.actions)
               for m in SIGNAL_IN_TEXT.findall(item.en + " " + item.zh) if m not in signals.ALL]
    assert not in_text, f"signals named in entry texts that no code emits: {in_text}"


def _named_in_keys() -> tuple[dict[str, str], dict[str, str]]:
    """keys.py's constants by value, and its key-building functions by the template they build
    (each parameter as `<name>`, `h` as `<harness>`)."""
    import inspect

    constants = {v: n for n, v in vars(keys).items() if isinstance(v, str) and n.isupper()}
    functions = {}
    for n, f in vars(keys).items():
        if inspect.isfunction(f) and f.__module__ == keys.__name__:
            params = list(inspect.signature(f).parameters)
            if params and all(p not in ("key", "row") for p in params):
                functions[f(*(f"<{'harness' if p == 'h' else p}>" for p in params))] = n
    return constants, functions


def _written(name: str, writers: str) -> bool:
    """Whether the writers' source writes metric `name`: as a literal, an f-string, or through the
    keys.py constant or function that names it (keys.py itself is not a writer)."""
    constants, functions = _named_in_keys()
    group, key = name.split("/", 1)
    template = re.sub(r"<(\w+)>", r"{\1}", name.replace("<harness>", "{h}"))
    return bool(f'"{name}"' in writers or f'"{key}"' in writers or f'f"{template}"' in writers
                or f'f"{template.replace("{h}", "{n}")}"' in writers
                or (name in constants and re.search(rf"\b{constants[name]}\b", writers))
                or (name in functions and re.search(rf"\.{functions[name]}\(", writers))
                or (group == "rollout" and key in keys.ROLLOUT_COUNTERS and "ROLLOUT_COUNTERS" in writers))


def test_the_signal_registry_matches_the_code_that_writes_each_signal():
    writers = _source("agentrl_cli", "run", "training_run.py") + _source("agentrl_cli", "runtime", "rollout", "harness_errors.py") + "".join(p.read_text(encoding="utf-8")
                                                         for d in ("runtime/observe", "run/loop", "weightsync", "engines/gateway")
                                                         for p in sorted((ROOT / "agentrl_cli" / d).glob("*.py"))
                                                         if p.name != "keys.py")
    learner = _source("agentrl_cli", "learner", "policy_rank.py")  # the step every trainer backend runs
    assert not any(_written(name, "") for name in signals.METRICS)  # naming a key in keys.py writes nothing
    for name in signals.METRICS:
        group, key = name.split("/", 1)
        if group == "train":  # the learner's train_step returns the key; the run prefixes it with train/
            assert f'"{key}"' in learner or f"{key}=" in learner, name
        else:
            assert _written(name, writers), name
    stage0 = _source("agentrl_cli", "acceptance", "baseline.py") + _source("agentrl_cli", "acceptance", "verify", "server_load.py")
    for name, path in signals.BASELINE.items():
        assert f'"{path[0]}"' in stage0, name
    detectors = _source("agentrl_cli", "acceptance", "troubleshoot", "detectors.py")
    for name in signals.DERIVED:
        assert f'"{name}"' in detectors, name


def test_every_config_key_named_by_an_entry_exists():
    from agentrl_cli.config.explain import describe_keys

    known = {row[0] for row in describe_keys()}
    known |= {k.rsplit(".", 1)[0].removesuffix("[]") for k in known}  # a section or list names its keys
    bad = [(e.id, key) for e in load_knowledge_base().entries for key in e.config_keys if key not in known]
    assert not bad, f"config keys that do not exist: {bad}"
    in_text = re.compile(r"\b(?:model|inference|rollout|harnesses\[\]|sandbox|reward|training|data|observe|controlplane|cluster|"
                         r"stages|verify)\.[a-z_]+(?:\.[a-z_]+)?\b")
    bad = [(e.id, m) for e in load_knowledge_base().entries for item in (*e.causes, *e.checks, *e.actions)
           for m in in_text.findall(item.en) if m not in known]
    assert not bad, f"config keys named in entry texts that do not exist: {bad}"


def test_every_detector_kind_is_built_and_every_threshold_is_a_number():
    for e in load_knowledge_base().entries:
        for spec in e.detectors:
            assert spec["kind"] in DETECTORS, (e.id, spec)
            assert all(isinstance(v, (int, float)) or k in ("kind", "match") for k, v in spec.items()), (e.id, spec)


def test_troubleshoot_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; import agentrl_cli.cli.commands.troubleshoot, agentrl_cli.acceptance.troubleshoot.diagnose; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
