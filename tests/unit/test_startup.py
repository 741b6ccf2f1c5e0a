"""Startup stays light: importing the CLI and rendering `--help` (root and troubleshoot) import no
torch, DeepSpeed or transformers; every lazily loaded command's listed help matches its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "deepspeed", "transformers")
PROBE = """import sys
sys.argv = {argv!r}
from agentrl_cli.cli.app import main
try:
    main()
except SystemExit:
    pass
print("HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def heavy_after(argv: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], capture_output=True, text=True,
                          timeout=120)
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


def test_importing_the_cli_imports_no_torch():
    done = subprocess.run([sys.executable, "-c", "import sys, agentrl_cli.cli.app; print(','.join(m for m in "
                           f"{HEAVY!r} if m in sys.modules))"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("argv", [["agentrl", "--help"], ["agentrl", "troubleshoot", "--help"],
                                  ["agentrl", "report", "--help"], ["agentrl", "troubleshoot", "loss is nan"]])
def test_help_and_troubleshoot_import_no_heavy_library(argv):
    assert heavy_after(argv) == []


def test_listed_help_matches_each_commands_own_help():
    from agentrl_cli.cli.app import COMMANDS, load_command

    for name, (_, _, _, listed) in COMMANDS.items():
        own = " ".join((load_command(name).help or "").split())
        assert own.startswith(listed[:40]), (name, listed, own[:200])  # the listing opens as the command's help does
