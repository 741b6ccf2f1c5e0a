"""What a run is configured with takes effect: two embedded servers share one run's load; a keyed
server accepts the run's requests (`inference.api_key`); training episodes take their sandboxes from
per-harness warm pools that leave nothing behind; environment service levels reach metrics.jsonl."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agentrl_cli.config import load_config
from agentrl_cli.run.training_run import TrainingRun
from tests.integration.test_supervisor import free_ports
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]


def config(tmp_path, model, **extra):
    # replica i serves on inference.port + i: two consecutive free ports, not one
    sets = {"inference.port": free_ports(2), "inference.max_new_tokens": 8, "rollout.concurrency": 4,
            "rollout.group_size": 2, "rollout.max_steps_per_trajectory": 2, "rollout.mode": "sync",
            "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100, "data.root": str(tmp_path / "store"),
            "model.path": str(model), "sandbox.pool_size": 2, **extra}
    return load_config(None, [f"{k}={v}" for k, v in sets.items()] + ['harnesses=[{"name": "terminal_like"}]'], env={}).config


def test_two_keyed_servers_share_a_run_and_its_pools_leave_nothing(tmp_path, random_model_dir):
    cfg = config(tmp_path, random_model_dir, **{"inference.replicas": 2, "inference.api_key": "s3cret-key"})

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="wiring")
        try:
            await run.start()
            summary = await run.run(2)
            async with httpx.AsyncClient() as http:
                info = [(await http.get(u + "/server_info", headers=run.client.headers)).json() for u in run.client.urls]
                refused = (await http.post(run.client.urls[0] + "/generate", json={"input_ids": [1, 2]})).status_code
            return run, summary, info, refused
        finally:
            await run.close()
    run, summary, info, refused = asyncio.run(go())
    assert summary.steps == 2 and len(info) == 2
    busy = [i["internal_states"][0]["busy_seconds_total"] for i in info]
    assert all(b > 0 for b in busy), busy  # both servers generated for the run
    assert refused == 401  # the servers do require the key the run sent
    assert summary.counters["sandbox/terminal_like/acquired"] > 0
    assert summary.counters["sandbox/terminal_like/warm_hits"] > 0
    assert run.sandbox_leaks == {"sandbox/leaked_processes": 0, "sandbox/leftover_dirs": 0}
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env/terminal_like/create_ms_p50"] > 0 and rows[-1]["env/terminal_like/step_ms_p50"] > 0
    assert rows[-1]["sandbox/terminal_like/acquire_ms_p50"] is not None
