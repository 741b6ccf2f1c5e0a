"""The egress allowlist in a real bubblewrap sandbox: the allow-listed loopback service is reached,
any other host listener is not; bad entries are refused before a sandbox starts."""

from __future__ import annotations

import socket
import threading

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.sandbox import Limits, Sandbox, SandboxSettings, SandboxUnavailable
from agentrl_cli.envs.sandbox.network import parse_allowlist
from tests.integration.conftest import needs_bwrap

PROBE = """
import socket, sys
for port in sys.argv[1:]:
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect(("127.0.0.1", int(port))); s.sendall(b"ping"); print(port, "reply", s.recv(100).decode())
    except OSError as e:
        print(port, "refused", e.errno)
print("interfaces", sorted(n for _, n in socket.if_nameindex()))
"""


class Service:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"pong:" + conn.recv(100))
            conn.close()


@pytest.fixture
def services():
    a, b = Service(), Service()
    yield a, b
    a.sock.close()
    b.sock.close()


@pytest.mark.integration
@needs_bwrap
def test_allow_listed_service_is_reached_and_no_other(services, sandbox_root):
    allowed, other = services
    settings = SandboxSettings(limits=Limits(), root_dir=sandbox_root, allowlist=(f"127.0.0.1:{allowed.port}",))
    with Sandbox(settings) as sb:
        out = sb.exec(["python3", "-c", PROBE, str(allowed.port), str(other.port)]).stdout
        assert sb.describe()["egress"] == [f"127.0.0.1:{allowed.port}"]
    assert f"{allowed.port} reply pong:ping" in out
    assert f"{other.port} refused" in out and other.accepted == 0
    assert allowed.accepted == 1
    assert "interfaces ['lo']" in out


@pytest.mark.integration
@needs_bwrap
def test_without_an_allowlist_nothing_is_reached(services, sandbox_root):
    allowed, _ = services
    with Sandbox(SandboxSettings(root_dir=sandbox_root)) as sb:
        out = sb.exec(["python3", "-c", PROBE, str(allowed.port)]).stdout
    assert f"{allowed.port} refused" in out and allowed.accepted == 0


@pytest.mark.integration
@needs_bwrap
def test_harness_config_allowlist_flows_into_sandbox_settings(services, sandbox_root):
    allowed, other = services
    cfg = load_config(None, ["harnesses.0.network=allowlist", f"harnesses.0.allowlist=[\"127.0.0.1:{allowed.port}\"]"]).config
    settings = SandboxSettings(root_dir=sandbox_root).for_harness(cfg.harnesses[0])
    assert SandboxSettings().for_harness(cfg.harnesses[1]).allowlist == ()
    with Sandbox(settings) as sb:
        out = sb.exec(["python3", "-c", PROBE, str(allowed.port), str(other.port)]).stdout
    assert f"{allowed.port} reply pong:ping" in out and f"{other.port} refused" in out


@pytest.mark.parametrize("entry,message", [("127.0.0.1", "not host:port"), ("10.0.0.5:8080", "non-loopback"),
                                           ("127.0.0.1:80", "below 1024"), ("host:99999", "not host:port")])
def test_bad_entries_are_named(entry, message, sandbox_root):
    with pytest.raises(ValueError, match=message):
        parse_allowlist([entry])
    with pytest.raises(ConfigError):
        load_config(None, ["harnesses.0.network=allowlist", f"harnesses.0.allowlist=[\"{entry}\"]"])
    if entry == "10.0.0.5:8080":
        with pytest.raises(SandboxUnavailable, match="non-loopback"):
            Sandbox(SandboxSettings(root_dir=sandbox_root, allowlist=(entry,)))


def test_an_allowlist_without_network_allowlist_is_refused():
    with pytest.raises(ConfigError, match="set network: allowlist"):
        load_config(None, ["harnesses.0.allowlist=[\"127.0.0.1:8080\"]"])


def test_host_names_get_loopback_addresses_of_their_own():
    eps = parse_allowlist(["api.internal:8443", "127.0.0.1:9000", "other.internal:8443", "api.internal:9443"])
    inside = {(e.host, e.port): e.inside for e in eps}
    assert inside[("127.0.0.1", 9000)] == "127.0.0.1"
    assert inside[("api.internal", 8443)] == inside[("api.internal", 9443)] != inside[("other.internal", 8443)]
