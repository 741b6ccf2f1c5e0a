"""CLI startup benchmark: `agentrl --help` (the real console script) against `python -c pass` with the
same interpreter, measured side by side, median of N runs each. Target (issue 20): `agentrl --help`
median under 0.5 s, and neither `--help` nor `troubleshoot --help` imports torch, DeepSpeed or
transformers.

    python benchmarks/cli_startup.py [--json] [--n 5]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import figure, median, parser, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "deepspeed", "transformers")
PROBE = ("import sys; sys.argv = {argv!r}\nfrom agentrl_cli.cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
         "print(','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)")


def console_script() -> Path:
    script = Path(sys.executable).parent / "agentrl"
    return script if script.exists() else ROOT / ".venv" / "bin" / "agentrl"


def timed(cmd: list[str], n: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, of the child) of `n` runs of `cmd`."""
    wall, cpu = [], []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def heavy_imports(argv: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], capture_output=True, text=True)
    return [m for m in done.stderr.strip().splitlines()[-1].split(",") if m] if done.stderr.strip() else []


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=5, help="runs of each command")
    args = p.parse_args()
    help_s, help_cpu, pass_s, pass_cpu = [], [], [], []
    for _ in range(args.n):  # interleaved, so both see the same load on the machine
        wall, cpu = timed([str(console_script()), "--help"], 1)
        help_s, help_cpu = help_s + wall, help_cpu + cpu
        wall, cpu = timed([sys.executable, "-c", "pass"], 1)
        pass_s, pass_cpu = pass_s + wall, pass_cpu + cpu
    h, b = median(help_s), median(pass_s)
    load1 = os.getloadavg()[0]
    heavy_help = heavy_imports(["agentrl", "--help"])
    heavy_ts = heavy_imports(["agentrl", "troubleshoot", "--help"])
    figures = {
        "help_median_s": figure(h, "s", "< 0.5", h < 0.5),
        "help_cpu_median_s": figure(median(help_cpu), "s"),
        "python_pass_median_s": figure(b, "s"),
        "python_pass_cpu_median_s": figure(median(pass_cpu), "s"),
        "load_average_1m": figure(load1, "runnable"),
        "help_over_bare_python": figure(h / b if b else float("nan"), "x"),
        "help_heavy_imports": figure(",".join(heavy_help) or "none", "modules", "none", not heavy_help),
        "troubleshoot_help_heavy_imports": figure(",".join(heavy_ts) or "none", "modules", "none", not heavy_ts),
    }
    return report(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
