"""Harness registry: names, entry points, module:Class paths, unknown names listed, config wiring."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import NotFoundError
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


@pytest.fixture
def fresh_registry():
    from harnesses import registry

    registry._registered.cache_clear()
    yield registry
    registry._registered.cache_clear()


def test_entry_points_register_a_harness_and_are_read_once_per_process(tmp_path, monkeypatch, fresh_registry):
    (tmp_path / "demo_harness.py").write_text("from harnesses.terminal_like import TerminalLike\n\n"
                                              "class Demo(TerminalLike):\n    name = 'demo_entry'\n")
    dist = tmp_path / "demo_harness-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-harness\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentrl.harnesses]\ndemo_entry = demo_harness:Demo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve("demo_entry").__name__ == "Demo"
    assert registered()["demo_entry"] == "demo_harness:Demo"
    registered().clear()  # a copy: the registry itself is untouched
    (dist / "entry_points.txt").unlink()  # read once: what was registered at the first read stays
    assert resolve("demo_entry").__name__ == "Demo"
