"""Every command a hint, the knowledge base, a template, the README or the documentation names exists:
each `agentrl <command> [<subcommand>]` written in those files resolves in the command table
(`agentrl_cli.cli.app.COMMANDS` and each group's own subcommands).

The README and the documentation pages (docs/*.md, the MkDocs site) are held to more: a command in a
fenced shell block is a command even without backticks, and every option (`--phase`, `-k`) that a
documented invocation passes, in a shell block or in a backticked `agentrl ...` span, is an option
of the command it names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from agentrl_cli.cli.app import COMMANDS, load_command

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("agentrl_cli", "stages", "harnesses", "templates", "docs", "benchmarks")
SUFFIXES = (".py", ".yaml", ".yml", ".md", ".txt")
REFERENCE = re.compile(r"(`?)agentrl((?: [a-z][a-z0-9-]*){1,2})")
# Words that follow a group's name in prose ("agentrl runs them", "an agentrl config override"),
# never a subcommand.
PROSE = {"in", "as", "served", "service", "them", "the", "it", "override"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SHELL = {"bash", "sh", "shell", "console", "zsh"}
SPAN = re.compile(r"`(agentrl [^`]+)`")


def _tree() -> dict[str, set[str] | None]:
    out = {}
    for name, (_, _, kind, _) in COMMANDS.items():
        out[name] = set(load_command(name).commands) if kind == "group" else None
    return out


def _doc_pages() -> list[Path]:
    """The README and every page of the documentation site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _files() -> list[Path]:
    found = [p for d in SOURCES for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and ".venv" not in p.parts]
    return found + [p for p in _doc_pages() if p not in found]


def _lines(path: Path):
    """(line number, line, whether it sits in a fenced shell block) for every line of `path`."""
    fence = None  # the open fence's language, or None outside a fence
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="ignore").splitlines(), 1):
        m = FENCE.match(line) if path.suffix == ".md" else None
        if m:
            fence = None if fence is not None else m.group(2).lower()
            continue
        yield number, line, fence in SHELL


def test_every_named_command_exists():
    tree = _tree()
    missing = []
    for path in _files():
        for number, line, shell in _lines(path):
            for match in REFERENCE.finditer(line):
                quoted, words = bool(match.group(1)) or shell, match.group(2).split()
                where = f"{path.relative_to(ROOT)}:{number}: {match.group(0).strip('`')}"
                if words[0] not in tree:
                    if quoted:  # a command in backticks or a shell block; bare prose ("agentrl writes ...") is not one
                        missing.append(where)
                    continue
                subs = tree[words[0]]
                if subs is not None and len(words) > 1 and words[1] not in subs and (quoted or words[1] not in PROSE):
                    missing.append(where)
    assert not missing, "commands named that do not exist:\n" + "\n".join(missing)


def test_the_docs_are_scanned():
    """Moving text from the README into docs/ never takes it out of the check."""
    scanned = set(_files())
    pages = _doc_pages()
    assert len(pages) > 10 and all(p in scanned for p in pages)


def test_the_check_catches_a_missing_subcommand():
    tree = _tree()
    assert "doctor" not in tree["sandbox"] and "check" in tree["sandbox"]
    assert REFERENCE.search("run `agentrl sandbox doctor`").group(2).split() == ["sandbox", "doctor"]


# --- options of documented invocations ------------------------------------------------------------

def _options(command) -> set[str]:
    out = {"--help"}
    for param in command.params:
        out.update(o for o in (*param.opts, *getattr(param, "secondary_opts", ())) if o.startswith("-"))
    return out


def _resolve(words: list[str], cache: dict):
    """The Click commands `agentrl WORDS...` names (several for `image lock|render`), and the words
    left after them; None when the words name no command (test_every_named_command_exists says so)."""
    if not words or words[0] not in COMMANDS:
        return None
    if words[0] not in cache:
        cache[words[0]] = load_command(words[0])
    commands, rest = [cache[words[0]]], words[1:]
    while all(hasattr(c, "commands") for c in commands):  # a group (`run servers` is one inside one)
        if not rest:
            return None
        alternatives = rest[0].replace("\\|", "|").split("|")
        if not all(a in commands[0].commands for a in alternatives) or len(commands) > 1:
            return None
        commands, rest = [commands[0].commands[a] for a in alternatives], rest[1:]
    return commands, rest


def _bad_options(words: list[str], cache: dict) -> list[str]:
    resolved = _resolve(words, cache)
    if resolved is None:
        return []
    commands, rest = resolved
    known = set().union(*(_options(c) for c in commands))
    bad = []
    for token in rest:
        token = token.strip("[]…,;.")
        if token == "--":  # what follows is the job's own command line
            break
        if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", token) and token.split("=")[0] not in known:
            bad.append(token.split("=")[0])
    return bad


def _shell_invocations(path: Path):
    """(line, words after `agentrl`) of each agentrl invocation in the page's fenced shell blocks."""
    pending, start = "", 0
    for number, line, shell in _lines(path):
        if not shell:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text, pending = pending + line, ""
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError:
            tokens = text.split()
        segment: list[str] = []
        for token in [*tokens, "&&"]:
            if token in ("&&", "||", "|", ";"):
                names = [i for i, t in enumerate(segment) if t.rsplit("/", 1)[-1] == "agentrl"]
                if names:
                    yield start, segment[names[0] + 1:]
                segment = []
            else:
                segment.append(token)


def test_documented_options_exist():
    cache: dict = {}
    bad = []
    for path in _doc_pages():
        where = path.relative_to(ROOT)
        for number, words in _shell_invocations(path):
            bad += [f"{where}:{number}: agentrl {' '.join(words[:2])} {o}" for o in _bad_options(words, cache)]
        for number, line, shell in _lines(path):
            if shell:
                continue
            for span in SPAN.findall(line):
                words = span.split()[1:]
                bad += [f"{where}:{number}: agentrl {' '.join(words[:2])} {o}" for o in _bad_options(words, cache)]
    assert not bad, "options the docs pass that the command does not take:\n" + "\n".join(bad)


def test_the_option_check_catches_a_wrong_option():
    cache: dict = {}
    assert _bad_options(["stage", "run", "8", "--phase", "smoke"], cache) == []
    assert _bad_options(["stage", "run", "8", "--phases", "smoke"], cache) == ["--phases"]
    assert _bad_options(["image", "lock\\|render", "[--lock", "F]"], cache) == []
