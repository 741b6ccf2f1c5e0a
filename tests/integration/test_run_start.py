"""A run's start: the trainer is built while the inference servers start (`run/build.py`), so the two
overlap; the servers start, and restart, from the environment as it was before the trainer's thread
set its rendezvous variables, and a server that cannot start fails the run naming it, with the trainer that
was built meanwhile closed."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from agentrl_cli.engines.inference.launcher import InferenceUnavailable, relaunch, wait_healthy
from agentrl_cli.run.training_run import TrainingRun
from tests.integration.conftest import needs_bwrap
from tests.integration.test_run_wiring import config

pytestmark = [pytest.mark.integration, needs_bwrap]
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")  # what the in-process trainer sets (process_group.py)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


def test_the_servers_start_without_the_trainers_rendezvous_variables(tmp_path, random_model_dir, monkeypatch):
    for key in RENDEZVOUS:
        monkeypatch.delenv(key, raising=False)
    cfg = config(tmp_path, random_model_dir)

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="start")
        try:
            await run.start()
            [server] = run.parts.servers
            first = _environ(server.proc.pid)
            relaunch(server)  # as the supervisor restarts a server that died mid-run, the trainer's variables set by now
            wait_healthy([server], 120)
            return {k: os.environ.get(k) for k in RENDEZVOUS}, first, _environ(server.proc.pid)
        finally:
            await run.close()
    trainer_env, first, again = asyncio.run(go())
    assert all(trainer_env.values()), trainer_env  # the trainer in this process did set them
    for server_env in (first, again):
        assert not any(k in server_env for k in RENDEZVOUS), {k: server_env[k] for k in RENDEZVOUS if k in server_env}
    assert not any(k in os.environ for k in RENDEZVOUS)  # and the closed trainer put the environment back


def test_a_server_that_cannot_start_fails_the_run_naming_it_and_the_trainer_built_meanwhile_is_closed(tmp_path, random_model_dir,
                                                                                                         monkeypatch):
    for key in RENDEZVOUS:
        monkeypatch.delenv(key, raising=False)
    cfg = config(tmp_path, random_model_dir)
    with socket.socket() as taken:  # the server's port, held here: the server exits at start-up
        taken.bind(("127.0.0.1", cfg.inference.port))
        taken.listen()

        async def go():
            run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="start")
            try:
                with pytest.raises(InferenceUnavailable, match="exited during start-up") as failed:
                    await run.start()
                return failed.value, run.parts.backend
            finally:
                await run.close()
        error, backend = asyncio.run(go())
    assert "hf-0" in str(error)
    assert backend is not None  # the trainer was built while the server failed
    import torch.distributed

    assert not torch.distributed.is_initialized() and not any(k in os.environ for k in RENDEZVOUS)  # and closed
