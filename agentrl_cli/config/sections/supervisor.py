"""`supervisor`: restarts of a run's components. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations


from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class SupervisorConfig(Section):
    max_restarts: int = Field(3, ge=0, le=1000, description="Restarts of one component the run started (an inference server, the gateway) before the run stops, naming it, its last log lines and the fix; 0 = the first failure stops the run")
    backoff_s: float = Field(1.0, ge=0, le=600, description="Wait before a component's first restart; it doubles with each further restart of it (at most 60 s)")
