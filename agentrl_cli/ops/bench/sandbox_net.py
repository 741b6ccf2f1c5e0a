"""Sandbox network, seen from inside a real sandbox: isolation, and the egress allowlist at work.

Isolation: a listener this probe opens on the host's loopback is refused from inside and never
accepts; the sandbox has no interface but `lo`. Allowlist: with an echo service and a decoy on the
host's loopback, a sandbox allowing only the echo service reaches it (the echo comes back) and
not the decoy. Configured allowlists (`harnesses[].network: allowlist`): each endpoint is relayed
to a live service on the host, and a port not on the list stays refused. Belongs here: the probes
and their checks; the mechanism is `envs/sandbox/network.py`.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

from agentrl_cli.core.report import Check, CheckStatus

PROBE = """
import json, socket, sys
out = {"interfaces": sorted(n for _, n in socket.if_nameindex()), "targets": {}}
for host, port, payload in json.loads(sys.argv[1]):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port))
    except OSError as e:
        out["targets"][f"{host}:{port}"] = {"connected": False, "error": e.strerror or str(e)}
        s.close()
        continue
    reply = None
    try:
        if payload:
            s.sendall(payload.encode())
        else:
            s.settimeout(1)  # a service that waits for the client to speak first
        reply = s.recv(200).decode("utf-8", "replace")
    except OSError:
        pass
    s.close()
    out["targets"][f"{host}:{port}"] = {"connected": True, "reply": reply}
print(json.dumps(out))
"""


class LoopbackService:
    """A TCP service on the host's 127.0.0.1 that counts accepted connections and echoes one message."""

    def __init__(self, echo: bool = True) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.echo = echo
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                conn.settimeout(3)
                if self.echo:
                    conn.sendall(b"echo:" + conn.recv(200))
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _probe(sandbox, targets: list[tuple[str, int, str]]) -> dict:
    r = sandbox.exec(["python3", "-I", "-S", "-c", PROBE, json.dumps(targets)], timeout=30)
    if r.exit_code != 0:
        raise RuntimeError(f"probe inside the sandbox failed (exit {r.exit_code}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _settings(sandbox_config, root: Path):
    from agentrl_cli.envs.sandbox.sandbox import SandboxSettings

    return replace(SandboxSettings.from_config(sandbox_config), root_dir=root)


def sandbox_network_checks(sandbox_config, harnesses) -> list[Check]:
    name_iso, name_allow = "sandbox network isolated", "sandbox egress allowlist"
    if sandbox_config.backend == "process":
        return [Check(name_iso, CheckStatus.FAIL, "process backend", "bwrap", "sandbox.backend is 'process': commands run with the host's network",
                      "set sandbox.backend: bwrap (install bubblewrap)")]
    if sandbox_config.service_url:
        return [Check.skipped(name_iso, f"sandboxes run on the sandbox service at {sandbox_config.service_url}: run "
                              "`agentrl stage run 1` on that host (this probe starts a local sandbox)")]
    from agentrl_cli.envs.sandbox.bwrap import SandboxUnavailable
    from agentrl_cli.envs.sandbox.sandbox import Sandbox

    root = Path(tempfile.mkdtemp(prefix="agentrl-netcheck-"))
    base = _settings(sandbox_config, root)
    checks: list[Check] = []
    echo, decoy = LoopbackService(), LoopbackService(echo=False)
    try:
        try:
            with Sandbox(base) as sb:
                got = _probe(sb, [("127.0.0.1", decoy.port, "")])
        except SandboxUnavailable as exc:
            return [Check(name_iso, CheckStatus.FAIL, None, "a bubblewrap sandbox starts", exc.message, exc.hint)]
        t = got["targets"][f"127.0.0.1:{decoy.port}"]
        ok = not t["connected"] and got["interfaces"] == ["lo"] and decoy.accepted == 0
        checks.append(Check.judge(name_iso, ok, {"host_listener": "refused" if not t["connected"] else "REACHED",
                                                 "interfaces": got["interfaces"], "accepted_on_host": decoy.accepted},
                                  "a host loopback listener is refused from inside; only `lo` exists",
                                  "the sandbox shares the host's network: check that bubblewrap runs with --unshare-net "
                                  "(agentrl_cli/envs/sandbox/bwrap.py) and is not setuid-stripped of namespaces"))
        token = uuid.uuid4().hex[:12]
        with Sandbox(replace(base, allowlist=(f"127.0.0.1:{echo.port}",))) as sb:
            got = _probe(sb, [("127.0.0.1", echo.port, token), ("127.0.0.1", decoy.port, "")])
        allowed, other = got["targets"][f"127.0.0.1:{echo.port}"], got["targets"][f"127.0.0.1:{decoy.port}"]
        ok = allowed.get("reply") == f"echo:{token}" and not other["connected"] and decoy.accepted == 0
        checks.append(Check.judge(name_allow, ok, {"allowed_service": "reached" if allowed.get("reply") == f"echo:{token}" else allowed,
                                                   "other_listener": "refused" if not other["connected"] else "REACHED",
                                                   "accepted_by_other": decoy.accepted},
                                  "the allow-listed 127.0.0.1 service answers from inside; another host listener stays refused",
                                  "see agentrl_cli/envs/sandbox/network.py (host relay and in-sandbox forwarder)"))
        for hc in harnesses:
            if hc.network == "allowlist" and hc.allowlist:
                checks.append(_configured(base, hc, decoy))
    finally:
        echo.close()
        decoy.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return checks


def _configured(base, hc, decoy: LoopbackService) -> Check:
    from agentrl_cli.envs.sandbox.network import parse_allowlist
    from agentrl_cli.envs.sandbox.sandbox import Sandbox

    name = f"egress allowlist of {hc.name}"
    endpoints = parse_allowlist(hc.allowlist)
    with Sandbox(base.for_harness(hc)) as sb:
        got = _probe(sb, [(e.host, e.port, "") for e in endpoints] + [("127.0.0.1", decoy.port, "")])
        deadline = time.monotonic() + 3  # the host side connects upstream in its own thread
        while sb.relay and not all(sb.relay.connected) and time.monotonic() < deadline:
            time.sleep(0.05)
        relayed = list(sb.relay.connected) if sb.relay else []
    per = {f"{e.host}:{e.port}": ("reached" if relayed and relayed[i] else "no service answers on the host")
           for i, e in enumerate(endpoints)}
    other = got["targets"][f"127.0.0.1:{decoy.port}"]
    ok = all(v == "reached" for v in per.values()) and not other["connected"]
    return Check.judge(name, ok, {**per, "not listed": "refused" if not other["connected"] else "REACHED"},
                       "every allow-listed endpoint reaches its service; a port not listed is refused",
                       f"start the services harnesses[{hc.name}].allowlist names on this host, or correct the list")
