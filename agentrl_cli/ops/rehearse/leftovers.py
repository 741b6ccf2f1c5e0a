"""Removing what a rehearsal made: `remove(record)` ends one run (its own teardown, or a later process
cleaning up after it), `reclaim()` finds every run whose owner is gone (by its record under the state
directory, or by a namespace named `agrl-<run id>-...` whose record was lost) and removes it.
`agentrl sandbox reclaim` runs `reclaim()`.

Removal is idempotent and ordered: kill every process inside the run's namespaces (and the ones it
recorded, if still the same processes) and wait for them, delete the namespaces (a node's veth pair,
the switch's bridge and a node's firewall rules, `firewall.py`, go with them; the mounts inside its processes went with the processes),
remove the run's files and the mount points it created, unmount /run/netns if this run mounted it
and no namespace is left in it, and delete the record last. A run whose owner still runs is never
touched: a record names its owner's pid and start time; a namespace whose record is lost names only
the pid, and is kept while any process has that pid (perhaps a reuse: kept, never wrongly removed).
A rehearsal calls `reclaim()` before it builds its own network.

Belongs here: what to remove and in which order. Does not: making nodes (`nodes.py`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from agentrl_cli.ops.rehearse.host import NETNS_DIR, alive, ip, is_mountpoint, kill_and_wait, netns_names, pids_in, unavailable
from agentrl_cli.ops.rehearse.record import STATE_DIR, RunRecord, owner_pid, records, run_of


def _zero() -> dict:
    return {"runs": 0, "namespaces": 0, "processes": 0, "dirs": 0, "errors": 0}


def remove(rec: RunRecord) -> dict:
    """Remove everything `rec` says its run made; returns counts of what was removed."""
    counts = _zero()
    pids = {p for ns in rec.namespaces for p in pids_in(ns)}
    pids |= {pid for pid, start in rec.processes if alive(pid, start)}
    counts["processes"] = kill_and_wait(sorted(pids))
    counts["errors"] += sum(1 for p in pids if alive(p, None))
    present = set(netns_names())
    for ns in reversed(rec.namespaces):  # the nodes, then the switch
        if ns in present:
            ok = ip("netns", "del", ns, check=False).returncode == 0
            counts["namespaces" if ok else "errors"] += 1
    for d in reversed(rec.made_dirs):
        path = Path(d)
        if path == rec.files:
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.rmdir()  # a mount point this run created: only while empty
            except OSError:
                continue
        counts["dirs"] += not path.exists()
    _release_netns_dir(rec)
    rec.path.unlink(missing_ok=True)
    made = (STATE_DIR, STATE_DIR.parent) if rec.path.parent == STATE_DIR else (rec.path.parent,)
    for d in made:  # the state directory (and /run/agentrl), once empty
        try:
            d.rmdir()
        except OSError:
            break
    return counts


def _release_netns_dir(rec: RunRecord) -> None:
    """Undo `ip netns add`'s own mount of /run/netns (and the directory) when this run made them and
    no namespace, ours or another's, is left in it."""
    if not rec.netns_mount_made or netns_names() or not is_mountpoint(NETNS_DIR):
        return
    subprocess.run(["umount", str(NETNS_DIR)], capture_output=True, timeout=30)
    if rec.netns_dir_made and not is_mountpoint(NETNS_DIR):
        try:
            NETNS_DIR.rmdir()
        except OSError:
            pass


def reclaim(state_dir: Path = STATE_DIR) -> dict:
    """Remove every rehearsal run whose owner process is gone; idempotent, and a no-op when nothing
    is left. Counts `runs`, `namespaces`, `processes`, `dirs` and `errors`; `unavailable` (with the
    fix) when leftovers exist but this process cannot remove them (not root, iproute2 missing)."""
    counts = _zero()
    found = records(Path(state_dir))
    by_name: dict[str, list[str]] = {}
    for ns in netns_names():
        if (run := run_of(ns)) is not None:
            by_name.setdefault(run, []).append(ns)
    if not found and not by_name:
        return counts
    problem = unavailable()
    if problem is not None:
        counts["unavailable"] = f"{problem.message}; fix: {problem.hint}"
        return counts
    dead = [rec for rec in found if not alive(owner_pid(rec.run), rec.owner_start)]
    known = {rec.run for rec in found}
    for run, names in sorted(by_name.items()):  # namespaces whose record is lost (another state dir, deleted)
        if run not in known and not alive(owner_pid(run), None):
            dead.append(RunRecord(run=run, state_dir=str(state_dir), namespaces=sorted(names, key=lambda n: not n.endswith("-switch"))))
    for rec in dead:
        for key, n in remove(rec).items():
            counts[key] += n
        counts["runs"] += 1
    return counts
