"""code_sandbox_like: write and run Python in a sandbox; graded by hidden unit tests.

Convention (its own): a fenced ```python block is run as `run_python` (Hermes `<tool_call>`
blocks calling `run_python` work too); the episode ends with a line `SUBMIT`. The agent writes
`solution.py`; grading copies only that file into a FRESH sandbox that holds no agent state and
calls the function there once per hidden test, comparing the JSON-decoded results on the host, so
editing or deleting test files, exiting early with status 0 or overriding `__eq__` cannot pass.
A visible `test_solution.py` is placed in the work directory; its hash is protected evidence, so
editing or deleting it is tampering (reward 0, flagged), and so is a test run that exits with
status 0 before the runner wrote its result (`sys.exit(0)` / `os._exit(0)` in the solution).

This folder is the whole plug-in: the class and its hooks here, its task families (`tasks.py`) and
its scripted solutions (`solutions.py`); its committed task set is `harnesses/tasksets/code_sandbox_like.jsonl`.
"""

from __future__ import annotations

import hashlib
import re

from harnesses.base import Action, Evidence, Observation, TaskSpec, ToolCall, Trajectory
from harnesses.builtin import CommittedTasks
from harnesses.code_sandbox_like import solutions
from harnesses.code_sandbox_like.tasks import FAMILIES
from harnesses.hidden_tests import run_hidden_tests, tampered
from harnesses.parsing import action_calls, parse_fenced
from harnesses.sandboxed import SandboxHarness, exec_observation, function_tool

SYSTEM_PROMPT = """You write Python in /work. To run code, reply with a fenced block:
```python
print(1 + 1)
```
Save your answer as solution.py (for example with open("solution.py", "w")). When solution.py is
ready, reply with a line: SUBMIT"""

_SUBMIT = re.compile(r"(?:^|\n)\s*SUBMIT\s*$")


VISIBLE_TEST = ("# Visible check; the grader runs its own hidden tests in a fresh sandbox.\n"
                "from solution import solve\n\n\ndef test_solve_is_defined():\n    assert callable(solve)\n")
VISIBLE_TEST_PATH = "test_solution.py"
VISIBLE_TEST_SHA256 = hashlib.sha256(VISIBLE_TEST.encode()).hexdigest()


class CodeSandboxLike(CommittedTasks, SandboxHarness):
    name = "code_sandbox_like"
    version = "1.1"  # 1.1: visible test file, tamper and early-exit detection
    FAMILIES = FAMILIES
    SLIP = solutions.SLIP

    # -- optional hooks (harnesses.base) ------------------------------------------------------------
    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        return solutions.scripted_action(task, turn)

    @classmethod
    def terse_action(cls, task: TaskSpec, turn: int) -> str | None:
        """The solution written without echoing solution.py back (shorter, nothing to check it with)."""
        return solutions.scripted_action(task, turn, echo=False)

    @classmethod
    def slip_action(cls, task: TaskSpec, turn: int, echo: bool = True) -> str | None:
        return solutions.scripted_action(task, turn, echo=echo, filename="solve.py")

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return "```python\nopen('solution.py','w').write('def solve():\\n    return -1\\n')\n```\nSUBMIT"

    # -- contract -----------------------------------------------------------------------------------

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        return [function_tool("run_python", "Run a Python 3 program in the working directory and show its output.",
                              {"code": {"type": "string", "description": "the program"}}, ["code"])]

    def parse(self, action: Action) -> tuple[list[ToolCall], list[str], bool]:
        calls, errors = action_calls(action)
        calls = calls + [ToolCall("run_python", {"code": code}, f"fence_{i}") for i, code in enumerate(parse_fenced(action.text))]
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
        self._scored: Evidence | None = None
        obs = super().reset(task_spec)
        self.sandbox.write_file(VISIBLE_TEST_PATH, VISIBLE_TEST)
        return obs

    def evidence(self, trajectory: Trajectory) -> Evidence:
        if self.sandbox is None and getattr(self, "_scored", None) is not None:
            return self._scored  # the episode's sandbox went back when its hidden tests ran: what it held then
        return Evidence(files=self.collect_files(["solution.py", VISIBLE_TEST_PATH]),
                        protected={VISIBLE_TEST_PATH: VISIBLE_TEST_SHA256})

    def compute_reward(self, trajectory: Trajectory) -> float:
        """Fraction of the hidden tests passed by solution.py, run in a fresh sandbox; 0 when tampered.
        The episode's sandbox goes back to the pool first (its files read): an episode holding one
        sandbox while it waits for another would deadlock every episode once the pool's limit is reached."""
        tests = trajectory.task.meta.get("tests", [])
        if self.sandbox is None or not tests:
            return 0.0
        ev = self.evidence(trajectory)
        if tampered(ev.files, ev.protected) or ev.files.get("solution.py") is None:
            return 0.0
        self._scored = ev
        self._release()
        result = run_hidden_tests(self._provider, ev.files["solution.py"], tests, timeout_s=self.step_timeout_s)
        return 0.0 if result["early_exit"] else result["score"]
