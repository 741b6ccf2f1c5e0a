"""The supervisor's state machine against tiny HTTP servers on 127.0.0.1 (aiohttp) whose health the
test switches: down after two failed polls, out of rotation at once, restarts with backoff, the run's
hook before it counts as back, giving up past max_restarts, components joining and leaving; the
control file of elastic inference and `agentrl run servers`; the client's rotation."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter

import pytest
from aiohttp import web

from agentrl_cli.engines.inference.client import InferenceClient, InferenceUnreachable, SamplingParams
from agentrl_cli.run.loop.restarts import crash_cause
from agentrl_cli.runtime.observe import keys
from agentrl_cli.run.supervise import Component, ComponentFailed, RemoteComponent, Supervisor
from agentrl_cli.run.supervise.control import REQUESTS, STATUS, ServerControl, read_requests, request, server_url
from agentrl_cli.run.supervise.supervisor import unless_failed
from agentrl_cli.core.errors import UsageError


class Health:
    """An aiohttp server on loopback answering /health with 200 while `ok`, else 503."""

    def __init__(self) -> None:
        self.ok, self.polls = True, 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> "Health":
        async def health(_request):
            self.polls += 1
            return web.Response(status=200 if self.ok else 503)
        app = web.Application()
        app.router.add_get("/health", health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


class Flaky(Component):
    """A restartable component over a Health server: `restart` fails `fail_starts` times, then makes
    it healthy again; `exited` plays a process that ended."""

    restartable = True

    def __init__(self, name: str, health: Health, fail_starts: int = 0) -> None:
        super().__init__(name, health.url)
        self.health, self.fail_starts, self.starts, self.exited = health, fail_starts, 0, None

    def exit_code(self):
        return self.exited

    async def restart(self, deadline_s: float) -> None:
        self.starts += 1
        if self.starts <= self.fail_starts:
            raise RuntimeError(f"start {self.starts} failed: port in use")
        self.exited, self.health.ok = None, True

    def log_tail(self) -> str:
        return "line 1\nflaky: address already in use"


async def until(condition, what: str, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def kinds(sup: Supervisor, name: str) -> list[str]:
    return [e["event"] for e in sup.events if e["component"] == name]


def test_a_watched_service_leaves_after_two_failed_polls_and_returns_when_healthy():
    async def go():
        h = await Health().start()
        calls: list[tuple[str, str]] = []
        counters: Counter = Counter()
        sup = Supervisor([RemoteComponent("reward", h.url, kind="reward")], interval_s=0.05, counters=counters,
                         on_down=lambda c: calls.append(("down", c.name)), on_up=lambda c: calls.append(("up", c.name)))
        await sup.start()
        try:
            await until(lambda: h.polls >= 3, "polls while healthy")
            assert sup.events == [] and counters[keys.SUPERVISOR_DOWN_NOW] == 0
            h.ok = False
            polls = h.polls
            await until(lambda: kinds(sup, "reward") == ["down"], "down")
            assert h.polls - polls >= 2  # one failed poll is not enough
            assert calls == [("down", "reward")] and counters[keys.SUPERVISOR_DOWN_NOW] == 1
            assert "503" in sup.events[0]["cause"]
            h.ok = True
            await until(lambda: kinds(sup, "reward") == ["down", "back"], "back")
            assert calls == [("down", "reward"), ("up", "reward")]
            assert counters[keys.SUPERVISOR_DOWN_NOW] == 0 and counters[keys.SUPERVISOR_RESTARTS] == 0  # not ours to restart
            assert sup.failed is None and sup.events[-1]["seconds"] > 0
        finally:
            await sup.stop()
            await h.stop()
    asyncio.run(go())


class ExitsLate(Flaky):
    """A process that stops answering before its exit is reported (a SIGKILLed server under load: its
    socket closes, then the kernel reaps it): `exit_code` is None for the first `late` calls after the
    health failed."""

    def __init__(self, name: str, health: Health, late: int) -> None:
        super().__init__(name, health)
        self.late = late

    def exit_code(self):
        if self.health.ok or self.exited is None:
            return None
        self.late -= 1
        return self.exited if self.late < 0 else None


@pytest.mark.parametrize("exits", [True, False])
def test_a_process_that_stops_answering_before_its_exit_shows_is_down_for_its_exit(exits):
    """Two failed polls make it down; its cause names the exit when the process ends within one more
    interval, else the polls (a hung process, alive)."""
    async def go():
        h = await Health().start()
        late = ExitsLate("inference-0", h, late=5)  # two ticks' checks and three of the grace's
        sup = Supervisor([late], interval_s=0.05, max_restarts=1, backoff_s=0.01)
        await sup.start()
        try:
            await until(lambda: h.polls >= 2, "polls while healthy")
            late.exited, h.ok = (-9 if exits else None), False
            await until(lambda: "down" in kinds(sup, "inference-0"), "down")
            [down] = [e for e in sup.events if e["event"] == "down"]
            assert ("exited with code -9" in down["cause"]) == exits, down
            assert ("health polls in a row" in down["cause"]) == (not exits), down
        finally:
            await sup.stop()
            await h.stop()
    asyncio.run(go())


def test_a_component_that_exits_is_restarted_with_backoff_and_back_only_after_on_up():
    async def go():
        h = await Health().start()
        flaky = Flaky("inference-0", h, fail_starts=1)
        ups: list[int] = []

        async def on_up(c):
            if not ups:  # the first re-sync fails: counts as a failed restart
                ups.append(0)
                raise RuntimeError("weights differ")
            ups.append(1)
            return {"weight_version": "4"}
        counters: Counter = Counter()
        sup = Supervisor([flaky], interval_s=0.05, max_restarts=5, backoff_s=0.02, on_up=on_up, counters=counters)
        await sup.start()
        try:
            flaky.exited = -9
            await until(lambda: "back" in kinds(sup, "inference-0"), "back")
            # down; start 1 fails; start 2 works but the re-sync fails; start 3 works and re-syncs
            assert kinds(sup, "inference-0") == ["down", "restarting", "restarting", "restarted", "restarting",
                                                 "restarted", "back"]
            ev = [e for e in sup.events if e["component"] == "inference-0"]
            assert "exited with code -9" in ev[0]["cause"]
            assert "port in use" in ev[2]["cause"] and "weights differ" in ev[4]["cause"]
            assert ev[-1]["weight_version"] == "4" and ups == [0, 1]
            ts = [e["t"] for e in ev if e["event"] == "restarting"]
            assert ts[1] - ts[0] >= 0.04 - 0.002 and ts[2] - ts[1] >= 0.08 - 0.002  # 0.02 s doubling (t in ms)
            assert counters[keys.SUPERVISOR_RESTARTS] == 3 and counters[keys.SUPERVISOR_DOWN] == 1
            assert counters[keys.SUPERVISOR_DOWN_NOW] == 0 and sup.failed is None
        finally:
            await sup.stop()
            await h.stop()
    asyncio.run(go())


def test_past_max_restarts_the_supervisor_gives_up_naming_the_component_and_the_run_stops():
    async def go():
        h = await Health().start()
        flaky = Flaky("reward", h, fail_starts=99)
        flaky.kind = "reward"
        sup = Supervisor([flaky], interval_s=0.05, max_restarts=2, backoff_s=0.01)
        await sup.start()
        try:
            h.ok = False  # unhealthy, not exited: down after two polls
            never = asyncio.Event()
            with pytest.raises(ComponentFailed) as caught:
                await unless_failed(sup, never.wait())  # a step loop waiting for samples
            assert kinds(sup, "reward") == ["down", "restarting", "restarting", "gave_up"]
            err = caught.value
            assert err.name == "reward" and "gave up after 2 restart(s)" in err.cause and "max_restarts=2" in err.cause
            assert "address already in use" in err.message and "reward.service_url" in err.hint
            assert err.exit_code == 1 and crash_cause(err) is None  # no trainer crash: the run ends
            with pytest.raises(ComponentFailed):
                sup.raise_if_failed()
            with pytest.raises(ComponentFailed):  # the next step's wait ends at once
                await unless_failed(sup, asyncio.sleep(60))
            assert await unless_failed(None, asyncio.sleep(0, "done")) == "done"
        finally:
            await sup.stop()
            await h.stop()
    asyncio.run(go())


def test_components_join_once_healthy_and_leave_on_remove():
    async def go():
        a, b = await Health().start(), await Health().start()
        b.ok = False
        rotation: list[str] = []
        sup = Supervisor([RemoteComponent("inference-0", a.url, kind="inference")], interval_s=0.05,
                         on_down=lambda c: rotation.remove(c.url), on_up=lambda c: rotation.append(c.url))
        await sup.start()
        try:
            sup.add(RemoteComponent("inference-1", b.url, kind="inference"))
            with pytest.raises(ValueError):
                sup.add(RemoteComponent("inference-1", b.url))
            await until(lambda: b.polls >= 3, "polls of the joining server")
            assert rotation == [] and kinds(sup, "inference-1") == []  # unhealthy: not yet
            b.ok = True
            await until(lambda: kinds(sup, "inference-1") == ["added"], "added")
            assert rotation == [b.url] and sup.find(b.url + "/").name == "inference-1"
            assert await sup.remove("inference-1")
            assert rotation == [] and kinds(sup, "inference-1") == ["added", "removed"]
            assert not await sup.remove("inference-1") and sup.find(b.url) is None
            assert [s["component"] for s in sup.status()] == ["inference-0"]
        finally:
            await sup.stop()
            await a.stop()
            await b.stop()
    asyncio.run(go())


def test_the_gateway_served_in_a_thread_is_served_again_on_its_port_when_its_thread_died():
    from types import SimpleNamespace

    from fastapi import FastAPI

    from agentrl_cli.core.serving import ServerThread
    from agentrl_cli.run.supervise import GatewayComponent

    app = FastAPI()
    app.get("/health")(lambda: {"ok": True})
    gateway = SimpleNamespace(server=ServerThread(app, name="gateway").start())
    gateway.url = gateway.server.url
    port = gateway.server.port

    async def go():
        sup = Supervisor([GatewayComponent(gateway)], interval_s=0.05, backoff_s=0.01)
        await sup.start()
        try:
            gateway.server._server.should_exit = True  # uvicorn's thread ends as if it crashed
            await until(lambda: "back" in kinds(sup, "gateway"), "the gateway back")
            assert kinds(sup, "gateway") == ["down", "restarting", "restarted", "back"]  # its thread ended or it stopped answering
        finally:
            await sup.stop()
    try:
        asyncio.run(go())
        assert gateway.server.port == port and gateway.server._thread.is_alive()
    finally:
        gateway.server.stop()


# ---- the control file ---------------------------------------------------------------------------------


def test_server_urls_are_scheme_host_and_port_only():
    assert server_url("http://10.0.0.7:30000/") == "http://10.0.0.7:30000"
    for bad in ("10.0.0.7:30000", "ftp://h:1", "http://h", "http://h:1/v1", "http://u:p@h:1", "http://h:1?x=1", "http://h:99999"):
        with pytest.raises(UsageError):
            server_url(bad)


def test_requests_move_a_url_between_add_and_remove_and_the_run_applies_each_change_once(tmp_path):
    control = tmp_path / "control"
    applied: list[tuple[str, str]] = []

    async def join(url):
        applied.append(("join", url))

    async def leave(url):
        applied.append(("leave", url))
    ctl = ServerControl(control, join, leave, lambda: {"components": []})
    assert oct(control.stat().st_mode & 0o777) == "0o700"

    async def go():
        await ctl.tick()
        request(control, "add", "http://127.0.0.1:1001/")
        request(control, "add", "http://127.0.0.1:1001")  # twice: one entry
        assert read_requests(control) == {"add": ["http://127.0.0.1:1001"], "remove": []}
        await ctl.tick()
        await ctl.tick()
        request(control, "remove", "http://127.0.0.1:1001")
        assert read_requests(control) == {"add": [], "remove": ["http://127.0.0.1:1001"]}
        await ctl.tick()
        request(control, "add", "http://127.0.0.1:1001")
        await ctl.tick()
    asyncio.run(go())
    url = "http://127.0.0.1:1001"
    assert applied == [("join", url), ("leave", url), ("join", url)]
    assert json.loads((control / STATUS).read_text())["pid"] == os.getpid()
    assert oct((control / REQUESTS).stat().st_mode & 0o777) == "0o600"


def test_a_requests_file_others_may_write_is_ignored(tmp_path):
    control = tmp_path / "control"
    applied: list[str] = []

    async def join(url):
        applied.append(url)
    ctl = ServerControl(control, join, join, dict)
    request(control, "add", "http://127.0.0.1:1002")
    os.chmod(control / REQUESTS, 0o666)
    asyncio.run(ctl.tick())
    assert applied == []  # the run would send its inference key to that address
    os.chmod(control / REQUESTS, 0o600)
    os.utime(control / REQUESTS, ns=(time.time_ns(), time.time_ns() + 10**9))
    asyncio.run(ctl.tick())
    assert applied == ["http://127.0.0.1:1002"]


def test_run_servers_commands_write_requests_and_list_what_the_run_sees(cli, tmp_path):
    run_dir = tmp_path / "runs" / "r1" / "stage8"
    control = run_dir / "control"
    control.mkdir(parents=True, mode=0o700)
    (control / STATUS).write_text(json.dumps({"components": [{"component": "inference-0", "url": "http://127.0.0.1:1",
                                                              "kind": "inference", "status": "up", "restarts": 1}],
                                              "rotation": ["http://127.0.0.1:1"], "weight_version": 3}))
    result, data = cli.json("run", "servers", "add", "http://127.0.0.1:2/", "--run", str(tmp_path / "runs" / "r1"))
    assert result.exit_code == 0 and data["url"] == "http://127.0.0.1:2" and data["control"] == str(control)
    assert read_requests(control)["add"] == ["http://127.0.0.1:2"]
    result, data = cli.json("run", "servers", "list", "--run", str(run_dir))
    assert result.exit_code == 0 and data["pending"] == {"add": ["http://127.0.0.1:2"], "remove": []}
    assert data["components"][0]["restarts"] == 1 and data["weight_version"] == 3
    result = cli("run", "servers", "remove", "http://127.0.0.1:1", "--run", str(run_dir))
    assert result.exit_code == 0 and read_requests(control) == {"add": ["http://127.0.0.1:2"], "remove": ["http://127.0.0.1:1"]}
    assert cli("run", "servers", "add", "127.0.0.1:2", "--run", str(run_dir)).exit_code == 2
    assert cli("run", "servers", "list", "--run", str(tmp_path)).exit_code != 0  # no training loop there


# ---- the client's rotation --------------------------------------------------------------------------


def test_the_client_rotation_changes_under_it_and_an_empty_one_is_unreachable():
    async def go():
        client = InferenceClient(["http://127.0.0.1:1", "http://127.0.0.1:2"], max_retries=1, backoff_s=0.01)
        try:
            assert client.remove_url("http://127.0.0.1:1/") and not client.remove_url("http://127.0.0.1:1")
            assert [client._pick(set()) for _ in range(3)] == ["http://127.0.0.1:2"] * 3
            assert client.add_url("http://127.0.0.1:3") and not client.add_url("http://127.0.0.1:3")
            assert {client._pick(set()) for _ in range(4)} == {"http://127.0.0.1:2", "http://127.0.0.1:3"}
            assert client.add_url("http://127.0.0.1:4", serve=False)  # held: weight updates, no requests
            assert "http://127.0.0.1:4" in client.urls
            assert {client._pick(set()) for _ in range(6)} == {"http://127.0.0.1:2", "http://127.0.0.1:3"}
            assert client.add_url("http://127.0.0.1:4") and not client.held  # released
            assert "http://127.0.0.1:4" in {client._pick(set()) for _ in range(3)}
            for url in ("http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"):
                client.remove_url(url)
            assert not await client.health() and await client.healthy_urls() == []
            with pytest.raises(InferenceUnreachable, match="no inference server in rotation"):
                await client.generate([1, 2], SamplingParams(max_new_tokens=1))
        finally:
            await client.close()
    asyncio.run(go())
