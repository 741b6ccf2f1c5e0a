"""An agent written with the openai SDK as its author wrote it: it never imports agentrl. Two turns:
the model may call a local Python tool (count the characters of a draft); otherwise it is asked
for its final answer. Its last reply is the answer (docs/agents.md, "Train an existing agent")."""

import json

import openai

TOOLS = [{"type": "function", "function": {
    "name": "count_characters", "description": "Count the characters of a text.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]


def count_characters(text: str) -> str:
    return str(len(text))


async def run(task: dict, base_url: str, api_key: str) -> str:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages = [{"role": "user", "content": task["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=16)
        message = reply.choices[0].message
        messages.append(message)
        for call in message.tool_calls or []:
            text = json.loads(call.function.arguments or "{}").get("text", "")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": count_characters(str(text))})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Your final answer, briefly:"})
    await client.close()
    return message.content or ""
