"""`image`: per-role images, their lock, builder and licence policy. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from agentrl_cli.config.sections.base import (Section)


LICENCES = ["Apache-2.0", "MIT", "MIT-0", "MIT-CMU", "BSD", "BSD-2-Clause", "BSD-3-Clause", "0BSD", "ISC", "PSF-2.0",
            "Python-2.0", "HPND", "MPL-2.0", "Zlib", "CC0-1.0", "BSL-1.0", "CNRI-Python", "Unlicense", "AFL",
            "LGPL-2.1-only", "LGPL-2.1-or-later", "LGPL-3.0-only", "LGPL-3.0-or-later"]


class ImageConfig(Section):
    lock_file: str = Field("agentrl.lock.json", description="Lock of exact versions per role: written by `agentrl image lock`, compared with the running environment by `image verify` and stage 2")
    roles: dict[str, list[str]] = Field(
        default_factory=lambda: {"base": ["torch"], "train": ["agentrl-cli", "deepspeed", "transformers", "safetensors"],
                                 "inference": ["agentrl-cli", "transformers", "safetensors"], "env": ["agentrl-cli", "pyseccomp"],
                                 "controlplane": ["agentrl-cli", "psycopg"]},
        description="Packages each image role is built from (their dependencies are locked too); base is under every role; the inference role adds sglang and sglang-router when inference.engine is sglang. The rendered manifests run train (trainer), inference (inference, gateway), env (sandbox, reward) and controlplane")
    allowed_licences: list[str] = Field(default_factory=lambda: list(LICENCES), description="Licences (SPDX ids; * wildcards) a locked package may carry; any other is a failing check naming the package")
    licence_overrides: dict[str, str] = Field(default_factory=dict, description="package -> licence, for packages whose metadata states none (set after reading their terms)")
    builder: Literal["auto", "docker", "podman", "buildah"] = Field("auto", description="Image builder for `image build` and stage 2; auto = the first of docker, podman, buildah that works here")

    @field_validator("roles")
    @classmethod
    def _base_role(cls, roles: dict[str, list[str]]) -> dict[str, list[str]]:
        if "base" not in roles:
            raise ValueError("image.roles must have a base role (the packages under every role image)")
        return roles


# What the built-in tiny model needs to learn within minutes on a CPU: sync rollouts with fresh weights
# every step, groups of 8, 32 trajectories per step, a learning rate far above a large model's, a KL
# anchor to the warm start, and the learnability curriculum (see docs/training.md, "Stage 8 short").
