"""The OpenAI-compatible API (SGLang's `/v1/chat/completions`, `/v1/completions`, `/v1/models`)
over any `Backend` that serves token ids: the embedded engine (`EngineBackend`, mounted by
`engines/inference/hf_server.py`) or a recording gateway's client of the run's servers.

Modules: `base` (the seam's types), `protocol` (request validation, SGLang sampling params),
`render` (messages and tools -> prompt ids with the model's chat template), `parse` (generated
text -> content and tool calls), `responses` (response objects, events, log-probs), `service` (the
calls), `live` (a streamed call written as its tokens are generated), `engine_backend` (the embedded
engine as a Backend), `routes` (FastAPI endpoints); the
Responses API as a translation onto the chat call: `responses_api` (validation, input items ->
messages), `responses_out` (Response objects, events), `responses_store` (kept responses, the path
of one `POST /v1/responses`), `responses_live` (a streamed response written as its tokens are generated). No app of its own; imports only `engines/inference/` and `model/` pieces (and the harnesses' tool-call parser).
"""

from agentrl_cli.engines.openai_api.base import Backend, ChatCall, Completion, OpenAIError
from agentrl_cli.engines.openai_api.engine_backend import EngineBackend
from agentrl_cli.engines.openai_api.routes import add_openai_routes
from agentrl_cli.engines.openai_api.service import chat_completion, chat_stream, completion_stream, text_completion

__all__ = ["Backend", "ChatCall", "Completion", "EngineBackend", "OpenAIError", "add_openai_routes", "chat_completion",
           "chat_stream", "completion_stream", "text_completion"]
