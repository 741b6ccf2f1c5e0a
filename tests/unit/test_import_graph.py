"""The import graph of agentrl_cli, stages and harnesses: no cycles, and dependencies point down.

Every import counts, function-level ones included (a lazy import is still a dependency).
`agentrl_cli/` is grouped into wings (WINGS, top to bottom): a module of one wing imports only its
own wing and the wings below it. The plug-in harnesses (`harnesses/`) never import the learner, the
run or anything above them.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentrl_cli", "stages", "harnesses")
WINGS = ("cli", "acceptance", "run", "weightsync", "learner", "ops", "runtime", "engines", "model", "envs", "config", "core")
# Modules of the package itself, outside every wing: the entry point, the version and the old paths' aliases.
OUTSIDE = ("agentrl_cli", "agentrl_cli.__main__", "agentrl_cli._moved")
LOW_ROOMS = ("harnesses",)
HIGH = ("agentrl_cli.learner", "agentrl_cli.run", "agentrl_cli.weightsync", "agentrl_cli.acceptance", "agentrl_cli.cli")


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = f
    return found


def targets(mods: dict[str, Path], module: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            parts = parts if mods[module].name == "__init__.py" else parts[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = []
    for t in names:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t and t != module and not module.startswith(t + "."):
            out.append(t)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[m].update(targets(mods, m, node))
    return edges


def room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "agentrl_cli" and len(parts) > 1 else parts[0]


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "agentrl_cli" and len(parts) > 1 and parts[1] in WINGS else None


def up_the_wings(edges: dict[str, set[str]]) -> list[str]:
    """Imports from a wing to one above it (a lower index in WINGS)."""
    return sorted(f"{a} -> {b}" for a, deps in edges.items() for b in deps
                  if wing(a) and wing(b) and WINGS.index(wing(b)) < WINGS.index(wing(a)))


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in edges.items() for b in deps
                  if room(a) in LOW_ROOMS and any(b == h or b.startswith(h + ".") for h in HIGH))


def test_there_is_no_import_cycle():
    try:
        graphlib.TopologicalSorter(graph()).prepare()
    except graphlib.CycleError as exc:
        pytest.fail("import cycle: " + " -> ".join(exc.args[1]))


def test_no_lower_room_imports_the_learner_or_the_run():
    assert upward(graph()) == []


def test_every_module_of_the_package_sits_in_a_wing():
    assert sorted(m for m in modules() if m.startswith("agentrl_cli") and not wing(m) and m not in OUTSIDE) == []


def test_no_import_runs_from_a_wing_to_one_above_it():
    assert up_the_wings(graph()) == []


def test_the_checks_see_a_planted_cycle_and_a_planted_upward_import(tmp_path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for w in ("runtime", "run", "learner"):
        (tmp_path / "agentrl_cli" / w).mkdir()
        (tmp_path / "agentrl_cli" / w / "__init__.py").write_text("")
    (tmp_path / "agentrl_cli" / "runtime" / "a.py").write_text("def f():\n    from agentrl_cli.run.b import x\n")
    (tmp_path / "agentrl_cli" / "run" / "b.py").write_text("from agentrl_cli.runtime import a\n")
    (tmp_path / "harnesses" / "h.py").write_text("import agentrl_cli.learner\n")
    edges = graph(tmp_path)
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(edges).prepare()
    assert up_the_wings(edges) == ["agentrl_cli.runtime.a -> agentrl_cli.run.b"]
    assert upward(edges) == ["harnesses.h -> agentrl_cli.learner"]
