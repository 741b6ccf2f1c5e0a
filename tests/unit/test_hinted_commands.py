"""Every command a hint, the knowledge base, a template or the README names exists: each
`agentrl <command> [<subcommand>]` written in those files resolves in the command table
(`agentrl_cli.cli.app.COMMANDS` and each group's own subcommands)."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl_cli.cli.app import COMMANDS, load_command

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agentrl_cli", "stages", "harnesses", "templates", "docs", "benchmarks")
SUFFIXES = (".py", ".yaml", ".yml", ".md", ".txt")
REFERENCE = re.compile(r"(`?)agentrl((?: [a-z][a-z0-9-]*){1,2})")
# Words that follow a group's name in prose ("agentrl runs them", "an agentrl config override"),
# never a subcommand.
PROSE = {"in", "as", "served", "service", "them", "the", "it", "override"}


def _tree() -> dict[str, set[str] | None]:
    out = {}
    for name, (_, _, kind, _) in COMMANDS.items():
        out[name] = set(load_command(name).commands) if kind == "group" else None
    return out


def _files() -> list[Path]:
    found = [p for d in SOURCES for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and ".venv" not in p.parts]
    return found + [ROOT / "README.md"]


def test_every_named_command_exists():
    tree = _tree()
    missing = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="ignore").splitlines(), 1):
            for match in REFERENCE.finditer(line):
                quoted, words = bool(match.group(1)), match.group(2).split()
                where = f"{path.relative_to(ROOT)}:{number}: {match.group(0).strip('`')}"
                if words[0] not in tree:
                    if quoted:  # a command in backticks; bare prose ("agentrl writes ...") is not one
                        missing.append(where)
                    continue
                subs = tree[words[0]]
                if subs is not None and len(words) > 1 and words[1] not in subs and (quoted or words[1] not in PROSE):
                    missing.append(where)
    assert not missing, "commands named that do not exist:\n" + "\n".join(missing)


def test_the_check_catches_a_missing_subcommand():
    tree = _tree()
    assert "doctor" not in tree["sandbox"] and "check" in tree["sandbox"]
    assert REFERENCE.search("run `agentrl sandbox doctor`").group(2).split() == ["sandbox", "doctor"]
