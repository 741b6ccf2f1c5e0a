"""Tool calls for harnesses: one caller with the layered retry policy and circuit breakers
(`caller.py`), the call log indexed by run, episode and step (`calllog.py`), and adapters that turn
an API into a tool function (`http.py`). Tool implementations themselves live with their harness."""

from agentrl_cli.envs.tools.calllog import CallLog
from agentrl_cli.envs.tools.caller import (CircuitBreaker, InvalidToolCall, PermanentToolError, RateLimited,
                                      ToolCaller, ToolError, ToolResult, ToolSpec, ToolTimeout,
                                      TransientToolError, backoff_delay, is_empty)
from agentrl_cli.envs.tools.http import HttpTool, http_tool

__all__ = ["CallLog", "CircuitBreaker", "HttpTool", "InvalidToolCall", "PermanentToolError", "RateLimited",
           "ToolCaller", "ToolError", "ToolResult", "ToolSpec", "ToolTimeout", "TransientToolError",
           "backoff_delay", "http_tool", "is_empty"]
