"""Sandbox service replicas behind a plain round-robin load balancer, as the rendered StatefulSet runs
them: two real `agentrl serve sandbox` processes (replicas 127.0.0.2 and 127.0.0.3 on one port, as
pods on one port under their own names) behind a real HAProxy that balances every request round
robin. Episodes play through the rollout's own path (the run's `HarnessSandboxes`, the episode
loop, the terminal_like harness, a scripted policy): creation goes through the balancer, every later
call of a sandbox to the replica that created it (sandbox.replica_url). A replica killed mid-episode
ends its episodes `infra_error` (masked, `sandbox_lost`) at their next call, while the other replica's
episodes play on.

Before replicas were routed, the same episodes lost their sandbox at the first call that the balancer
sent to the other replica (404, `[stopped: sandbox lost]`, over and over until the step limit).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from agentrl_cli.config.load import load_config
from agentrl_cli.engines.inference.client import Generation
from agentrl_cli.envs.sandbox.provider import HarnessSandboxes
from agentrl_cli.model.chat import chat_format
from agentrl_cli.ops.rehearse.services import haproxy_config
from agentrl_cli.runtime.rollout.run_episode import run_episode
from harnesses.tasks import load_tasks
from harnesses.terminal_like import TerminalLike
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap,
              pytest.mark.skipif(shutil.which("haproxy") is None,
                                 reason="HAProxy not installed (apt-get install haproxy; `bash .ci/setup --dev` installs it)")]

HOSTS = ("127.0.0.2", "127.0.0.3")  # the replicas' names: their addresses, as a pod's name is its address
STEPS = 3
COMMAND = "echo step >> .steps; wc -l < .steps"  # the count grows only if every step reaches the same sandbox
REPLY = '<tool_call>\n{"name": "run_shell", "arguments": {"command": "%s"}}\n</tool_call>' % COMMAND
DEADLINE_S = 60.0


def _shared_free_port() -> int:
    """A port free on every replica's address."""
    for _ in range(50):
        port = free_port()
        try:
            for host in HOSTS:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {HOSTS}")


def _start(argv: list[str], log, cwd, env=None) -> subprocess.Popen:
    """A process in a session of its own, its output in the file `log` (read when it fails)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    return proc


def _wait(what: str, ok, procs: list[subprocess.Popen], deadline_s: float = DEADLINE_S):
    """`ok()`'s first truthy answer, polled until the deadline; fails naming `what` (and the log of a
    process that exited meanwhile)."""
    deadline = time.monotonic() + deadline_s
    while True:
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: {p.args[:6]} exited {p.returncode}: {p.log.read_text(errors='replace')[-2000:]}")
        try:
            got = ok()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(0.1)


def _replica_sets(host: str) -> list[str]:
    return ["--set", f"sandbox.replica={host}"]


def _client_sets(lb_url: str, port: int) -> list[str]:
    return [f"sandbox.service_url={lb_url}", f"sandbox.replica_url=http://{{replica}}:{port}"]


class Replicas:
    """Two sandbox service processes and HAProxy balancing them round robin."""

    def __init__(self, tmp_path) -> None:
        self.haproxy: subprocess.Popen | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.roots: dict[str, Path] = {}
        try:
            self._launch(tmp_path)
        except BaseException:
            self.stop()
            raise

    def _launch(self, tmp_path) -> None:
        self.port, self.lb_port = _shared_free_port(), free_port()
        self.lb_url = f"http://127.0.0.1:{self.lb_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
        # each replica's sandboxes under a directory of its own in /tmp (as `sandbox_root`: the sandbox user
        # must reach it, which pytest's private tmp_path does not allow)
        self.roots = {host: Path(tempfile.mkdtemp(prefix=f"agentrl-test-sb-{host}-")) for host in HOSTS}
        for host in HOSTS:
            self.procs[host] = _start(
                [sys.executable, "-m", "agentrl_cli", "serve", "sandbox", "--insecure-loopback", "--host", host,
                 "--port", str(self.port), *_replica_sets(host), "--set", f"sandbox.root_dir={self.roots[host]}",
                 "--set", "sandbox.pool_size=2"], tmp_path / f"replica-{host}.log", tmp_path, env)
        for host in HOSTS:
            _wait(f"replica {host} healthy", lambda h=host: httpx.get(f"http://{h}:{self.port}/health", timeout=2).status_code == 200,
                  list(self.procs.values()))
        (tmp_path / "haproxy.cfg").write_text(haproxy_config(f"127.0.0.1:{self.lb_port}",
                                                            {f"r{i}": f"{host}:{self.port}" for i, host in enumerate(HOSTS)},
                                                            maxconn=256))
        self.haproxy = _start(["haproxy", "-f", str(tmp_path / "haproxy.cfg"), "-db"], tmp_path / "haproxy.log", tmp_path)
        seen: set[str] = set()

        def both_behind_the_balancer() -> bool:  # round robin: consecutive requests reach both replicas
            seen.add(httpx.get(f"{self.lb_url}/health", timeout=2).json().get("replica", "?"))
            return seen >= set(HOSTS)
        _wait("both replicas answer through HAProxy", both_behind_the_balancer, [self.haproxy, *self.procs.values()])

    def acquired(self, host: str) -> float:
        """The sandboxes replica `host` handed out (its pool's counter)."""
        text = httpx.get(f"http://{host}:{self.port}/metrics", timeout=5).text
        return float(re.search(r"^agentrl_sandbox_pool_acquired (\S+)$", text, re.M).group(1))

    def kill(self, host: str) -> None:
        proc = self.procs[host]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for p in [self.haproxy, *self.procs.values()]:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        for root in self.roots.values():
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def replicas(tmp_path):
    r = Replicas(tmp_path)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def tok(random_model_dir):
    return AutoTokenizer.from_pretrained(random_model_dir)


class ScriptedShell:
    """The policy: every generation is one run_shell call of COMMAND. `gate(n)`, when given, is awaited
    before the n-th generation (1-based)."""

    def __init__(self, tokenizer, gate=None) -> None:
        self.ids = tokenizer.encode(REPLY, add_special_tokens=False) + [chat_format(tokenizer).end_of_turn]
        self.gate, self.calls = gate, 0

    async def generate(self, prompt_ids, sampling) -> Generation:
        self.calls += 1
        if self.gate is not None:
            await self.gate(self.calls)
        return Generation(output_ids=list(self.ids), output_logprobs=[-0.1] * len(self.ids), finish_reason="stop",
                          weight_version="v1", latency=0.0, server="scripted")


def _sandboxes(replicas: Replicas, tmp_path) -> HarnessSandboxes:
    """The run's sandboxes, configured as a run's config names the replicas (sandbox.service_url, replica_url)."""
    cfg = load_config(None, [*_client_sets(replicas.lb_url, replicas.port), f"sandbox.root_dir={tmp_path / 'client'}"],
                      env={}).config
    return HarnessSandboxes(cfg)


def _play(harness, task, client, tok, executor):
    return run_episode(harness, task, client, tok, executor, max_steps=STEPS, step_timeout_s=120, max_new_tokens=64,
                       context_limit=4096)


def _lost(result) -> int:
    """How often the episode found its sandbox gone: steps the agent was shown `[stopped: sandbox lost]`
    (a command's `sandbox_lost`), and an end flagged `sandbox_lost` or on a call answered 404 (no such sandbox)."""
    steps = sum("[stopped: sandbox lost]" in o.text for o in result.trajectory.observations)
    return steps + (result.infra_flag == "sandbox_lost" or "404 Not Found" in result.error)


def _tasks(n: int) -> list:
    """terminal_like tasks, every other one with a file written at creation (a call right after it)."""
    with_files = [t for t in load_tasks("terminal_like", "eval") if t.meta.get("files")]
    without = [t for t in load_tasks("terminal_like", "eval") if not t.meta.get("files")]
    return [(with_files if i % 2 == 0 else without)[i // 2] for i in range(n)]


def _counts(result) -> list[int]:
    """The step counter each step's command printed (1, 2, 3 when one sandbox answered them all)."""
    return [int(m.group(1)) for o in result.trajectory.observations[1:] for m in [re.search(r"^(\d+)$", o.text, re.M)] if m]


def test_two_replicas_behind_a_round_robin_balancer_play_episodes_without_losing_a_sandbox(replicas, tok, tmp_path):
    sandboxes = _sandboxes(replicas, tmp_path)
    tasks = _tasks(8)
    harnesses = [TerminalLike(sandboxes=sandboxes.for_harness("terminal_like"), step_timeout_s=60) for _ in range(4)]

    async def play_all() -> list:
        out = []
        with ThreadPoolExecutor(len(harnesses)) as ex:
            for batch in range(0, len(tasks), len(harnesses)):  # four episodes at a time, as a rollout's slots
                pairs = list(zip(harnesses, tasks[batch:batch + len(harnesses)]))
                results = await asyncio.gather(*(_play(h, t, ScriptedShell(tok), tok, ex) for h, t in pairs))
                out += [(h.sandbox.replica if h.sandbox else None, r) for (h, _), r in zip(pairs, results)]
        return out

    try:
        played = asyncio.run(play_all())
    finally:
        for h in harnesses:
            h.close()
        sandboxes.close()
    summary = [(replica, r.termination, _lost(r), _counts(r), r.error[:200]) for replica, r in played]
    lost = sum(_lost(r) for _, r in played)
    assert lost == 0, f"sandbox_lost {lost} times in {len(played)} episodes: {summary}"
    assert all(r.termination == "truncated" and r.harness_error is None for _, r in played), summary
    assert all(_counts(r) == list(range(1, STEPS + 1)) for _, r in played), summary  # every step in one sandbox
    by_replica = Counter(replica for replica, _ in played)
    assert set(by_replica) == set(HOSTS), by_replica  # round robin: both replicas created and served sandboxes
    assert all(replicas.acquired(host) >= by_replica[host] for host in HOSTS)


def test_a_killed_replica_ends_its_episodes_masked_once_and_the_other_replica_plays_on(replicas, tok, tmp_path):
    sandboxes = _sandboxes(replicas, tmp_path)
    provider = sandboxes.for_harness("terminal_like")
    tasks = _tasks(3)
    harnesses = [TerminalLike(sandboxes=provider, step_timeout_s=60) for _ in range(2)]
    victim = HOSTS[1]

    async def play() -> tuple[list, int, object]:
        reached, go = asyncio.Semaphore(0), asyncio.Event()

        async def gate(n: int) -> None:  # each episode waits before its second move until the kill
            if n == 2:
                reached.release()
                await go.wait()

        with ThreadPoolExecutor(2) as ex:
            episodes = [asyncio.ensure_future(_play(h, t, ScriptedShell(tok, gate), tok, ex)) for h, t in zip(harnesses, tasks)]
            for _ in harnesses:  # both created and played a step: one sandbox on each replica (round robin)
                await asyncio.wait_for(reached.acquire(), DEADLINE_S)
            on = [h.sandbox.replica for h in harnesses]
            assert sorted(on) == sorted(HOSTS), on
            replicas.kill(victim)
            go.set()
            results = await asyncio.gather(*episodes)
            # a new episode after the kill: HAProxy hands its creation to the replica that is left
            after = await _play(harnesses[0], tasks[2], ScriptedShell(tok), tok, ex)
        return results, on.index(victim), after

    try:
        results, doomed, after = asyncio.run(play())
        replica_of = [h.sandbox.replica if h.sandbox else None for h in harnesses]
    finally:
        for h in harnesses:
            h.close()
        sandboxes.close()
    lost, kept = results[doomed], results[1 - doomed]
    # the killed replica's episode: masked, saying why, at its first call after the kill (no loop)
    assert lost.termination == "infra_error" and lost.infra_flag == "sandbox_lost" and lost.harness_error is None, lost.error
    assert f"on replica {victim}" in lost.error and "could not be reached" in lost.error
    assert len(lost.trajectory.observations) == 1 + 2 and _counts(lost) == [1], lost.trajectory.observations
    # the other replica's episode, and one started after the kill, play to the step limit
    for r in (kept, after):
        assert r.termination == "truncated" and _lost(r) == 0 and _counts(r) == list(range(1, STEPS + 1)), r.error
    assert replica_of[0] == HOSTS[0]
    assert provider.failures == Counter()  # no creation failed: the balancer sent them to the replica left
