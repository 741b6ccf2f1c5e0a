"""The configured harnesses checked at load, before any server starts: each class against the
contract, its reward source, its roles' seats (`harnesses[].roles`: `multi_agent.seats`), and the options its `task_set(options)` reads (NotFoundError or
ConfigError: exit 2, naming what is wrong)."""

from __future__ import annotations

import inspect

from harnesses.base import CONTRACT_VERSION
from harnesses.multi_agent import require_harness_reward, seats
from harnesses.registry import resolve, reward_source
from harnesses.task_sources import task_set


def check_configured(platform_config) -> dict[str, str]:
    """name -> the contract version each configured harness was checked against."""
    for h in platform_config.harnesses:
        source = reward_source(h)
        cls = resolve(h.name)
        if seats(cls, h.roles, h.name):
            require_harness_reward(h.name, source)
        own = getattr(cls, "task_set", None)
        if own is not None and not h.tasks and inspect.signature(own).parameters:
            task_set(h, platform_config.data)  # an adapter's options are checked where its tasks are made
    return {h.name: CONTRACT_VERSION for h in platform_config.harnesses}
