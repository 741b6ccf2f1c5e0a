"""An agent written with the OpenAI Agents SDK (`openai-agents`) as its author wrote it: it never
imports agentrl. One Agent with one function tool (count the characters of a text), run by
`Runner.run_streamed` over the Responses API (`OpenAIResponsesModel` on an `AsyncOpenAI` client
given the base URL and key it is handed), tracing off. Its answer is the final output; a reply the
model did not finish (the run caps each call at inference.max_new_tokens) makes the SDK raise (a
Response with status "incomplete", as against OpenAI), and then the answer is the text streamed
so far (docs/agents.md, "The OpenAI
Agents SDK")."""

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI

set_tracing_disabled(True)  # traces would go to OpenAI's platform


@function_tool
def count_characters(text: str) -> str:
    """Count the characters of a text."""
    return str(len(text))


async def run(task: dict, base_url: str, api_key: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    agent = Agent(name="brief", instructions="Answer briefly. You may count characters with the tool.",
                  tools=[count_characters], model=OpenAIResponsesModel(model="policy", openai_client=client))
    result = Runner.run_streamed(agent, task["prompt"], max_turns=3, run_config=RunConfig(tracing_disabled=True))
    streamed = ""
    try:
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.created":
                streamed = ""  # a new model turn
            elif event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                streamed += event.data.delta
    except (ModelBehaviorError, MaxTurnsExceeded):  # the reply was cut at max_tokens, or tools to the end
        return streamed
    finally:
        await client.close()
    return str(result.final_output or streamed)
