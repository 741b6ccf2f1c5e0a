"""Tables printed to a pipe stay whole: the installed `agentrl`, its stdout piped (not a terminal,
COLUMNS unset so rich would assume 80 columns), prints every key, value and title complete on one
line per row, so `agentrl config show --describe | grep training.lora` finds the row."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_cli.config.explain import describe_keys

pytestmark = pytest.mark.e2e

AGENTRL = shutil.which("agentrl", path=str(Path(sys.executable).parent)) or shutil.which("agentrl")


def piped(*args: str, cwd: Path) -> str:
    assert AGENTRL, "the agentrl console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_") and k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([AGENTRL, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def rows(stdout: str) -> list[list[str]]:
    """The cells of every table row (a line between │ borders)."""
    return [[c.strip() for c in line.strip("│ ").split("│")] for line in stdout.splitlines() if line.startswith("│")]


def row(stdout: str, *first_cells: str) -> list[str]:
    """The cells of the one table row that begins with `first_cells`."""
    found = [r for r in rows(stdout) if tuple(r[:len(first_cells)]) == first_cells]
    assert len(found) == 1, (first_cells, [r[0] for r in rows(stdout)][:20])
    return found[0]


def test_config_describe_keeps_keys_defaults_and_meanings_whole(tmp_path):
    stdout = piped("config", "show", "--describe", cwd=tmp_path)
    table = rows(stdout)  # the header row has ┃ borders
    assert table == [[key, allowed, repr(default), meaning] for key, allowed, meaning, default in describe_keys()]
    assert row(stdout, "training.lora.rank")[:3] == ["training.lora.rank", "an integer >= 1 and <= 1024", "8"]
    correction = row(stdout, "training.correction")
    assert correction[2] == "'none'"
    assert correction[3].endswith("mis/seq_mis dropped outside [mis_low, mis_high], decoupled (AReaL) dropped above is_cap")
    assert "reward.weights[name]" in row(stdout, "reward.verifiers")[3]  # a [name] in a value is text, not markup


def test_plan_tables_and_their_titles_stay_whole(tmp_path):
    stdout = piped("plan", cwd=tmp_path)
    assert not [cell for r in rows(stdout) for cell in r if cell.endswith("…")]
    title = next(line for line in stdout.splitlines() if line.startswith("resource plan:"))
    assert title.rstrip().endswith(" parameters")  # the title is one line, not wrapped at 80 columns
    memory = row(stdout, "training", "memory per rank")
    assert memory[3] == "GB" and memory[4].endswith("over the ranks")
    assert max(len(line) for line in stdout.splitlines()) > 80
