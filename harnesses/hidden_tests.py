"""Grading code against hidden tests, shared by the code harness (its own `compute_reward`) and the
reward service's `tests` verifier: the tamper check on protected files, and running each hidden test
in a FRESH sandbox that holds only the submitted `solution.py`, comparing results on the host.
"""

from __future__ import annotations

import hashlib
import json

RUNNER = ("import json, sys\nsys.path.insert(0, '/work' if len(sys.argv) < 3 else sys.argv[2])\n"
          "import solution\nresult = solution.solve(*json.loads(sys.argv[1]))\n"
          "sys.stdout.write('\\n@@RESULT@@' + json.dumps(result) + '\\n')\n")
RESULT_MARKER = "\n@@RESULT@@"


def tampered(files: dict[str, bytes | None], protected: dict[str, str]) -> list[str]:
    """Protected files edited or deleted (hash differs or file missing)."""
    return [p for p, digest in sorted(protected.items())
            if files.get(p) is None or hashlib.sha256(files[p]).hexdigest() != digest]


def run_hidden_tests(provider, source: bytes, tests: list[dict], timeout_s: float = 10.0) -> dict:
    """Run each hidden test against `source` in a fresh sandbox; compare results on the host. A pass
    needs the test's own id in the host-side report; `early_exit` names tests whose process ended
    with status 0 without the runner's result (the solution exited under the runner)."""
    fresh = provider.acquire()
    try:
        fresh.write_file("solution.py", source)
        work = "/work" if fresh.isolated else str(fresh.workdir)
        passed, early_exit = [], []
        for test in tests:
            r = fresh.exec(["python3", "-I", "-c", RUNNER, json.dumps(test["args"]), work], timeout=timeout_s)
            marker = r.stdout.rfind(RESULT_MARKER)
            ok = False
            if r.exit_code == 0 and marker < 0:
                early_exit.append(test["id"])
            if r.exit_code == 0 and marker >= 0:
                try:
                    ok = json.loads(r.stdout[marker + len(RESULT_MARKER):]) == test["expected"]
                except ValueError:
                    ok = False
            if ok:
                passed.append(test["id"])
        score = len(passed) / len(tests) if tests else 0.0
        return {"passed": passed, "total": len(tests), "score": score, "early_exit": early_exit}
    finally:
        provider.release(fresh)
