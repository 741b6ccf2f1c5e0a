"""Between agentrl's episode vocabulary and OpenEnv's: the tools a model is offered for an OpenEnv
environment, the calls a model turn asks for, and an observation rendered as text.

Conventions (the `openenv` adapter's; its docstring repeats them for a config author):
- Tools: an environment whose action is a plain Action model gets one tool, `step`, whose
  parameters are the action's JSON schema from the server's `/schema` (without `metadata`). An MCP
  environment (its action is the package's CallToolAction) gets its MCP tools instead.
- A model turn is, first match wins: the tool calls the chat renderer parsed (or Hermes
  `<tool_call>` blocks in its text); one JSON object as the whole reply (or in a ```json fence):
  `{"name": tool, "arguments": {...}}` is a call, any other object is the `step` action's fields;
  with a `text_field`, the plain text as that field of the `step` action. Anything else, or a
  malformed call, is an invalid action (nothing is sent).
- Rendering: the observation's fields as compact JSON with sorted keys (its `metadata` only when
  not empty; an MCP call's result as its `data`); the reward and done flag are not shown.

Belongs here: pure functions. Not here: the connection (`openenv.py`), the server (`openenv_local.py`).
"""

from __future__ import annotations

import json
import re

from harnesses.base import Action, ToolCall
from harnesses.parsing import action_calls

STEP_TOOL = "step"
_FENCED_JSON = re.compile(r"^```(?:json)?[ \t]*\n(.*?)```$", re.S)
MAX_OBSERVATION_CHARS = 4000


def is_mcp_schema(action_schema: dict) -> bool:
    """Whether the server's action model is an MCP call (CallToolAction) or the bare Action base."""
    props = action_schema.get("properties") or {}
    return {"tool_name", "arguments"} <= set(props) or action_schema.get("title") in ("CallToolAction", "ListToolsAction", "Action")


def step_tool(action_schema: dict) -> dict:
    """The `step` tool: the action's fields (without `metadata`) as its parameters."""
    props = {k: v for k, v in (action_schema.get("properties") or {}).items() if k != "metadata"}
    params = {"type": "object", "properties": props, "required": [r for r in action_schema.get("required", []) if r != "metadata"]}
    if action_schema.get("$defs"):
        params["$defs"] = action_schema["$defs"]
    what = action_schema.get("description") or f"the environment's {action_schema.get('title', 'action')}"
    return {"type": "function", "function": {"name": STEP_TOOL, "description": f"Take one step in the environment with {what}.",
                                             "parameters": params}}


def mcp_tool(tool) -> dict:
    """An MCP tool (openenv's `Tool`: name, description, input_schema) as a function tool."""
    params = dict(tool.input_schema or {"type": "object", "properties": {}})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or tool.name, "parameters": params}}


def planned_calls(action: Action, text_field: str | None) -> tuple[list[ToolCall], list[str]]:
    """The calls a model turn asks for, and why it asks for none (see the module docstring)."""
    calls, errors = action_calls(action)
    if calls or errors:
        return calls, errors
    text = action.text.strip()
    obj = _json_object(text)
    if obj is not None:
        if isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict) and len(obj) == 2:
            return [ToolCall(name=obj["name"], arguments=obj["arguments"])], []
        return [ToolCall(name=STEP_TOOL, arguments=obj)], []
    if text_field and text:
        return [ToolCall(name=STEP_TOOL, arguments={text_field: action.text})], []
    hint = f", or reply in plain text (sent as `{text_field}`)" if text_field else ""
    return [], ["no action found: call a tool with a <tool_call> block, or reply with the action as one JSON object" + hint]


def _json_object(text: str) -> dict | None:
    fenced = _FENCED_JSON.match(text)
    body = fenced.group(1).strip() if fenced else text
    if not body.startswith("{"):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def render(observation: dict) -> str:
    """An observation's fields as compact, sorted JSON (empty `metadata` left out), cut to a bound.
    An MCP call's observation shows the tool, its result's `data` (else the result) and the error message."""
    shown = {k: v for k, v in observation.items() if not (k == "metadata" and not v)}
    if "tool_name" in shown and "result" in shown:
        result, error = shown.pop("result"), shown.pop("error", None)
        shown["result"] = result.get("data", result) if isinstance(result, dict) else result
        if error:
            shown["error"] = error.get("message", error) if isinstance(error, dict) else error
    text = json.dumps(shown, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= MAX_OBSERVATION_CHARS else text[:MAX_OBSERVATION_CHARS - 40] + f"... [{len(text)} characters]"


def server_error_code(exc: BaseException) -> str | None:
    """The code of an error frame the package's client raised as RuntimeError("Server error: ... (code: X)")."""
    m = re.search(r"\(code: ([A-Z_]+)\)\s*$", str(exc))
    return m.group(1) if m and str(exc).startswith("Server error:") else None
