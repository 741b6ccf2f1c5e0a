"""Anthropic's Messages API (`POST /v1/messages`) as a translation onto the OpenAI-compatible chat
path (`engines/openai_api`): a Messages request becomes a chat-completion body (`request`), the
served chat completion becomes a `message`, its event stream or its error object (`reply`; `live`
writes the stream as the tokens are generated), and `routes` mounts it on the embedded server (a
recording gateway mounts it per session in `engines/gateway/app.py`). One chat call either way, so a gateway records a Messages call exactly
as a chat completion: the same segments, splice and counters.
"""

from agentrl_cli.engines.messages_api.reply import chat_id, error_response, message_events, to_message
from agentrl_cli.engines.messages_api.request import to_chat
from agentrl_cli.engines.messages_api.routes import ApiKeyHeader, add_messages_routes, answer, api_key_as_bearer, live_answer

__all__ = ["ApiKeyHeader", "add_messages_routes", "answer", "api_key_as_bearer", "chat_id", "error_response",
           "live_answer", "message_events", "to_chat", "to_message"]
