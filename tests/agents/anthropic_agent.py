"""An agent written with the anthropic SDK as its author wrote it: it never imports agentrl. Two turns
of a tool loop over the Messages API: the model may call a local Python tool (count the characters
of a draft), whose result goes back as a `tool_result` block; otherwise it is asked for its final
answer. Its last reply's text is the answer (docs/agents.md, "Agents that speak the Messages API").
The SDK's base URL is the session's without `/v1` (the SDK adds `/v1/messages`)."""

import anthropic

TOOLS = [{"name": "count_characters", "description": "Count the characters of a text.",
          "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]


def count_characters(text: str) -> str:
    return str(len(text))


async def run(task: dict, base_url: str, api_key: str) -> str:
    client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key)
    messages = [{"role": "user", "content": task["prompt"]}]
    for _ in range(2):
        reply = await client.messages.create(model="policy", max_tokens=16, messages=messages, tools=TOOLS)
        messages.append({"role": "assistant", "content": reply.content})
        results = [{"type": "tool_result", "tool_use_id": block.id,
                    "content": count_characters(str(block.input.get("text", "")))}
                   for block in reply.content if block.type == "tool_use"]
        messages.append({"role": "user", "content": results or "Your final answer, briefly:"})
    await client.close()
    return "".join(block.text for block in reply.content if block.type == "text")
