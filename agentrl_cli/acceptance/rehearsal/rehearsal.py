"""`agentrl rehearse`: the deployment as rendered, on simulated nodes of this machine. Each role on
its node (`topology.py`), every node fenced by firewall rules generated from the plan the
NetworkPolicies render from (`firewall.py`), the services started for real (`services.py`), then the
workload from the trainer's node: stage 8 smoke submitted as a job through the control plane (its
state in PostgreSQL), its two trainer ranks on two nodes, generation through the router to both
inference nodes, sandboxes through the load balancer on both replicas, scoring on the reward node,
trajectories to S3; `agentrl verify` on that run; a gateway session opened from the trainer's node
and used by an agent's call from a sandbox node. Then every connection the rules refused is named
with the plan entry to add, and everything is torn down (a later rehearsal or `agentrl sandbox
reclaim` removes what a killed one left).

Belongs here: the order of a rehearsal, its checks and its report. Does not: the nodes, the rules,
the services' command lines (`ops/rehearse/`), the faults (`faults.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.report import Check, CheckStatus, checks_to_json
from agentrl_cli.ops import netplan
from agentrl_cli.ops.rehearse import firewall, leftovers, services, topology, trainers
from agentrl_cli.ops.rehearse.host import NodesUnavailable
from agentrl_cli.ops.rehearse.nodes import Network, subnet_of

REPORT_SCHEMA = 1
PROBE = [sys.executable, "-m", "agentrl_cli.acceptance.rehearsal.probe"]


def unavailable() -> NodesUnavailable | None:
    """Why a rehearsal cannot run here (not root, a tool or program missing), with the fix; None when it can."""
    problem = firewall.unavailable() or trainers.unavailable()
    if problem is None and (missing := services.missing_programs()):
        problem = NodesUnavailable(f"a rehearsal starts programs this host lacks: {'; '.join(missing)}",
                                   "install them (`bash .ci/setup --dev` installs all of them)")
    return problem


@dataclass
class Options:
    """What to rehearse: the user's config; where its files go; the simulated subnet; the planned
    openings to leave out of the rules (`ROLE:PORT`, to see what a plan without them breaks); the
    seconds the whole workload may take."""

    config: PlatformConfig
    out_dir: Path
    subnet: str = "198.18.0.0/24"
    drop: tuple[str, ...] = ()
    deadline_s: float = 1800.0
    up_deadline_s: float = 300.0
    chaos: bool = False
    chaos_hold_s: float = 10.0
    chaos_bound_s: float = 180.0
    progress: Callable[[str], None] = lambda msg: None


@dataclass
class Rehearsal:
    opts: Options
    checks: list[Check] = field(default_factory=list)
    report: dict = field(default_factory=dict)
    net: Network | None = None
    started: dict[str, services.Started] = field(default_factory=dict)

    # ---- the steps -------------------------------------------------------------------------------

    def run(self) -> dict:
        """Bring up, run the workload, judge, tear down; returns the report (`ok` and `checks`)."""
        o = self.opts
        subnet = subnet_of(o.subnet)  # a bad subnet is refused before anything is built
        if subnet.num_addresses - 2 < len(topology.NODES):
            raise UsageError(f"subnet {o.subnet} has {subnet.num_addresses - 2} addresses; a rehearsal needs one per node "
                             f"({len(topology.NODES)})", "give a /28 or larger inside 198.18.0.0/15, e.g. --subnet 198.18.0.0/24")
        problem = unavailable()
        if problem is not None:
            raise problem
        o.out_dir.mkdir(parents=True, exist_ok=True)
        reclaimed = leftovers.reclaim()
        if reclaimed.get("runs"):
            o.progress(f"removed what {reclaimed['runs']} earlier rehearsal(s) left")
        t0 = time.monotonic()
        try:
            self._bring_up()
            if self._all_up():
                self._workload()
        finally:
            self._finish(time.monotonic() - t0)
        return self.report

    def _bring_up(self) -> None:
        o = self.opts
        ports = topology.Ports.of(o.config)
        self.ports = ports
        self.cfg = cfg = topology.rehearsal_config(o.config, ports, chaos=o.chaos)
        self.config_path = o.out_dir / "agentrl.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
        o.progress(f"model {o.config.model.path}: resolving (a built-in model is built once into {o.config.model.cache_dir})")
        from agentrl_cli.model.resolve import resolve_model_path

        resolve_model_path(o.config.model.path, o.config.model.cache_dir)
        self.net = net = Network.create(subnet=o.subnet, shared=topology.shared_paths(o.config, o.out_dir))
        o.progress(f"rehearsal {net.run_id}: {len(topology.NODES)} nodes on {o.subnet}, files in {o.out_dir}")
        # the trainer nodes first (trainer-0 takes the first address), each with what ssh needs mounted
        self.trainer_hosts = trainers.add_trainers(net, topology.TRAINERS, slots=cfg.training.world_size // len(topology.TRAINERS))
        for name, _ in topology.NODES:
            if name not in net.nodes:
                net.add_node(name)
        self.addresses = {n.name: n.address for n in net.nodes.values()}
        self.placement = topology.placement(self.addresses)
        planned = netplan.openings(cfg) + [netplan.gateway_service(cfg)]
        self.plan = [p for p in planned if f"{p.listener}:{p.first}" not in o.drop]
        self.dropped = [p.to_dict() for p in planned if f"{p.listener}:{p.first}" in o.drop]
        for node in net.nodes.values():
            firewall.apply(node, self.plan, self.placement)
        o.progress("firewall rules applied on every node from the plan (deny by default)")
        keys = services.write_keys(net.record.files / "keys")
        self.env = env = services.base_env(keys)
        logs, files, c, n = o.out_dir / "logs", net.record.files, self.config_path, net.nodes
        s = services
        for started in (s.postgres(n["postgres-0"], ports, files, logs, env, o.subnet), s.s3(n["s3-0"], ports, logs, env),
                        *[s.inference_server(n[x], c, ports, logs, env) for x in topology.SERVERS],
                        s.router(n["router-0"], ports, logs, env, cfg.inference.request_timeout_s),
                        *[s.sandbox_replica(n[x], c, ports, logs, env) for x in topology.REPLICAS],
                        s.load_balancer(n["sandbox-lb"], ports, files, logs, env),
                        s.reward_service(n["reward-0"], c, ports, logs, env), s.gateway(n["gateway-0"], c, ports, logs, env)):
            self.started[started.name] = started
        o.progress("services started: " + ", ".join(f"{k} ({v.node})" for k, v in self.started.items()))
        self.trainer_hosts.start_sshd()
        o.progress("trainer nodes reachable over ssh for the launcher: " + ", ".join(topology.TRAINERS))

    # ---- asking from a node ----------------------------------------------------------------------

    def ask(self, node: str, request: dict, timeout: float = 60.0) -> dict:
        """`probe.py`'s answer to `request`, asked from `node`."""
        try:
            done = self.net.nodes[node].run([*PROBE, json.dumps(request)], timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(exc.cmd, -9, exc.output or "", exc.stderr or "")
        try:
            return json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {"error": f"probe exited {done.returncode}: {(done.stderr or done.stdout)[-500:]}"}

    def refused(self) -> list[firewall.Refusal]:
        return firewall.refusals(self.net.nodes.values(), self.plan, self.placement)

    def _all_up(self) -> bool:
        """Every service answers from the trainer's node; False (with a failed check) once a service
        exited, the rules refused a connection, or the deadline passed."""
        o, p = self.opts, self.ports
        targets = [{"name": k, "url": v.url + ("/health" if not k.startswith(("s3", "postgres")) else "")}
                   for k, v in self.started.items() if not k.startswith("postgres")]
        targets.append({"name": "postgres-0", "tcp": f"postgres-0:{p.postgresql}"})
        deadline = time.monotonic() + o.up_deadline_s
        o.progress(f"waiting for {len(targets)} services to answer from trainer-0 (at most {o.up_deadline_s:.0f} s)")
        while True:
            exited = {k: v for k, v in self.started.items() if v.proc.poll() is not None}
            answer = self.ask("trainer-0", {"op": "up", "targets": targets, "timeout": 3})
            refused = self.refused()
            if not answer.get("down") and "error" not in answer and not exited:
                self.checks.append(Check.judge("services up on their nodes", True, sorted(answer["up"]),
                                               "every service answers from the trainer's node", ""))
                return True
            if exited or refused or time.monotonic() > deadline:
                why = "; ".join([*(f"{k} exited {v.proc.returncode} (see {v.log})" for k, v in exited.items()),
                                 *(r.message for r in refused)]) or f"not within {o.up_deadline_s:.0f} s: {answer.get('down') or answer}"
                self.checks.append(Check.judge("services up on their nodes", False, answer, "every service answers from the "
                                               "trainer's node", "see the services' logs and the refusals", detail=why))
                return False
            time.sleep(1.0)

    # ---- the workload ----------------------------------------------------------------------------

    def _workload(self) -> None:
        o, p = self.opts, self.ports
        bucket = self.ask("trainer-0", {"op": "bucket", "endpoint": f"http://s3-0:{p.s3}", "bucket": topology.BUCKET})
        self.checks.append(Check.judge("trajectory store bucket on the S3 node", "error" not in bucket, bucket,
                                       "created from the trainer's node", "see logs/s3-0.log"))
        self._gateway()
        self.run_id = f"rehearsal-{self.net.run_id}"
        o.progress(f"stage 8 smoke as a control-plane job from trainer-0: run {self.run_id} (its progress is in the job's log)")
        self._job()
        self._verify()
        self._replicas()
        self._servers()
        self._ledger()

    def _agentrl(self, node: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        env = {**self.env, **self.trainer_hosts.env}
        try:
            return self.net.nodes[node].run([*services.AGENTRL, *args], timeout=timeout, env=env, cwd=self.opts.out_dir)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, 124, exc.output or "", (exc.stderr or "") + f"\n(killed after {timeout:.0f} s)")

    def _job(self) -> None:
        c, o = str(self.config_path), self.opts
        stage = [*services.AGENTRL, "stage", "run", "8", "--config", c, "--run-id", self.run_id]
        chaos = None
        if o.chaos:
            from agentrl_cli.acceptance.rehearsal.faults import Chaos

            chaos = Chaos(self, o.out_dir / "runs" / self.run_id / "stage8" / "metrics.jsonl", hold_s=o.chaos_hold_s,
                          bound_s=o.chaos_bound_s)
            chaos.start()
            o.progress(f"chaos: {', '.join(f'{f.kind} ({f.node})' for f in chaos.faults)}, each once training moves, "
                       f"held {o.chaos_hold_s:.0f} s, recovered within {o.chaos_bound_s:.0f} s")
        try:
            done = self._agentrl("trainer-0", ["job", "submit", "--json", "--config", c, "--pool", "train", "--wait",
                                               "--timeout", str(int(o.deadline_s)), "--", *stage], o.deadline_s + 60)
        finally:
            if chaos is not None:
                chaos.stop()
                self.faults = [f.to_dict() for f in chaos.faults]
                for f in chaos.faults:
                    self.checks.append(Check.judge(f"chaos: {f.kind} ({f.node}) recovered", f.injected and f.recovered, f.to_dict(),
                                                   f"injected while training, recovered within {f.bound_s:.0f} s",
                                                   "see the run's logs/agentrl.log and the node's service log", detail=f.detail))
        job = _last_json(done.stdout)
        (o.out_dir / "logs" / "job-submit.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        report = o.out_dir / "runs" / self.run_id / "reports" / "stage-8.json"
        stage8 = json.loads(report.read_text()) if report.is_file() else None
        self.job = {"exit": done.returncode, "job": job, "stage8_report": str(report) if stage8 else None}
        self.checks.append(Check.judge("control-plane job in PostgreSQL ran stage 8 smoke", done.returncode == 0 and
                                       (job or {}).get("state") == "succeeded", {"exit": done.returncode, "state": (job or {}).get("state")},
                                       "the job succeeded", f"see {o.out_dir}/logs/job-submit.log and the job's log under "
                                       f"{o.out_dir}/runs/jobs", detail=(done.stderr or "")[-1500:]))
        failed = [] if stage8 is None else [c["name"] for c in stage8.get("checks", []) if c.get("status") == "fail"]
        self.checks.append(Check.judge("stage 8 smoke across the nodes", stage8 is not None and not failed,
                                       {"report": str(report), "failed": failed}, "stage 8's report with no failed check",
                                       f"see {report} and {o.out_dir}/runs/{self.run_id}/logs"))
        ranks_log = o.out_dir / "runs" / self.run_id
        hosts = sorted({h for p in ranks_log.glob("**/trainer-ranks/channel*") for h in _hosts_of(p)})
        self.trainer_ranks_hosts = hosts

    def _verify(self) -> None:
        c, o = str(self.config_path), self.opts
        done = self._agentrl("trainer-0", ["verify", "--json", "--config", c, "--run", self.run_id, "--record-only"], 900)
        (o.out_dir / "logs" / "verify.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        result = _last_json(done.stdout) or {}
        self.verify = {"exit": done.returncode, "status": result.get("status")}
        self.checks.append(Check.judge("agentrl verify on the run", done.returncode == 0, self.verify,
                                       "exit 0 (every layer passed or skipped with its reason)", f"see {o.out_dir}/logs/verify.log"))

    def _gateway(self) -> None:
        """A session opened from the trainer's node, an agent's chat call from a sandbox node through it."""
        p = self.ports
        opened = self.ask("trainer-0", {"op": "http", "method": "POST", "url": f"http://gateway-0:{p.gateway}/sessions",
                                        "json": {"meta": {"rehearsal": self.net.run_id}},
                                        "bearer_file": self.env["AGENTRL_GATEWAY__API_KEY_FILE"], "timeout": 30})
        session = json.loads(opened["text"]) if opened.get("status") == 200 else {}
        chat = {}
        if session:
            chat = self.ask("sandbox-0", {"op": "http", "method": "POST", "url": session["base_url"].rstrip("/") + "/chat/completions",
                                          "headers": {"Authorization": f"Bearer {session['api_key']}"}, "timeout": 120,
                                          "json": {"model": "policy", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "Say hi."}]}}, timeout=150)
        ok = chat.get("status") == 200
        self.gateway_result = {"session": opened.get("status"), "chat": chat.get("status"), "error": chat.get("error") or opened.get("error")}
        self.checks.append(Check.judge("gateway on its node: session from trainer-0, agent call from sandbox-0", ok, self.gateway_result,
                                       "a session, then a chat completion answered through the router",
                                       "see logs/gateway-0.log and logs/router-0.log",
                                       detail=(chat.get("text") or opened.get("text") or "")[:500]))

    def _replicas(self) -> None:
        import re

        counts = {}
        for name in topology.REPLICAS:
            got = self.ask("trainer-0", {"op": "http", "url": f"http://{name}:{self.ports.sandbox}/metrics", "timeout": 10})
            m = re.search(r"^agentrl_sandbox_pool_acquired (\S+)$", got.get("text", ""), re.M)
            counts[name] = float(m.group(1)) if m else None
        self.replica_counts = counts
        self.checks.append(Check.judge("both sandbox replicas served behind the load balancer",
                                       all(v for v in counts.values()), counts, "each replica handed out sandboxes",
                                       "see logs/sandbox-lb.log and the replicas' logs"))

    def _fence(self, before: list[firewall.Refusal]) -> None:
        """A connection the plan does not open is refused where it arrives: the sandbox node (where
        agents' code runs) to the trainer's rendezvous port, after the workload."""
        port = self.cfg.training.master_port if hasattr(self, "cfg") else None
        if port is None or "sandbox-0" not in self.net.nodes:
            return
        got = self.ask("sandbox-0", {"op": "up", "targets": [{"name": "rendezvous", "tcp": f"trainer-0:{port}"}], "timeout": 3})
        why = (got.get("down") or {}).get("rendezvous", "")
        new = [r for r in self.refused() if (r.source, r.port) not in {(b.source, b.port) for b in before}]
        named = [r.message for r in new]
        ok = "refused" in why.lower() and [(r.clients, r.port) for r in new] == [(("sandbox",), port)]
        self.checks.append(Check.judge("fence: sandbox node to the trainer's rendezvous port is refused", ok,
                                       {"probe": why or got, "refusals": named},
                                       f"connection refused, and named as sandbox -> trainer port {port}",
                                       "the rules let a connection in that the plan does not open: see `nft list ruleset` in the node"))

    def _servers(self) -> None:
        """Both inference servers behind the router answered the run's generations and serve the
        weight version the run published last (weight updates reach each server, not the router)."""
        stage8 = self.opts.out_dir / "runs" / self.run_id / "stage8"
        published = sorted(p.name for p in (stage8 / "weights").glob("v*"))
        serving, answered = {}, {}
        for name in topology.SERVERS:
            url = f"http://{name}:{self.ports.inference}"
            got = self.ask("trainer-0", {"op": "http", "url": f"{url}/get_weight_version", "timeout": 10})
            try:
                serving[name] = str(json.loads(got["text"])["weight_version"])
            except (KeyError, ValueError, TypeError):
                serving[name] = None
            log = self.started[name].log.read_text(errors="replace") if name in self.started else ""
            answered[name] = log.count('"POST /generate')
        last = str(int(published[-1][1:])) if published else None
        self.server_versions = {"published_last": last, "serving": serving, "generate_requests": answered}
        self.checks.append(Check.judge("both inference servers behind the router served the run and its weights",
                                       last is not None and all(v == last for v in serving.values()) and all(answered.values()),
                                       self.server_versions, "each server answered generations through the router and serves "
                                       "the last published weight version", "see logs/router-0.log and the servers' logs"))

    def _ledger(self) -> None:
        """Every trajectory the run trained on is in the store on the S3 node, none stored twice."""
        checkpoints = self.opts.out_dir / "runs" / self.run_id / "stage8" / "checkpoints"
        latest = sorted(checkpoints.glob("step-*"))
        if not latest:
            self.checks.append(Check.skipped("ledger: nothing lost or stored twice", f"no checkpoint with a ledger in {checkpoints}"))
            return
        inside = f"{topology.RUNS}/{self.run_id}/stage8/checkpoints/{latest[-1].name}"
        got = self.ask("trainer-0", {"op": "ledger", "config": str(self.config_path), "run_id": self.run_id, "phase": "smoke",
                                     "ledger": inside}, timeout=120)
        self.ledger = got
        ok = "error" not in got and got.get("trained", 0) > 0 and got.get("missing") == 0 and got.get("duplicated") == 0
        self.checks.append(Check.judge("ledger: nothing lost or stored twice", ok, got,
                                       "every trained trajectory in the S3 store once", "see the run's logs and logs/s3-0.log"))

    # ---- the end ---------------------------------------------------------------------------------

    def _finish(self, seconds: float) -> None:
        o = self.opts
        refusals = []
        if self.net is not None:
            try:
                refusals = self.refused()
            except NodesUnavailable as exc:
                self.checks.append(Check.skipped("firewall: roles use only planned ports", str(exc)))
            else:
                self.checks.append(firewall.check(refusals))
                self.used = [{"node": n.name, **u} for n in self.net.nodes.values() for u in firewall.used(n)]
                self._fence(refusals)
        nodes = [] if self.net is None else [{"name": n.name, "address": n.address, "roles": list(dict(topology.NODES)[n.name])}
                                            for n in self.net.nodes.values()]
        ok = bool(self.checks) and all(c.status != CheckStatus.FAIL for c in self.checks)
        self.report = {
            "schema_version": REPORT_SCHEMA, "rehearsal": None if self.net is None else self.net.run_id, "ok": ok,
            "seconds": round(seconds, 1), "dir": str(o.out_dir), "config": str(getattr(self, "config_path", "")),
            "nodes": nodes, "openings": {"planned": [p.to_dict() for p in getattr(self, "plan", [])], "left_out": getattr(self, "dropped", []),
                         "used": getattr(self, "used", [])},
            "refusals": [r.to_dict() for r in refusals],
            "workload": {"run_id": getattr(self, "run_id", None), "job": getattr(self, "job", None),
                         "verify": getattr(self, "verify", None), "gateway": getattr(self, "gateway_result", None),
                         "sandbox_replicas": getattr(self, "replica_counts", None),
                         "trainer_rank_hosts": getattr(self, "trainer_ranks_hosts", None),
                         "inference_servers": getattr(self, "server_versions", None), "ledger": getattr(self, "ledger", None)},
            "services": {k: {"node": v.node, "url": v.url, "log": str(v.log), "exit": v.proc.poll()} for k, v in self.started.items()},
            "faults": getattr(self, "faults", []),
            "checks": checks_to_json(self.checks),
        }
        if self.net is not None:
            o.progress("tearing down the nodes")
            self.report["teardown"] = self.net.teardown()
        (o.out_dir / "report.json").write_text(json.dumps(self.report, indent=1), encoding="utf-8")


def _last_json(text: str) -> dict | None:
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


def _hosts_of(path: Path) -> list[str]:
    try:
        return list(json.loads(path.read_text()).get("hosts", []))
    except (OSError, ValueError):
        return []
