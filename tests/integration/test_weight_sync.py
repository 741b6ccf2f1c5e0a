"""The `distributed` weight-sync transport against a real embedded server on loopback: a DeepSpeed
trainer (gloo, one rank) broadcasts its parameters over a weight-update group and the server ends
with exactly the trainer's values and the new weight_version; the group is opened once and reused;
a refused update (unknown name) changes nothing; NCCL on a CPU server is refused with the fix; and
the disk and distributed transports leave identical weights on the server, from a DeepSpeed
and from an FSDP trainer."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.engines.inference import HFEngine, create_app
from agentrl_cli.engines.inference.client import InferenceClient
from agentrl_cli.engines.weight_group import listen, open_group
from agentrl_cli.model.tiny import build_random
from agentrl_cli.core.serving import ServerThread
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.weightsync.base import WeightSyncError
from agentrl_cli.weightsync.disk import DiskTransport
from agentrl_cli.weightsync.distributed import DistributedTransport
from agentrl_cli.weightsync.publisher import WeightPublisher

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random(tmp_path_factory.mktemp("ws") / "tiny", seed=7, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def server(model_dir):
    engine = HFEngine(model_dir, weight_version="0")
    app = create_app(engine)
    thread = ServerThread(app, name="hf server").start()
    yield thread.url, engine, app.state.weight_groups
    thread.stop()
    app.state.weight_groups.close()
    engine.close()


@pytest.fixture(scope="module")
def backend(model_dir):
    b = DeepSpeedBackend(model_dir, TrainingConfig(micro_batch_size=2, learning_rate=1e-3))
    yield b
    b.close()


def perturb(backend, seed: int) -> None:
    """Change every trainer parameter (as a train step would, only more)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)


def server_weights(engine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.named_parameters()}


def assert_server_has_trainer_weights(engine, backend) -> None:
    ours, theirs = backend.named_tensors(), dict(engine.named_parameters())
    assert ours.keys() <= theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name


def run(coro_fn):
    return asyncio.run(coro_fn())


def join_as_trainer(url: str, group_name: str):
    """Rank 0 of a two-rank group with the server, joined over the raw HTTP endpoint."""
    sock = listen("127.0.0.1")
    port = sock.getsockname()[1]
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(open_group, "127.0.0.1", port, 0, 2, group_name=group_name, backend="gloo",
                              timeout_s=30, listener=sock)
        init = httpx.post(f"{url}/init_weights_update_group", timeout=60,
                          json={"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
                                "world_size": 2, "group_name": group_name, "backend": "gloo"})
        assert init.status_code == 200, init.text
        assert init.json() == {"success": True, "message": "Succeeded to initialize custom process group."}
        return joining.result(timeout=30)


def test_distributed_sync_loads_the_trainers_weights_and_bumps_the_version(server, backend):
    url, engine, groups = server
    before = server_weights(engine)
    perturb(backend, seed=1)

    async def go():
        client = InferenceClient(url)
        sync = WeightPublisher(DistributedTransport(client, backend="gloo"), client)
        try:
            entry = await sync.sync(backend, 11)
            reported = await client.get_weights_by_name("lm_head.weight", 2)
            return sync, entry, reported
        finally:
            await sync.close()
            await client.close()

    sync, entry, reported = run(go)
    assert isinstance(sync.transport, DistributedTransport) and sync.history == [entry]
    assert entry["version"] == 11 and entry["transport"] == "distributed" and entry["verified_tensors"] == 3
    assert entry["tensors"] == len(backend.named_tensors()) and entry["bytes"] > 0
    assert engine.weight_version == "11"
    assert_server_has_trainer_weights(engine, backend)
    assert not torch.equal(before["lm_head.weight"], dict(engine.named_parameters())["lm_head.weight"])
    assert reported[url] == backend.named_tensors()["lm_head.weight"][:2].tolist()
    with pytest.raises(KeyError):
        groups.get("weight_update_group")  # close() left the group on the server too


def test_second_sync_reuses_the_group_and_close_leaves_it(server, backend):
    url, engine, groups = server

    async def go():
        client = InferenceClient(url)
        sync = WeightPublisher(DistributedTransport(client, backend="gloo", timeout_s=30), client)
        try:
            perturb(backend, seed=2)
            first = await sync.sync(backend, 21)
            perturb(backend, seed=3)
            second = await sync.sync(backend, 22)
            assert_server_has_trainer_weights(engine, backend)
            open_while_running = groups.get("weight_update_group")
            return sync, first, second, open_while_running
        finally:
            await sync.close()
            await sync.close()  # a second close is a no-op
            await client.close()

    sync, first, second, group = run(go)
    assert sync.transport.groups_opened == 1 and group.world_size == 2 and group.rank == 1
    assert first["init_s"] > 0 and second["init_s"] == 0
    assert engine.weight_version == "22" and [h["version"] for h in sync.history] == [21, 22]
    with pytest.raises(KeyError):
        groups.get("weight_update_group")  # close() destroyed it on the server


def test_unknown_name_gets_400_and_leaves_the_weights_unchanged(server):
    url, engine, _ = server
    before, version = server_weights(engine), engine.weight_version
    trainer = join_as_trainer(url, "g-bad")
    with ThreadPoolExecutor(1) as pool:
        q = before["model.layers.0.self_attn.q_proj.weight"]
        tensors = {"model.layers.0.self_attn.q_proj.weight": torch.ones_like(q), "model.no_such.weight": torch.ones(3)}

        def update(names, values, version):
            sending = pool.submit(trainer.send, values)
            r = httpx.post(f"{url}/update_weights_from_distributed", timeout=60,
                           json={"names": names, "dtypes": ["float32"] * len(values),
                                 "shapes": [list(t.shape) for t in values], "group_name": "g-bad",
                                 "weight_version": version})
            sending.result(timeout=30)  # the server received every broadcast even when it refused
            return r

        refused = update(list(tensors), list(tensors.values()), "bad")
        assert refused.status_code == 400
        body = refused.json()
        assert body["success"] is False and "model.no_such.weight" in body["message"] and "not changed" in body["message"]
        assert engine.weight_version == version
        after = server_weights(engine)
        assert all(torch.equal(before[n], after[n]) for n in before)

        ok = update(["model.layers.0.self_attn.q_proj.weight"], [torch.ones_like(q)], "good")  # the group still works
        assert ok.status_code == 200 and ok.json() == {"success": True, "message": "Succeeded to update parameter online."}
        assert engine.weight_version == "good"
        assert torch.equal(dict(engine.named_parameters())["model.layers.0.self_attn.q_proj.weight"], torch.ones_like(q))
    destroy = httpx.post(f"{url}/destroy_weights_update_group", json={"group_name": "g-bad"}, timeout=30)
    assert destroy.json() == {"success": True, "message": "Succeeded to destroy custom process group."}
    again = httpx.post(f"{url}/destroy_weights_update_group", json={"group_name": "g-bad"}, timeout=30)
    assert again.status_code == 400 and again.json()["success"] is False
    trainer.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a server without CUDA")
def test_nccl_on_a_cpu_server_gets_400_naming_gloo(server):
    url, _, groups = server
    r = httpx.post(f"{url}/init_weights_update_group", timeout=30,
                   json={"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2})
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and "nccl" in body["message"] and "backend='gloo'" in body["message"]
    with pytest.raises(KeyError):
        groups.get("weight_update_group")


def test_a_refused_init_cancels_the_trainers_wait_and_names_the_fix(server, backend):
    url, _, groups = server
    stale = join_as_trainer(url, "taken")  # the server already has a group of that name

    async def go():
        client = InferenceClient(url)
        sync = WeightPublisher(DistributedTransport(client, backend="gloo", group_name="taken", timeout_s=60), client)
        try:
            with pytest.raises(WeightSyncError) as info:
                await asyncio.wait_for(sync.sync(backend, 31), 20)  # well before the 60 s rendezvous timeout
            return sync, info.value
        finally:
            await client.close()

    sync, error = run(go)
    stale.close()
    assert "could not open weight-update group 'taken'" in str(error) and "already initialized" in str(error)
    assert sync.transport.group is None and sync.history == []
    with pytest.raises(KeyError):
        groups.get("taken")  # the failed attempt left no group behind, so the next sync can start clean


def test_disk_and_distributed_transports_leave_identical_weights(server, backend, model_dir, tmp_path):
    url, engine, _ = server
    perturb(backend, seed=4)

    async def go():
        client = InferenceClient(url)
        disk = WeightPublisher(DiskTransport(client, tmp_path / "weights"), client)
        dist = WeightPublisher(DistributedTransport(client, backend="gloo", load_format="flattened_bucket", timeout_s=30), client)
        try:
            await disk.sync(backend, 41)
            via_disk = server_weights(engine)
            await client.update_weights_from_disk(str(model_dir), "reset")
            reset = server_weights(engine)
            await dist.sync(backend, 42)
            return via_disk, reset, server_weights(engine)
        finally:
            await dist.close()
            await client.close()

    via_disk, reset, via_dist = run(go)
    assert not torch.equal(reset["lm_head.weight"], via_disk["lm_head.weight"])  # the reset undid the disk sync
    assert via_disk.keys() == via_dist.keys()
    for name in via_disk:
        assert torch.equal(via_disk[name], via_dist[name]), name
    assert engine.weight_version == "42"


def test_an_fsdp_trainer_syncs_by_both_transports(server, model_dir, tmp_path):
    """`training.backend: fsdp` exports the same views: the server ends with the FSDP trainer's values
    by disk and by the distributed transport."""
    from agentrl_cli.learner.fsdp_backend import FSDPBackend
    from tests.integration.ds_worker import synthetic_samples

    url, engine, _ = server
    fsdp = FSDPBackend(model_dir, TrainingConfig(backend="fsdp", micro_batch_size=2, learning_rate=1e-2))
    try:
        fsdp.train_step(synthetic_samples(0, 0, 2, len(fsdp.tokenizer)))

        async def go():
            client = InferenceClient(url)
            disk = WeightPublisher(DiskTransport(client, tmp_path / "weights"), client)
            dist = WeightPublisher(DistributedTransport(client, backend="gloo", load_format="flattened_bucket", timeout_s=30), client)
            try:
                await disk.sync(fsdp, 51)
                assert_server_has_trainer_weights(engine, fsdp)
                await client.update_weights_from_disk(str(model_dir), "reset")
                with pytest.raises(AssertionError):
                    assert_server_has_trainer_weights(engine, fsdp)
                await dist.sync(fsdp, 52)
                assert_server_has_trainer_weights(engine, fsdp)
            finally:
                await dist.close()
                await client.close()

        run(go)
        assert engine.weight_version == "52"
    finally:
        fsdp.close()
