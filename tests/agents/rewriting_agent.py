"""An agent that rewrites its history (as agents that summarize or trim their context do): its
second call is a new conversation holding a summary of the first, streamed. The gateway records
two segments per episode, and the run trains each as a sample of its own. Written with the openai
SDK only."""

import openai


async def run(task: dict, base_url: str, api_key: str) -> str:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
    draft = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}], max_tokens=12)
    summary = f"{task['prompt']}\nA first draft was: {draft.choices[0].message.content or ''!r}. Improve it."
    final = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": summary}], max_tokens=12, stream=True)
    answer = "".join([chunk.choices[0].delta.content or "" async for chunk in final if chunk.choices])
    await client.close()
    return answer
