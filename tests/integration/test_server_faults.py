"""docs/security.md row 22: an inference server killed or hung mid-rollout. Aborted generations resume from
their partial tokens (the result equals an uninterrupted generation); a SIGKILLed server restarted
on the same port loses no episode and gets the run's current weights back; a hung server ends its
episodes as masked `infra_error` within the deadline and the watchdog names it. Plus the watchdog's
own rules on a fake clock."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import threading
import time
from collections import Counter

import httpx
import pytest
from transformers import AutoTokenizer

from agentrl_cli.config import load_config
from agentrl_cli.runtime.data.local_store import LocalStore
from agentrl_cli.runtime.data.writer import TrajectoryWriter, read_records
from agentrl_cli.engines.inference.client import InferenceClient, SamplingParams
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.hf_server import create_app
from agentrl_cli.engines.inference.launcher import launch
from agentrl_cli.model.tiny import build_random
from agentrl_cli.runtime.reward.client import LocalRewardClient
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.rollout.buffer import TrajectoryBuffer
from agentrl_cli.runtime.rollout.controller import RolloutController
from agentrl_cli.engines.resume import ResumePolicy, generate_resumable
from agentrl_cli.runtime.rollout.sampler import TaskSampler
from agentrl_cli.core.serving import ServerThread
from agentrl_cli.runtime.observe.watchdog import Watchdog
from agentrl_cli.weightsync.base import Published
from agentrl_cli.weightsync.disk import DiskTransport
from agentrl_cli.weightsync.publisher import WeightPublisher
from harnesses.tasks import load_tasks
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

# untied, larger random weights: a default random model mostly repeats its last token, which would
# make "the resumed tokens equal the uninterrupted ones" vacuous
RANDOM = dict(tie_word_embeddings=False, initializer_range=0.2)


async def until(condition, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        await asyncio.sleep(0.005)


def make_controller(client, model_dir, tmp_path, **rollout):
    sets = [f"rollout.{k}={v}" for k, v in {"concurrency": 8, "group_size": 2, "max_steps_per_trajectory": 2,
                                             "buffer_size": 16, **rollout}.items()]
    cfg = load_config(None, sets + ["inference.max_new_tokens=48"], env={}).config
    sampler = TaskSampler({"tool_api_like": load_tasks("tool_api_like", "train")}, group_size=cfg.rollout.group_size, seed=3)
    buffer = TrajectoryBuffer(cfg.rollout.buffer_size, cfg.rollout.max_staleness, cfg.rollout.group_size)
    writer = TrajectoryWriter(LocalStore(tmp_path / "store"))
    ctl = RolloutController(cfg, client, AutoTokenizer.from_pretrained(model_dir), LocalRewardClient(Scorer()), sampler,
                            buffer, run_id="faults", writer=writer)
    return ctl, writer


# ---- (a) abort mid-generation: resumed, exact tokens --------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = build_random(tmp_path_factory.mktemp("faults") / "m", seed=0, **RANDOM)
    engine = HFEngine(model, batch_window_ms=5, weight_version="3")
    server = ServerThread(create_app(engine), name="hf").start()
    yield engine, server
    server.stop()
    engine.close()


@pytest.mark.integration
@pytest.mark.parametrize("allow_partial", [True, False])
def test_an_aborted_generation_resumes_and_equals_the_uninterrupted_one(served, allow_partial):
    engine, server = served
    prompt = [72, 101, 108, 108, 111, 32]
    sampling = SamplingParams(max_new_tokens=96, temperature=0.0, ignore_eos=True)

    # the batch waits at its checkpoint once a row has 8 tokens until the abort has been received: the
    # tiny model decodes 96 tokens in tens of milliseconds, which an abort sent after polling could miss
    aborted = threading.Event()

    def checkpoint(active):
        if not aborted.is_set() and any(len(r.output_ids) >= 8 for r in active):
            aborted.wait(60)
        return type(engine).checkpoint(engine, active)

    async def go():
        client = InferenceClient(server.url)
        try:
            reference = await client.generate(prompt, sampling)
            counters: Counter = Counter()
            engine.checkpoint = checkpoint  # BatchRun calls its hooks' (the engine's) checkpoint every step
            task = asyncio.create_task(generate_resumable(client, prompt, sampling, ResumePolicy(allow_partial=allow_partial),
                                                          counters))
            await until(lambda: any(len(r.output_ids) >= 8 for r in list(engine._running)), 60, "tokens to be generated")
            async with httpx.AsyncClient() as http:
                assert (await http.post(server.url + "/abort_request", json={"abort_all": True})).status_code == 200
            aborted.set()
            return reference, await task, counters
        finally:
            aborted.set()
            engine.__dict__.pop("checkpoint", None)
            await client.close()
    reference, gen, counters = asyncio.run(go())
    assert len(set(reference.output_ids)) > 5, "the reference is degenerate; the comparison would prove nothing"
    assert gen.finish_reason == "length" and gen.output_ids == reference.output_ids
    assert len(gen.output_logprobs) == len(gen.output_ids) == 96
    assert max(abs(a - b) for a, b in zip(gen.output_logprobs, reference.output_logprobs)) < 1e-3
    assert counters["aborted_generations"] == 1 and counters["server_retries"] == 0
    pieces = gen.meta["pieces"]
    if allow_partial:  # the partial tokens were kept and continued from
        assert counters["resumed_generations"] == 1 and counters["wasted_tokens"] == 0
        assert len(pieces) == 2 and pieces[0]["tokens"] >= 8 and sum(p["tokens"] for p in pieces) == 96
    else:  # thrown away, counted, and the turn generated again from the prompt
        assert counters["resumed_generations"] == 0 and counters["wasted_tokens"] >= 8
        assert len(pieces) == 1 and pieces[0]["tokens"] == 96
    assert {p["weight_version"] for p in pieces} == {"3"} and gen.weight_version == "3"


# ---- (b) SIGKILL and restart mid-rollout: nothing lost, weights re-synced -------------------------------


@pytest.mark.integration
@needs_bwrap
def test_a_sigkilled_server_restarted_mid_rollout_loses_no_episode_and_gets_the_weights_back(tmp_path, random_model_dir):
    trained = build_random(tmp_path / "trained", seed=9)  # what the "trainer" synced as version 7
    cfg = load_config(None, [f"inference.port={free_port()}", "inference.startup_timeout_s=180"], env={}).config
    servers, urls = launch(cfg, str(random_model_dir), tmp_path / "logs")  # this thread: PDEATHSIG stays quiet
    restarted: list = []
    client = InferenceClient(urls, timeout_s=60, max_retries=2, backoff_s=0.05)
    ctl, writer = make_controller(client, random_model_dir, tmp_path, resume_deadline_s=240, resume_max_attempts=40)
    # only the run's re-sync, not a whole run: the publisher last published version 7 from `trained`
    publisher = WeightPublisher(DiskTransport(client, tmp_path / "weights"), client, launch_path=random_model_dir,
                                counters=ctl.counters)
    publisher.last = Published(7, "disk", path=str(trained))
    ctl.on_recovered = publisher.resync_servers

    async def version() -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(urls[0] + "/get_weight_version")).json()["weight_version"]

    async def go():
        try:
            await client.update_weights_from_disk(str(trained), "7")
            rollout = asyncio.create_task(ctl.run(asyncio.Event(), max_groups=3))
            await until(lambda: client.stats["requests"] >= 8 and client.in_flight[urls[0]] > 0, 120, "the rollout's second turns")
            assert not rollout.done()
            os.killpg(servers[0].proc.pid, signal.SIGKILL)
            await asyncio.to_thread(servers[0].proc.wait, 30)
            # the launcher, on the same port; from a thread that lives as long as this event loop
            again, again_urls = await asyncio.to_thread(launch, cfg, str(random_model_dir), tmp_path / "logs")
            restarted.extend(again)
            assert again_urls == urls
            await rollout
            return await version()
        finally:
            await client.close()
    try:
        serving = asyncio.run(go())
    finally:
        ctl.close()
        writer.close()
        for s in servers + restarted:
            s.stop()
    c = ctl.counters
    records = read_records(writer.store)
    ids = [r.trajectory_id for r in records]
    assert len(ids) == len(set(ids)) == 6, "an episode was lost or stored twice"
    assert c["episode_errors"] == 0 and sum(v for k, v in c.items() if k.startswith("termination_")) == 6
    assert c["termination_infra_error"] == 0, "the server came back well within the deadline"
    assert c["server_retries"] > 0 and c["lost_generations"] == 0
    assert serving == "7" and c["weight_resyncs"] == 1
    # every token after the restart came from the re-synced weights, none from the launch weights
    assert {s.weight_version for r in records for s in r.steps} == {"7"}


# ---- (c) a hung server: bounded retries, infra_error, the watchdog names it ----------------------------


class HungServer:
    """Accepts connections on loopback and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.integration
@needs_bwrap
def test_a_hung_server_ends_episodes_as_masked_infra_error_within_the_deadline(tmp_path, random_model_dir, caplog):
    hung = HungServer()
    client = InferenceClient(hung.url, timeout_s=0.5, max_retries=1, backoff_s=0.05)
    watchdog = Watchdog(0.3, interval_s=0.05).start()
    client.watchdog = watchdog
    ctl, writer = make_controller(client, random_model_dir, tmp_path)
    ctl.watchdog = watchdog
    ctl.resume = ResumePolicy(max_attempts=5, deadline_s=2.0, backoff_s=0.1, health_timeout_s=0.5)
    name = f"inference {hung.url}"

    async def go():
        try:
            t0 = time.monotonic()
            await ctl.run(asyncio.Event(), max_groups=1)
            elapsed = time.monotonic() - t0
            groups = await ctl.buffer.take(1, current_version=0, timeout=5)
            await until(lambda: f"watchdog/stuck{{{name}}}" in watchdog.report(), 5, "the watchdog to flag the server")
            return elapsed, groups
        finally:
            await client.close()
    try:
        with caplog.at_level(logging.ERROR, logger="agentrl_cli.runtime.observe.watchdog"):
            elapsed, groups = asyncio.run(go())
    finally:
        watchdog.stop()
        ctl.close()
        writer.close()
        hung.close()
    # two 0.5 s attempts, then /health polled until 2 s after the first failure (+ one 0.5 s poll)
    assert elapsed < 2.0 + 2 * 0.5 + 0.5 + 2.0, f"took {elapsed:.1f} s"
    c = ctl.counters
    assert c["termination_infra_error"] == 2 and c["lost_generations"] == 2 and c["server_retries"] >= 2
    assert c["termination_error"] == 0 and c["episode_errors"] == 0  # never the agent's failure
    episodes = [e for g in groups for e in g]
    assert len(episodes) == 2 and all(e.reward is None for e in episodes)  # masked for the trainer
    records = read_records(writer.store)
    assert {r.reward_status for r in records} == {"infra_error"} and all("inference_unavailable" in r.flags for r in records)
    assert name in watchdog.stuck() and watchdog.report()[f"watchdog/stuck{{{name}}}"] == 1
    assert any(name in m and "no progress" in m for m in caplog.messages)


# ---- (d) the watchdog's rules -----------------------------------------------------------------------


def test_watchdog_flags_components_without_progress_once_and_clears_them_on_progress(caplog):
    now = [0.0]
    wd = Watchdog(10.0, clock=lambda: now[0], deadlines={"trainer": 20.0})
    wd.beat("rollout")  # heartbeat: watched from its first beat
    wd.begin("inference a")  # on-demand: watched while work is outstanding
    wd.begin("inference idle")
    wd.end("inference idle")  # answered: idle servers are never stuck
    wd.begin("trainer")
    now[0] = 9.0
    assert wd.stuck() == {}
    now[0] = 12.0
    with caplog.at_level(logging.ERROR, logger="agentrl_cli.runtime.observe.watchdog"):
        assert sorted(wd.check()) == ["inference a", "rollout"]  # the trainer has its own 20 s deadline
    assert wd.stuck() == {"inference a": 12.0, "rollout": 12.0}
    assert any("inference a made no progress for 12.0 s" in m for m in caplog.messages)
    assert wd.check() == [] and wd.report() == {"watchdog/stuck{inference a}": 1, "watchdog/stuck{rollout}": 1}
    wd.end("inference a", ok=True)
    wd.beat("rollout")
    assert wd.stuck() == {}
    # a failed attempt keeps a component watched though nothing is outstanding, until a success
    wd.begin("harness h")
    wd.end("harness h", ok=False)
    now[0] = 30.0
    assert set(wd.check()) == {"harness h", "trainer", "rollout"}
    assert wd.report()["watchdog/stuck{rollout}"] == 2
    with wd.busy("harness h"):
        pass
    assert "harness h" not in wd.stuck()
    # work that starts after an idle spell gets its full deadline
    wd.begin("inference idle")
    assert "inference idle" not in wd.stuck()


def test_watchdog_thread_flags_a_stuck_component_on_its_own():
    wd = Watchdog(0.05, interval_s=0.01).start()
    try:
        wd.begin("inference http://127.0.0.1:9")
        end = time.monotonic() + 5
        while "watchdog/stuck{inference http://127.0.0.1:9}" not in wd.report():
            assert time.monotonic() < end, "the watchdog thread never flagged the component"
            time.sleep(0.01)
    finally:
        wd.stop()


@pytest.mark.integration
def test_a_terminated_server_with_requests_in_flight_exits_promptly(tmp_path, random_model_dir):
    """SIGTERM (as PDEATHSIG sends when a run dies) while requests decode: the server cancels and
    aborts them and exits, instead of decoding on for clients that are gone."""
    cfg = load_config(None, [f"inference.port={free_port()}", "inference.max_batch_size=8", "inference.enable_metrics=true"],
                      env={}).config
    servers, urls = launch(cfg, str(random_model_dir), tmp_path / "logs")
    proc = servers[0].proc
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}
    senders = [threading.Thread(target=lambda: httpx.post(urls[0] + "/generate", json=body, timeout=120), daemon=True)
               for _ in range(4)]
    try:
        for t in senders:
            t.start()
        deadline = time.monotonic() + 30
        while not re.search(r"^sglang:num_running_reqs\{[^}]*\} [1-9]", httpx.get(urls[0] + "/metrics", timeout=5).text, re.M):
            assert time.monotonic() < deadline, "the requests never started decoding"
            time.sleep(0.05)  # polling interval
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)  # graceful shutdown gives in-flight requests 5 s, then cancels them
        assert proc.returncode is not None
    finally:
        for s in servers:
            s.stop()
