"""code_sandbox_like: write and run Python in a sandbox; graded by hidden unit tests.

Convention (its own): a fenced ```python block is run as `run_python` (Hermes `<tool_call>`
blocks calling `run_python` work too); the episode ends with a line `SUBMIT`. The agent writes
`solution.py`; grading copies only that file into a FRESH sandbox that holds no agent state and
calls the function there once per hidden test, comparing the JSON-decoded results on the host, so
editing or deleting test files, exiting early with status 0 or overriding `__eq__` cannot pass.
A visible `test_solution.py` is placed in the work directory; its hash is protected evidence, so
editing or deleting it is tampering (reward 0, flagged), and so is a test run that exits with
status 0 before the runner wrote its result (`sys.exit(0)` / `os._exit(0)` in the solution).
"""

from __future__ import annotations

import hashlib
import json
import re

from harnesses.base import Action, Evidence, Observation, TaskSpec, ToolCall, Trajectory
from agentrl_cli.reward.verifiers import tampered
from harnesses.parsing import parse_fenced, parse_tool_calls
from harnesses.sandboxed import SandboxHarness, exec_observation, function_tool

SYSTEM_PROMPT = """You write Python in /work. To run code, reply with a fenced block:
```python
print(1 + 1)
```
Save your answer as solution.py (for example with open("solution.py", "w")). When solution.py is
ready, reply with a line: SUBMIT"""

_SUBMIT = re.compile(r"(?:^|\n)\s*SUBMIT\s*$")
RUNNER = ("import json, sys\nsys.path.insert(0, '/work' if len(sys.argv) < 3 else sys.argv[2])\n"
          "import solution\nresult = solution.solve(*json.loads(sys.argv[1]))\n"
          "sys.stdout.write('\\n@@RESULT@@' + json.dumps(result) + '\\n')\n")


VISIBLE_TEST = ("# Visible check; the grader runs its own hidden tests in a fresh sandbox.\n"
                "from solution import solve\n\n\ndef test_solve_is_defined():\n    assert callable(solve)\n")
VISIBLE_TEST_PATH = "test_solution.py"
VISIBLE_TEST_SHA256 = hashlib.sha256(VISIBLE_TEST.encode()).hexdigest()
RESULT_MARKER = "\n@@RESULT@@"


class CodeSandboxLike(SandboxHarness):
    name = "code_sandbox_like"
    version = "1.1"  # 1.1: visible test file, tamper and early-exit detection

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        return [function_tool("run_python", "Run a Python 3 program in the working directory and show its output.",
                              {"code": {"type": "string", "description": "the program"}}, ["code"])]

    def parse(self, action: Action) -> tuple[list[ToolCall], list[str], bool]:
        calls, errors = parse_tool_calls(action.text) if not action.tool_calls else (action.tool_calls, [])
        calls += [ToolCall("run_python", {"code": code}, f"fence_{i}") for i, code in enumerate(parse_fenced(action.text))]
        return calls, errors, bool(_SUBMIT.search(action.text))

    def no_action_hint(self) -> str:
        return "no code found; send a ```python block, or SUBMIT when solution.py is ready"

    def tool_run_python(self, arguments: dict) -> Observation:
        code = arguments["code"]
        if not isinstance(code, str) or not code.strip():
            raise ValueError("code must be a non-empty string")
        result = self.sandbox.exec(["python3", "-c", code], timeout=self.step_timeout_s)
        return exec_observation("$ python3 <code>", result)

    def reset(self, task_spec: TaskSpec) -> Observation:
        obs = super().reset(task_spec)
        self.sandbox.write_file(VISIBLE_TEST_PATH, VISIBLE_TEST)
        return obs

    def evidence(self, trajectory: Trajectory) -> Evidence:
        return Evidence(files=self.collect_files(["solution.py", VISIBLE_TEST_PATH]),
                        protected={VISIBLE_TEST_PATH: VISIBLE_TEST_SHA256})

    def compute_reward(self, trajectory: Trajectory) -> float:
        """Fraction of the hidden tests passed by solution.py, run in a fresh sandbox; 0 when tampered."""
        tests = trajectory.task.meta.get("tests", [])
        if self.sandbox is None or not tests:
            return 0.0
        ev = self.evidence(trajectory)
        if tampered(ev.files, ev.protected) or ev.files.get("solution.py") is None:
            return 0.0
        result = run_hidden_tests(self._provider, ev.files["solution.py"], tests, timeout_s=self.step_timeout_s)
        return 0.0 if result["early_exit"] else result["score"]


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
