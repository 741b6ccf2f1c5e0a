"""An agent whose environment scores it: one call with the openai SDK, then its own judgement of
the reply (0.75 when at most 43 characters, else 0.25: partial credit either way) posted to the
session's reward endpoint, which the run trains on with `harnesses[].reward: harness`. It never
imports agentrl."""

import httpx
import openai


async def run(task: dict, base_url: str, api_key: str) -> str:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=16)
    answer = (reply.choices[0].message.content or "").strip()
    reward = 0.75 if 0 < len(answer) <= 43 else 0.25
    async with httpx.AsyncClient() as http:
        posted = await http.post(task["reward_url"], json={"reward": reward},
                                 headers={"Authorization": f"Bearer {task['reward_key']}"})
        posted.raise_for_status()
    return answer
