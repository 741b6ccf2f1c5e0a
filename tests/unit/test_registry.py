"""Harness registry: names, entry points, module:Class paths, unknown names listed, config wiring."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.errors import NotFoundError
from harnesses.registry import create, harness_version, registered, resolve
from harnesses.terminal_like import TerminalLike


def test_builtins_resolve_by_name_and_by_path():
    assert resolve("terminal_like") is TerminalLike
    assert resolve("harnesses.terminal_like:TerminalLike") is TerminalLike
    assert {"terminal_like", "code_sandbox_like", "tool_api_like"} <= set(registered())


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(NotFoundError) as info:
        resolve("browser_like")
    assert "terminal_like" in info.value.message and "entry-point" in info.value.hint


def test_bad_path_is_explained():
    with pytest.raises(NotFoundError) as info:
        resolve("harnesses.nope:Missing")
    assert "cannot be loaded" in info.value.message
    assert harness_version("browser_like").startswith("unavailable")


def test_create_wires_sandbox_limits_and_options_from_config():
    cfg = load_config(None, ["sandbox.wall_timeout_s=7", "rollout.step_timeout_seconds=9",
                             "harnesses.0.options={step_timeout_s: 3}"], env={}).config
    h = create("terminal_like", cfg)
    assert h.step_timeout_s == 3
    assert h._provider.settings.limits.wall_timeout_s == 7
    h2 = create("code_sandbox_like", cfg)
    assert h2.step_timeout_s == 9
