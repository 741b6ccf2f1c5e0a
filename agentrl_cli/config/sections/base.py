"""The base of every config section and the registered names sections validate against (read from
the registries' rows, `agentrl_cli/core/parts.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agentrl_cli.core import parts

BACKEND_NAMES = parts.names(parts.BACKENDS)
WEIGHT_SYNC_NAMES = parts.names(parts.TRANSPORTS)
ENGINE_NAMES = parts.names(parts.ENGINES)
REWARD_COMPONENTS = parts.names(parts.REWARD_TERMS)
VERIFIER_NAMES = parts.names(parts.VERIFIERS)


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
