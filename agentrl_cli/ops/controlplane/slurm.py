"""The Slurm executor: `sbatch --parsable` to submit, `squeue --json` to read state, `scancel` to cancel.

Pools are partitions; a job's priority class value becomes its Slurm job priority (`--priority`, which
needs an operator; other users get the same order through `--nice`); a job spans `spec.nodes` nodes
(`--nodes`: the training job, `agentrl job submit --training`, spans cluster.nodes; its command runs
on the first node, and `srun` in it starts a step on each); the pool's quota is the license
`<pool>_jobs` every job of the pool requests; preemption is the cluster's (partition PriorityTier with
PreemptMode=REQUEUE: a preempted job goes back to pending and runs again, its restart count up by one).
`agentrl controlplane render --executor slurm` prints the slurm.conf lines that make a cluster match
the pools. `squeue --json` ignores its filters in Slurm 22.05, so jobs are filtered here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from agentrl_cli.config.models import ControlPlaneConfig
from agentrl_cli.ops.controlplane.executor import (CANCELLED, FAILED, PENDING, RUNNING, SUCCEEDED, ExecutorUnavailable,
                                               JobSpec, JobStatus)
from agentrl_cli.ops.controlplane.slurm_conf import license_name
from agentrl_cli.core.errors import AgentrlError

STATES = {"PENDING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING, "REQUEUE_FED": PENDING, "CONFIGURING": PENDING,
          "RUNNING": RUNNING, "COMPLETING": RUNNING, "SUSPENDED": RUNNING, "STAGE_OUT": RUNNING, "SIGNALING": RUNNING,
          "RESIZING": RUNNING, "PREEMPTED": PENDING, "COMPLETED": SUCCEEDED, "CANCELLED": CANCELLED, "FAILED": FAILED,
          "TIMEOUT": FAILED, "NODE_FAIL": FAILED, "OUT_OF_MEMORY": FAILED, "BOOT_FAIL": FAILED, "DEADLINE": FAILED}
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")
TIMEOUT_S = 30.0


class SlurmError(AgentrlError):
    """A Slurm command failed; the message carries Slurm's own words."""

    exit_code = 1


class SlurmExecutor:
    name = "slurm"

    def __init__(self, cp: ControlPlaneConfig) -> None:
        self.cp = cp
        self._licenses: set[str] | None = None
        self._use_nice = False

    def check(self) -> None:
        missing = [c for c in COMMANDS if shutil.which(c) is None]
        if missing:
            raise ExecutorUnavailable(
                f"controlplane.executor is slurm but Slurm's commands are not installed here ({', '.join(missing)} missing)",
                "install the Slurm client (apt-get install slurm-client) on a host of the cluster, or set "
                "controlplane.executor: local")
        partitions = self.partitions()
        unknown = [p.name for p in self.cp.pools if p.name not in partitions]
        if unknown:
            raise ExecutorUnavailable(
                f"pool(s) {', '.join(unknown)} are not Slurm partitions (the cluster has: {', '.join(sorted(partitions)) or 'none'})",
                "add the partitions to slurm.conf (`agentrl controlplane render --executor slurm` prints the lines) "
                "or rename controlplane.pools to existing partitions")

    def partitions(self) -> set[str]:
        out = self._run(["sinfo", "--json"], "read the partitions")
        return {p for node in json.loads(out).get("nodes", []) for p in node.get("partitions") or []}

    def licenses(self) -> set[str]:
        if self._licenses is None:
            out = self._run(["scontrol", "show", "licenses", "-o"], "read the licenses")
            self._licenses = {part.split("=", 1)[1] for line in out.splitlines() for part in line.split()
                              if part.startswith("LicenseName=")}
        return self._licenses

    def preemption(self) -> str:
        out = self._run(["scontrol", "show", "config"], "read the config")
        settings = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if v}
        if settings.get("PreemptType", "preempt/none") == "preempt/none":
            return "this Slurm cluster has PreemptType=preempt/none (set preempt/partition_prio in slurm.conf)"
        return ""

    def submit(self, spec: JobSpec) -> str:
        name = f"agentrl-{spec.job_id}"
        existing = [j for j in self._jobs() if j.get("name") == name]
        if existing:  # a submission that went through before a leader change: do not run it twice
            return str(existing[0]["job_id"])
        argv = ["sbatch", "--parsable", f"--partition={spec.pool}", f"--job-name={name}", f"--cpus-per-task={spec.cpus}",
                f"--nodes={spec.nodes}", "--requeue", f"--output={spec.log_path}", f"--export=ALL,AGENTRL_JOB_ID={spec.job_id},"
                f"AGENTRL_JOB_POOL={spec.pool},AGENTRL_JOB_PRIORITY={spec.priority}"]
        if license_name(spec.pool) in self.licenses():
            argv.append(f"--licenses={license_name(spec.pool)}:1")
        if spec.log_path:
            Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        argv.append("--wrap=" + " ".join(_quote(a) for a in spec.command))
        try:
            out = self._run(self._with_priority(argv, spec), "submit the job")
        except SlurmError as exc:
            if self._use_nice or "priority" not in exc.message.lower() and "denied" not in exc.message.lower():
                raise
            self._use_nice = True  # not an operator: express the order as niceness instead
            out = self._run(self._with_priority(argv, spec), "submit the job")
        return out.strip().split(";")[0]

    def _with_priority(self, argv: list[str], spec: JobSpec) -> list[str]:
        top = max(p.value for p in self.cp.priorities)
        flag = f"--nice={top - spec.priority_value}" if self._use_nice else f"--priority={spec.priority_value}"
        return argv[:2] + [flag] + argv[2:]

    def poll(self, external_ids: list[str]) -> dict[str, JobStatus]:
        wanted = set(external_ids)
        statuses = {}
        for job in self._jobs():
            jid = str(job.get("job_id"))
            if jid not in wanted:
                continue
            raw = str(job.get("job_state", "")).upper()
            state = STATES.get(raw, PENDING)
            reason = str(job.get("state_reason") or "")
            reason = "" if reason == "None" else reason
            restarts = int(job.get("restart_cnt") or 0)
            if state == PENDING and restarts:
                reason = f"{reason or 'Requeued'} (requeued {restarts}x after preemption)"
            exit_code = _exit_code(job.get("exit_code")) if state in (SUCCEEDED, FAILED) else None
            if state == FAILED and not reason:
                reason = raw
            started = job.get("start_time") if state != PENDING else None
            statuses[jid] = JobStatus(state, reason, str(job.get("partition", "")), exit_code, restarts,
                                      float(started) if isinstance(started, int) and started > 0 else None)
        return statuses

    def cancel(self, external_id: str) -> None:
        self._run(["scancel", external_id], "cancel the job")

    def logs(self, external_id: str, spec: JobSpec) -> str:
        path = Path(spec.log_path)
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""

    def _jobs(self) -> list[dict]:
        return json.loads(self._run(["squeue", "--json"], "list the jobs")).get("jobs", [])

    def _run(self, argv: list[str], what: str) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except FileNotFoundError:
            raise ExecutorUnavailable(f"{argv[0]} is not installed", "install the Slurm client (apt-get install slurm-client) "
                                      "or set controlplane.executor: local") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{' '.join(argv[:2])}` did not answer within {TIMEOUT_S:.0f} s trying to {what}",
                             "check that slurmctld is up (scontrol ping)") from None
        if proc.returncode != 0:
            words = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
            raise SlurmError(f"Slurm could not {what}: {words}", "check the cluster with `sinfo` and `scontrol ping`; "
                             "a partition or license named in the error must exist in slurm.conf")
        return proc.stdout


def _exit_code(raw) -> int | None:
    """squeue reports the raw wait status (exit code << 8, or the signal number); -N means killed by signal N."""
    if not isinstance(raw, int):
        return None
    try:
        return os.waitstatus_to_exitcode(raw)
    except ValueError:
        return raw


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)
