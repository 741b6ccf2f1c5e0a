"""`KeptServers` (agentrl_cli/run/kept_servers.py) on a real embedded server: a running, answering
server is handed to the next run; one that died meanwhile is not (the run starts its own), and
`close` stops what is held."""

from __future__ import annotations

import os
import signal

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference.launcher import launch
from agentrl_cli.engines.registry import engine_for
from agentrl_cli.run.kept_servers import KeptServers
from tests.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path, random_model_dir):
    cfg = load_config(None, [f"inference.port={free_port()}"], env={}).config
    servers, urls = launch(cfg, str(random_model_dir), tmp_path / "logs")
    routes = engine_for(cfg).routes
    yield servers, urls, (routes.ready, routes.health)
    for s in servers:
        s.stop()


def test_a_running_server_is_handed_over_and_close_stops_it(server):
    servers, urls, routes = server
    kept = KeptServers()
    kept.hand_over(tuple(servers))
    assert kept.take(*routes) == (tuple(servers), urls)
    assert kept.take(*routes) is None  # taken once: the next run holds it now
    kept.hand_over(tuple(servers))
    kept.close()
    assert not servers[0].alive() and kept.servers == ()


def test_a_server_that_died_is_not_handed_over(server):
    servers, _, routes = server
    kept = KeptServers()
    kept.hand_over(tuple(servers))
    os.kill(servers[0].proc.pid, signal.SIGKILL)
    servers[0].proc.wait(timeout=30)
    assert kept.take(*routes) is None and kept.servers == ()
