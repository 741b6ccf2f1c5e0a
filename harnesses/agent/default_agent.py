"""The agent the `agent` harness runs when it is given neither `options.entry` nor `options.command`:
one chat completion with the task's prompt, its reply the final answer. Standard library only (it
speaks the OpenAI HTTP API itself), so it runs wherever agentrl does; a real agent uses the openai
SDK or any OpenAI client the same way (docs/agents.md, "Train an existing agent")."""

from __future__ import annotations

import asyncio
import json
import urllib.request

SYSTEM = "Answer the question. End with a line `ANSWER: <answer>`."
MAX_TOKENS = 64


def _chat(base_url: str, api_key: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 - the run's own gateway (http on loopback)
        return json.loads(response.read())


async def run(task: dict, client_base_url: str, api_key: str) -> str:
    body = {"model": "policy", "max_tokens": MAX_TOKENS,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]}
    reply = await asyncio.to_thread(_chat, client_base_url, api_key, body)
    return reply["choices"][0]["message"].get("content") or ""
