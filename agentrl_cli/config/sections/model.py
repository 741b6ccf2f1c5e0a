"""`model`: which policy model, its dtype, cache and context length. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class ModelConfig(Section):
    path: str = Field("builtin:tiny-agent", description="Hugging Face model directory, or builtin:tiny-agent for the built-in tiny model")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype for inference and training (float32 on CPU)")
    cache_dir: str = Field("~/.cache/agentrl", description="Where the built-in model and other artefacts are cached")
    context_length: int = Field(2048, ge=64, le=1_048_576, description="Maximum tokens of prompt plus completion")
