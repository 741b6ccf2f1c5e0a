"""Pick the trajectory store `data.store` names. Belongs here: the factory only."""

from __future__ import annotations

from typing import Any

from agentrl_cli.runtime.data.store import TrajectoryStore


def open_store(data_config: Any) -> TrajectoryStore:
    """The store `data.store` names: "local" (files under `data.root`) or "s3" (spooling under
    `data.root/spool`)."""
    if data_config.store == "local":
        from agentrl_cli.runtime.data.local_store import LocalStore

        return LocalStore(data_config.root)
    if data_config.store == "s3":
        from agentrl_cli.runtime.data.s3 import S3Store

        return S3Store.from_config(data_config)
    raise ValueError(f"data.store must be 'local' or 's3', got {data_config.store!r}")

