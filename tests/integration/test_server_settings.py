"""Stage 4's settings comparison against a real embedded server (`agentrl serve inference --engine hf`,
started by the launcher on 127.0.0.1, random tiny model): a server started with another context
length than the config's fails the check naming `context_length`, both values and the key; the
same server passes against the config it was started from."""

from __future__ import annotations

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.engines.inference.launcher import launch
from agentrl_cli.engines.settings import settings_check
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_a_server_reporting_another_context_length_fails_naming_it_and_the_config_it_came_from_passes(tmp_path,
                                                                                                        random_model_dir):
    sets = [f"model.path={random_model_dir}", f"inference.port={free_port()}", "inference.cpu_threads=1",
            "inference.enable_metrics=false"]  # not the default: the launch must hand it to the server
    started_from = load_config(None, [*sets, "model.context_length=1024"], env={}).config
    servers, _ = launch(started_from, str(random_model_dir), tmp_path / "logs")  # polls readiness with a deadline
    try:
        assert servers and all(s.alive() for s in servers)
        other = load_config(None, [*sets, "model.context_length=2048"], env={}).config
        failed = settings_check(other)
        assert failed.status == CheckStatus.FAIL, failed
        assert "context_length: the server reports 1024, the config says 2048 (model.context_length)" in failed.detail
        assert [m for m in failed.measured["mismatches"] if "context_length" not in m] == []  # nothing else differs
        assert failed.hint
        passed = settings_check(started_from)
        assert passed.status == CheckStatus.PASS, passed
        assert passed.measured["servers"] == 1
        assert {"dtype", "context_length", "max_batch_size", "pp_size"} <= set(passed.measured["compared"])
    finally:
        for s in servers:
            s.stop()


def test_in_vllms_dialect_the_check_reads_vllms_server_info_and_names_max_model_len(tmp_path, random_model_dir):
    sets = [f"model.path={random_model_dir}", f"inference.port={free_port()}", "inference.cpu_threads=1",
            "inference.dialect=vllm"]
    started_from = load_config(None, [*sets, "model.context_length=1024"], env={}).config
    servers, _ = launch(started_from, str(random_model_dir), tmp_path / "logs")
    try:
        failed = settings_check(load_config(None, [*sets, "model.context_length=2048"], env={}).config)
        assert failed.status == CheckStatus.FAIL, failed
        assert "max_model_len: the server reports 1024, the config says 2048 (model.context_length)" in failed.detail
        passed = settings_check(started_from)
        assert passed.status == CheckStatus.PASS, passed
        assert {"dtype", "max_model_len", "max_num_seqs", "pipeline_parallel_size"} <= set(passed.measured["compared"])
    finally:
        for s in servers:
            s.stop()
