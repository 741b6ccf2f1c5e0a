"""`gateway`: the recording gateway agent harnesses call. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations


from pydantic import Field, SecretStr

from agentrl_cli.config.sections.base import (Section)


class GatewayConfig(Section):
    """The recording gateway a training run starts for its agent harnesses (harnesses/agent)."""

    port: int = Field(0, ge=0, le=65535, description="Port of the run's gateway on 127.0.0.1 (0 = a free one; the agent sandboxes' allowlist gets it either way)")
    host: str = Field("127.0.0.1", description="Address `agentrl serve gateway` binds (loopback by default; the rendered gateway pod passes 0.0.0.0); a run's own gateway stays on 127.0.0.1")
    session_ttl_s: float = Field(600.0, gt=0, le=86_400, description="An agent session idle this long (no call in flight, none begun) expires; its episode ends without its record")
    retry_after_s: float = Field(1.0, gt=0, le=600, description="What a 429 (the run's staleness limit reached) asks an agent to wait before retrying (Retry-After; the openai SDK honours it)")
    api_key: SecretStr | None = Field(None, description="Bearer key(s) session management at `agentrl serve gateway` requires, one per line: the first is current, every one is accepted (rotation: `agentrl secrets rotate`); give it by AGENTRL_GATEWAY__API_KEY_FILE, never argv")
