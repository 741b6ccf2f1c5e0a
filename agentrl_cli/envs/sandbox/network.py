"""The sandbox egress allowlist: each allow-listed `host:port` reachable from inside, nothing else.

A sandbox has a network namespace of its own with only `lo`, so by default nothing outside is
reachable. For each allow-listed endpoint the host runs a relay (`HostRelay`) that listens on a
Unix socket in the sandbox's private directory and connects to the real `host:port` from the
host's namespace; the directory is bound read-only into the sandbox at `NET_DIR`. Inside, this
file runs as a tiny forwarder before the supervisor starts (`sandbox_main`): it listens on the
endpoint's address in the sandbox's namespace and relays each connection to its Unix socket.
Loopback addresses keep their address inside; a host name is given a loopback address of its own
(127.0.0.2, 127.0.0.3, ...) in the sandbox's /etc/hosts. Any other address or port stays
unreachable: there is no route out and no other listener. Ports below 1024 are refused: the
sandbox's user holds no capabilities, so nothing inside can listen on them.

This file must run on the sandbox's interpreter with `python3 -I -S`: standard library only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

NET_DIR = "/.agentrl/net"
SCRIPT_PATH = "/.agentrl/network.py"
CONNECT_TIMEOUT_S = 5.0
CHUNK = 65536
MAX_RELAYED = 64  # connections one sandbox may hold open through its relays at once; more are closed


@dataclass(frozen=True)
class Endpoint:
    host: str  # as written in the allowlist
    port: int
    inside: str  # address the sandbox connects to (its own loopback)


def parse_allowlist(entries) -> list[Endpoint]:
    """`["127.0.0.1:8080", "api.internal:8443"]` -> endpoints; ValueError naming a bad entry."""
    out: list[Endpoint] = []
    names: dict[str, str] = {}
    for entry in entries:
        host, sep, port_text = str(entry).strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"allowlist entry {entry!r} is not host:port (e.g. 127.0.0.1:8080 or api.internal:8443)")
        if int(port_text) < 1024:
            raise ValueError(f"allowlist entry {entry!r}: ports below 1024 cannot be opened inside the sandbox, whose user "
                             "holds no capabilities; serve it (or a relay) on the host at a port >= 1024")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if ip is not None and not ip.is_loopback:
            raise ValueError(f"allowlist entry {entry!r}: a non-loopback address has no route inside the sandbox; "
                             "name the host instead (it is mapped to a loopback address inside)")
        if ip is not None and ip.version != 4:
            raise ValueError(f"allowlist entry {entry!r}: only IPv4 loopback addresses are supported; use 127.0.0.1")
        if ip is None:
            inside = names.setdefault(host.lower(), "127.0.0.1" if host.lower() == "localhost" else f"127.0.0.{len(names) + 2}")
        else:
            inside = str(ip)
        ep = Endpoint(host, int(port_text), inside)
        if any(e.inside == ep.inside and e.port == ep.port for e in out):
            continue
        out.append(ep)
    return out


def hosts_file(endpoints: list[Endpoint]) -> str | None:
    """/etc/hosts for the sandbox when the allowlist names hosts, else None."""
    named = {e.host.lower(): e.inside for e in endpoints if not _is_ip(e.host)}
    if not named:
        return None
    lines = ["127.0.0.1 localhost"] + [f"{ip} {name}" for name, ip in sorted(named.items()) if name != "localhost"]
    return "\n".join(lines) + "\n"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both sides are done, then close both."""
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    a.close()
    b.close()


class HostRelay:
    """Host side: one Unix socket per endpoint in `directory`, each relayed to the real host:port."""

    def __init__(self, endpoints: list[Endpoint], directory: Path) -> None:
        self.endpoints = endpoints
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.directory, 0o755)
        self._listeners: list[socket.socket] = []
        self._closed = False
        self.connected = [0] * len(endpoints)  # per endpoint: connections relayed to the real service
        self._slots = threading.BoundedSemaphore(MAX_RELAYED)
        for i, ep in enumerate(endpoints):
            path = self.directory / f"{i}.sock"
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(path))
            os.chmod(path, 0o666)  # the sandbox user connects to it
            s.listen(64)
            self._listeners.append(s)
            threading.Thread(target=self._serve, args=(s, i), daemon=True, name=f"egress-{ep.host}:{ep.port}").start()

    def socket_path(self, index: int) -> str:
        """The path of endpoint `index`'s socket as the sandbox sees it."""
        return f"{NET_DIR}/{index}.sock"

    def forwarder_args(self) -> list[str]:
        return [f"{ep.inside}:{ep.port}={self.socket_path(i)}" for i, ep in enumerate(self.endpoints)]

    def _serve(self, listener: socket.socket, index: int) -> None:
        while not self._closed:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # the sandbox holds too many connections open already
                continue
            threading.Thread(target=self._connect, args=(conn, index), daemon=True).start()

    def _connect(self, conn: socket.socket, index: int) -> None:
        ep = self.endpoints[index]
        try:
            try:
                upstream = socket.create_connection((ep.host, ep.port), timeout=CONNECT_TIMEOUT_S)
                upstream.settimeout(None)
            except OSError:
                conn.close()  # the sandbox sees the connection closed: the allowed service is down
                return
            self.connected[index] += 1
            _relay(conn, upstream)
        finally:
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        for s in self._listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


# -- inside the sandbox ------------------------------------------------------------------------------

def _serve_inside(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_forward_inside, args=(conn, path), daemon=True).start()


def _forward_inside(conn: socket.socket, path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    _relay(conn, up)


def sandbox_main(argv: list[str]) -> None:
    """`network.py ADDR:PORT=SOCKET ... -- COMMAND...`: bind every listener, fork a child that
    relays, and exec COMMAND (the supervisor) in this process, so listeners exist before it is ready."""
    sep = argv.index("--")
    listeners = []
    for spec in argv[:sep]:
        addr, _, path = spec.partition("=")
        host, _, port = addr.rpartition(":")
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(64)
        listeners.append((s, path))
    command = argv[sep + 1:]
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # never hold the supervisor's answer pipe open
        threads = [threading.Thread(target=_serve_inside, args=(s, p), daemon=True) for s, p in listeners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(0)
    for s, _ in listeners:
        s.close()
    os.execv(command[0], command)


if __name__ == "__main__":
    sandbox_main(sys.argv[1:])
