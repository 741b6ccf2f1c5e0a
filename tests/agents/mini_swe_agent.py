"""mini-swe-agent (PyPI `mini-swe-agent`) as its authors ship it: `DefaultAgent` with its own
tool-calling config (`mini.yaml`) and `LitellmModel`, litellm's `openai/` provider pointed at the
gateway session (`api_base`, `api_key`). The one agentrl part is the environment its `bash` tool
runs in: `harnesses.agent.sandbox_env.SandboxEnvironment` over the episode's sandbox (the harness
option `sandbox: true` hands it in), so every command runs inside agentrl's sandbox, never on the
host. Its final answer is its submission (what it printed after COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT),
else its last reply's text, else its exit status (docs/agents.md, "mini-swe-agent").

    harnesses:
      - name: agent
        options: {entry: "tests.agents.mini_swe_agent:run", sandbox: true, tasks: brief}
"""

from __future__ import annotations

import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # its banner goes to stdout otherwise
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")  # a local model has no price
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")  # its own retries wait 4 s and more each
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches its price list from the web otherwise

import litellm  # noqa: E402
import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from harnesses.agent.sandbox_env import SandboxEnvironment  # noqa: E402

litellm.suppress_debug_info = True  # it prints a provider list to stdout on every error otherwise

# model calls per episode: mini.yaml's instructions take most of the built-in model's 2048-token context and
# each format error adds to the next prompt, so 2 calls fit (a real model with a long context would get more)
STEP_LIMIT = 2


def agent(task: dict, base_url: str, api_key: str, sandbox, *, step_limit: int = STEP_LIMIT,
          max_tokens: int = 32) -> DefaultAgent:
    """mini-swe-agent's DefaultAgent on the gateway session, its commands in `sandbox`."""
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    model = LitellmModel(**{**config["model"], "model_name": "openai/policy", "cost_tracking": "ignore_errors",
                            "model_kwargs": {**config["model"].get("model_kwargs", {}), "api_base": base_url,
                                             "api_key": api_key, "max_tokens": max_tokens}})
    env = SandboxEnvironment(sandbox, timeout=30, env=config.get("environment", {}).get("env"))
    settings = {k: v for k, v in config["agent"].items() if k != "mode"}  # `mode` is its interactive agent's
    return DefaultAgent(model, env, **{**settings, "step_limit": step_limit, "cost_limit": 0.0})


def last_reply(messages: list[dict]) -> str | None:
    """The text of the model's last reply (mini-swe-agent keeps each response, a refused one too, in `extra`)."""
    for m in reversed(messages):
        response = (m.get("extra") or {}).get("response")
        if isinstance(response, dict) and response.get("choices"):
            return (response["choices"][0].get("message") or {}).get("content")
    return None


def run(task: dict, base_url: str, api_key: str, sandbox) -> str:
    """Its submission when it submitted, else its last reply's text, else how it ended."""
    mini = agent(task, base_url, api_key, sandbox)
    result = mini.run(task["prompt"])
    return (result.get("submission") or "").strip() or last_reply(mini.messages) or str(result.get("exit_status") or "")
