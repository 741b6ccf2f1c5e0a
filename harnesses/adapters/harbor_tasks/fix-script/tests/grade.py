"""Grades fix-script with partial credit and prints the reward.

0.5  `python3 sum_numbers.py` prints `total: 108` (the given numbers.txt)
0.5  `python3 sum_numbers.py /tests/hidden_numbers.txt` prints `total: 346` (a file the agent never
     saw: a hard-coded print does not pass)
"""

import subprocess
import sys


def prints(args: list[str], expected: str) -> bool:
    try:
        out = subprocess.run([sys.executable, "sum_numbers.py", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == expected


print(0.5 * prints([], "total: 108") + 0.5 * prints(["/tests/hidden_numbers.txt"], "total: 346"))
