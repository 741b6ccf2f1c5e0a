"""tool_api_like: a calculator/lookup HTTP API on loopback, reached only through the tool caller.

Convention: Hermes-style `<tool_call>` blocks; tools `calculator`, `lookup`, `list_keys`, and
`final_answer` to end the episode (it ends the episode and is no call of the API, so
`Observation.calls` holds the API calls only). The API runs as a loopback service (started by the harness
unless `service_url` is given) with configurable latency, failure rate and rate limits; every call
goes through `ToolCaller` (timeouts, layered retries, circuit breaker, explicit status, call log).

This folder is the whole plug-in: the class and its hooks here, its task families (`tasks.py`) and
its scripted solutions (`solutions.py`); its committed task set is `harnesses/tasksets/tool_api_like.jsonl`.
The API service itself is `harnesses.tool_service`.
"""

from __future__ import annotations

import itertools
import json

from agentrl_cli.core.httpclient import http_client
from agentrl_cli.envs.tools import CallLog, ToolCaller, ToolSpec, http_tool
from harnesses.base import Action, Evidence, Observation, TaskSpec, ToolCallResult, Trajectory
from harnesses.builtin import CommittedTasks
from harnesses.parsing import action_calls, answers_match, tool_call
from harnesses.sandboxed import clip, function_tool, worst
from harnesses.tool_api_like import solutions
from harnesses.tool_api_like.tasks import FAMILIES
from harnesses.tool_service import Faults, ToolService

SYSTEM_PROMPT = """You can call a calculator and a lookup API. Call a tool with
<tool_call>
{"name": "calculator", "arguments": {"expression": "2 + 3"}}
</tool_call>
Finish by calling final_answer with your answer."""

_episodes = itertools.count()


def all_tables() -> dict[str, dict]:
    return {t.meta["table"]: t.meta["rows"] for t in ToolApiLike.task_set().tasks if "table" in t.meta}


class ToolApiLike(CommittedTasks):
    name = "tool_api_like"
    version = "1.0"
    FAMILIES = FAMILIES

    # -- optional hooks (harnesses.base) ------------------------------------------------------------
    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        return solutions.scripted_action(task, turn)

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return tool_call("final_answer", answer=-1)

    # -- contract -----------------------------------------------------------------------------------

    def __init__(self, service_url: str | None = None, faults: Faults | None = None, timeout_s: float = 5.0,
                 call_log: CallLog | None = None, run_id: str = "") -> None:
        self._service = None
        if service_url is None:
            self._service = ToolService(all_tables(), faults=faults)
            self._service.start()
            service_url = self._service.url
        self.service_url = service_url.rstrip("/")
        self._client = http_client(timeout=timeout_s)
        self.call_log = call_log or CallLog()
        self.caller = ToolCaller(self.call_log)
        for name in ("calculator", "lookup", "list_keys"):
            self.caller.register(ToolSpec(name=name, timeout_s=timeout_s, idempotent=True),
                                 http_tool(f"{self.service_url}/tools/{name}", client=self._client))
        self.run_id = run_id
        self.task: TaskSpec | None = None
        self.episode_id = ""
        self.steps = 0
        self.answer = None

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tools(self) -> list[dict]:
        return [
            function_tool("calculator", "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
                          {"expression": {"type": "string"}}, ["expression"]),
            function_tool("lookup", "Look a key up in a table; returns {\"results\": [value]} or no results.",
                          {"table": {"type": "string"}, "key": {"type": "string"}}, ["table", "key"]),
            function_tool("list_keys", "List the keys of a table.", {"table": {"type": "string"}}, ["table"]),
            function_tool("final_answer", "Give the final answer and end the episode.", {"answer": {"type": ["number", "string"]}}, ["answer"]),
        ]

    def reset(self, task_spec: TaskSpec) -> Observation:
        self.task, self.answer, self.steps = task_spec, None, 0
        self.episode_id = f"{self.name}-{next(_episodes)}"
        return Observation(text=task_spec.prompt, data={"tools": [t["function"]["name"] for t in self.tools()]}, status="ok")

    def step(self, action: Action) -> Observation:
        if self.task is None:
            return Observation(text="no episode is running: reset first", status="invalid_action", done=True)
        self.steps += 1
        calls, errors = action_calls(action)
        if not calls:
            why = "; ".join(errors) if errors else "no tool call found; call a tool or final_answer"
            return Observation(text=f"invalid action: {why}", status="invalid_action")
        texts, statuses, results, done = [], [], [], False
        for call in calls:
            if call.name == "final_answer":
                if "answer" not in call.arguments:
                    texts.append("final_answer needs an answer")
                    statuses.append("invalid_action")
                    continue
                self.answer, done = call.arguments["answer"], True
                texts.append("answer recorded")
                statuses.append("ok")
                continue
            result = self.caller.call(call.name, call.arguments, run_id=self.run_id, episode_id=self.episode_id, step=self.steps)
            shown = json.dumps(result.output) if result.status in ("ok", "empty") else (result.error or result.status)
            texts.append(f"{call.name} -> {clip(shown, 1000)}" + (f" [{result.status}]" if result.status != "ok" else ""))
            statuses.append(result.status)
            results.append(ToolCallResult(name=result.tool, arguments=dict(call.arguments), status=result.status,
                                          latency_ms=result.latency_ms, retries=result.retries, output=texts[-1]))
        return Observation(text="\n".join(texts), status=worst(statuses), done=done, info={"parse_errors": errors},
                           calls=results)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        answered = self.answer is not None and trajectory.task.task_id == getattr(self.task, "task_id", None)
        return Evidence(final_answer=str(self.answer) if answered else None)

    def compute_reward(self, trajectory: Trajectory) -> float:
        if self.answer is None or trajectory.task.task_id != getattr(self.task, "task_id", None):
            return 0.0
        return 1.0 if answers_match(str(self.answer), trajectory.task.answer) else 0.0

    def full_reset(self) -> None:
        self.task, self.answer, self.steps = None, None, 0

    def close(self) -> None:
        self.full_reset()
        self.caller.close()
        self._client.close()
        if self._service is not None:
            self._service.stop()
            self._service = None
