"""Shared fixtures: every test runs in its own working directory with no AGENTRL_* variables."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.app import app


def pytest_terminal_summary(terminalreporter, config):
    """How long xdist workers sat idle waiting for the `exclusive` and `serial` locks (CI's wall time goes
    there too): the total, and the longest waits."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or getattr(config, "workerinput", None) is not None:
        return
    try:
        rows = [json.loads(line) for f in factory.getbasetemp().glob("waits-*.jsonl") for line in f.read_text().splitlines()]
    except OSError:
        return
    if rows:
        rows.sort(key=lambda r: -r["waited_s"])
        terminalreporter.write_sep("=", f"lock waits: {sum(r['waited_s'] for r in rows):.0f} s in {len(rows)} tests")
        for r in rows[:8]:
            why = "exclusive" if r["exclusive"] else f"serial({r['serial']})" if r["serial"] else "behind an exclusive test"
            terminalreporter.write_line(f"{r['waited_s']:7.1f}s {why:<26} {r['test']}")


def pytest_collection_modifyitems(config, items):
    """Spread each `serial` group's files evenly over the e2e and integration files, in their own order.
    pytest-xdist hands files out in collection order (--dist loadfile): side by side, as their names put
    them (the five `netns` rehearsal files), both workers reach them together and one sits on the group's
    lock (a CI run measured 169 s of such waits)."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def group(name: str) -> str | None:
        marker = files[name][0].get_closest_marker("serial")
        return marker.args[0] if marker is not None else None

    order = [f for f in files if group(f) is None]
    groups: dict[str, list[str]] = {}
    for f in files:
        if group(f) is not None:
            groups.setdefault(group(f), []).append(f)
    span = next((i for i, f in enumerate(order) if f.startswith("tests/unit/")), len(order))
    for members in groups.values():
        for i, f in enumerate(members):  # i files of the group already placed before this position
            order.insert(min(len(order), (2 * i + 1) * span // (2 * len(members)) + i), f)
    items[:] = [item for f in order for item in files[f]]


def pytest_addoption(parser):
    parser.addoption("--harness", action="append", default=[], metavar="NAME_OR_MODULE:CLASS",
                     help="run the harness contract suite (tests/integration/test_harness_contract.py) on this "
                          "harness instead of every registered one; repeat for several")
    parser.addoption("--harness-config", default=None, metavar="PLATFORM_YAML",
                     help="the contract suite configures each harness from this platform config's harnesses[] entry "
                          "of the same name (tasks file, options), as `agentrl harness check NAME --config` does")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked `exclusive` runs while no other test of this session runs (pytest-xdist): it waits
    for the other workers' current tests to end, and they wait for it. Every other test holds a shared
    lock; the gate in front of it keeps an exclusive test from waiting forever. A test marked
    `serial(GROUP)` runs while no other test of its group runs, beside any other test (a lock of the
    group's own, taken before the shared lock so a waiting test holds nothing). Serial runs skip this."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None or not item.config.option.basetemp:
        return (yield)
    shared = Path(item.config.option.basetemp).parent  # this session's basetemp, the same for every worker
    exclusive = item.get_closest_marker("exclusive") is not None
    serial = item.get_closest_marker("serial")
    with contextlib.ExitStack() as held:
        waited = time.monotonic()
        if serial is not None:
            group = held.enter_context(open(shared / f"serial-{serial.args[0]}.lock", "a"))
            fcntl.flock(group, fcntl.LOCK_EX)  # released when the file closes
        gate = held.enter_context(open(shared / "exclusive.gate", "a"))
        lock = held.enter_context(open(shared / "exclusive.lock", "a"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        waited = time.monotonic() - waited
        if waited >= 1.0:  # a worker idle on a lock: the summary adds these up (pytest_terminal_summary)
            with open(shared / f"waits-{workerinput['workerid']}.jsonl", "a") as out:
                out.write(json.dumps({"test": item.nodeid, "waited_s": round(waited, 1), "exclusive": exclusive,
                                      "serial": serial.args[0] if serial is not None else None}) + "\n")
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("AGENTRL_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    redaction = sys.modules.get("agentrl_cli.core.redaction")
    if redaction is not None:  # an in-process command protected this process with its own config's secrets
        redaction._State.redactor = None
    logstreams = sys.modules.get("agentrl_cli.core.logstreams")
    if logstreams is not None:  # an in-process command set agentrl's loggers up (observe.log_level): undo it
        import logging

        for name in logstreams.AGENTRL_LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.NOTSET)
            for handler in [h for h in logger.handlers if isinstance(h, logstreams.StderrHandler)]:
                logger.removeHandler(handler)


class Cli:
    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict | None = None):
        return self.runner.invoke(app, list(args), env=env, catch_exceptions=False)

    def json(self, *args: str, env: dict | None = None):
        result = self(*args, "--json", env=env)
        return result, json.loads(result.stdout)


@pytest.fixture
def cli() -> Cli:
    return Cli()


@pytest.fixture
def write_yaml(tmp_path):
    def write(text: str, name: str = "agentrl.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return write


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """A tiny random-weight model directory, so CLI tests need not build the built-in model."""
    from agentrl_cli.model.tiny import build_random

    return build_random(tmp_path_factory.mktemp("model") / "tiny", seed=5)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


PORTS_FROM = 20000  # test servers' ports: from here up to the kernel's ephemeral range


def _port_block() -> range:
    """This xdist worker's share of the ports below the kernel's ephemeral range. A port the kernel picks
    (bind to port 0, or the local end of any outgoing connection) comes from the ephemeral range, so it
    can be handed to someone else before the test's server binds it: CI saw a server started ~45 s after
    its port was picked find it taken ("address already in use"). Ports below that range are handed out
    only here, each worker from its own block, so nothing else takes them meanwhile."""
    top = _ephemeral_low()
    if top - PORTS_FROM < 1000:
        return range(0)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = int((os.environ.get("PYTEST_XDIST_WORKER", "gw0") or "gw0").lstrip("gw") or 0) % workers
    size = (top - PORTS_FROM) // workers
    return range(PORTS_FROM + worker * size, PORTS_FROM + (worker + 1) * size)


_next_port: list[int] = []


def free_ports(n: int = 1) -> int:
    """The first of `n` consecutive ports free on loopback now, from this worker's block below the
    kernel's ephemeral range (`_port_block`), handed out in turn (a port comes round again only after
    the whole block). Falls back to a kernel-picked port where that range is too small."""
    import random
    import socket

    block = _port_block()
    if len(block) < n + 1:
        if n != 1:
            raise RuntimeError(f"no block of ports below the ephemeral range for {n} consecutive ports")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if not _next_port:
        _next_port.append(random.randrange(block.start, block.stop - n))
    for _ in range(len(block)):
        first = _next_port[0]
        if first + n > block.stop:
            first = block.start
        _next_port[0] = first + n
        socks = []
        try:
            for p in range(first, first + n):  # without SO_REUSEADDR: a port in TIME_WAIT counts as taken
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports in {block}")


def free_port() -> int:
    """A port free on loopback now that nothing else will be handed meanwhile (`free_ports`)."""
    return free_ports(1)


@pytest.fixture
def quick_sets(random_model_dir) -> list[str]:
    """--set arguments that keep `stage run all` quick in tests: a random tiny model, a free port."""
    return ["--set", f"model.path={random_model_dir}", "--set", f"inference.port={free_port()}",
            "--set", "stages.inference_load_concurrency=4", "--set", "stages.sandbox_concurrency=4",
            "--set", "stages.smoke_steps=2", "--set", "rollout.max_steps_per_trajectory=2",
            "--set", "inference.max_new_tokens=16", "--set", "rollout.group_size=2", "--set", "training.micro_batch_size=2"]


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Dummy AWS credentials for S3 tests against moto; never read the machine's AWS config."""
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's S3 server mode on 127.0.0.1 (a real S3-compatible endpoint), for one test module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
