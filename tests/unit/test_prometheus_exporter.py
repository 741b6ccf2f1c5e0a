"""The Prometheus exporter serves the newest value of every numeric metrics key, named by namespace
with the harness, tool, status and component as labels; a busy port is a config error naming the key."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.runtime.observe.prometheus import PrometheusExporter, series


def test_keys_map_to_metric_names_and_labels():
    assert series("train/loss") == ("agentrl_train_loss", {})
    assert series("env/terminal_like/step_ms_p99") == ("agentrl_env_step_ms_p99", {"harness": "terminal_like"})
    assert series("env/terminal_like/tool/bash/timeout") == (
        "agentrl_env_tool_calls", {"harness": "terminal_like", "tool": "bash", "status": "timeout"})
    assert series("env/h/create_failures/OSError") == ("agentrl_env_create_failures", {"harness": "h", "error": "OSError"})
    assert series("watchdog/stuck{trainer}") == ("agentrl_watchdog_stuck", {"component": "trainer"})
    assert series("eval/tool_api_like/success_rate") == ("agentrl_eval_success_rate", {"harness": "tool_api_like"})
    assert series("gateway/malformed_tool_calls") == ("agentrl_gateway_malformed_tool_calls", {})
    assert series("gateway/agent/malformed_tool_calls") == ("agentrl_gateway_harness_malformed_tool_calls", {"harness": "agent"})


def test_endpoint_serves_the_newest_row_and_skips_lists_and_nulls():
    exporter = PrometheusExporter(0, "127.0.0.1", run_id="r1")
    try:
        exporter.update({"step": 1, "train/loss": 0.5, "reward/mean": None, "env/h/step_ms_samples": [1.0, 2.0],
                         "env/h/tool/bash/ok": 3})
        exporter.update({"step": 2, "train/loss": 0.25})
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as r:
            page = r.read().decode()
    finally:
        exporter.close()
    assert 'agentrl_train_loss{run_id="r1"} 0.25' in page
    assert 'agentrl_step{run_id="r1"} 2.0' in page
    assert 'agentrl_env_tool_calls{harness="h",run_id="r1",status="ok",tool="bash"} 3.0' in page
    assert "reward_mean" not in page and "samples" not in page


def test_a_busy_port_is_a_config_error_naming_the_key():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(AgentrlError) as info:
            PrometheusExporter(busy.getsockname()[1], "127.0.0.1")
    assert "observe.prometheus_port" in info.value.hint
