"""The recording gateway: OpenAI-compatible sessions in front of the run's inference servers, for
agents that talk to a model through the OpenAI chat or Responses API (the openai SDK, LangGraph,
the OpenAI Agents SDK, coding agents). Each session's calls are recorded token-exact and stitched into
training samples.

Modules: `sessions` (ids, per-session keys, idle expiry), `splice` (the ids a call is generated
from: the token-exact continuation of the history), `record` (stitching; `SessionRecord`, the bridge
to training), `backend` (the Backend over the run's InferenceClient), `service` (`Gateway`: admission
under the run's limit, the chat path, rewards), `app` (HTTP). The command is `agentrl serve gateway`.

Importing this package loads neither FastAPI nor the inference client; import the modules.
"""

from __future__ import annotations

from agentrl_cli.engines.gateway.record import Rewards, Segment, SessionRecord, Step

__all__ = ["Rewards", "Segment", "SessionRecord", "Step"]
