"""`inference.urls`: a run uses servers it did not start, waiting for them; one that never answers is
a clear error naming the key, within the startup deadline."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.hf_server import create_app
from agentrl_cli.engines.inference.launcher import InferenceUnavailable, launch
from agentrl_cli.core.serving import ServerThread
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_a_run_uses_servers_it_did_not_start(random_model_dir, tmp_path):
    engine = HFEngine(random_model_dir, batch_window_ms=5)
    srv = ServerThread(create_app(engine), name="hf").start()
    try:
        cfg = load_config(None, [f'inference.urls=["{srv.url}/"]'], env={}).config
        servers, urls = launch(cfg, str(random_model_dir), tmp_path)
        assert servers == [] and urls == [srv.url]
    finally:
        srv.stop()
        engine.close()


def test_an_unreachable_url_is_a_clear_error_within_the_deadline(random_model_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(None, [f'inference.urls=["{url}"]', "inference.startup_timeout_s=1"], env={}).config
    with pytest.raises(InferenceUnavailable, match="inference.urls not healthy within 1 s"):
        launch(cfg, str(random_model_dir), tmp_path)
