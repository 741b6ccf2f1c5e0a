"""Removing what a rehearsal made: `remove(record)` ends one run (its own teardown, or a later process
cleaning up after it), `reclaim()` finds every run whose owner is gone (by its record under the state
directory, or by a namespace named `agrl-<run id>-...` whose record was lost) and removes it.
`agentrl sandbox reclaim` runs `reclaim()`.

Removal is idempotent and ordered: kill every process inside the run's namespaces (and the ones it
recorded, if still the same processes) and wait for them, delete the namespaces (a node's veth pair,
the switch's bridge and a node's firewall rules, `firewall.py`, go with them; the mounts inside its processes went with the processes),
remove the run's files and the mount points it created (one that another live run's nodes mount over,
as two rehearsals at once both mount /run/sshd, waits in the state directory's pending-dirs.json
instead, and the last run to end removes it), unmount /run/netns if this run mounted it
and no namespace is left in it, and delete the record last. A run whose owner still runs is never
touched: a record names its owner's pid and start time; a namespace whose record is lost names only
the pid, and is kept while any process has that pid (perhaps a reuse: kept, never wrongly removed).
A rehearsal calls `reclaim()` before it builds its own network.

Belongs here: what to remove and in which order. Does not: making nodes (`nodes.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from agentrl_cli.ops.rehearse.host import NETNS_DIR, alive, ip, is_mountpoint, kill_and_wait, netns_names, pids_in, unavailable
from agentrl_cli.ops.rehearse.record import STATE_DIR, RunRecord, owner_pid, records, run_of

PENDING = "pending-dirs.json"  # in the state directory: mount points waiting for their last user to end


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
    if str(rec.files) in rec.made_dirs:
        shutil.rmtree(rec.files, ignore_errors=True)
        counts["dirs"] += not rec.files.exists()
    state = Path(rec.state_dir)
    others = [r for r in records(state) if r.run != rec.run and alive(owner_pid(r.run), r.owner_start)]
    mine = [d for d in rec.made_dirs if Path(d) != rec.files]
    waiting = []
    # deepest first: a mount point before the directories made for it
    for d in sorted(dict.fromkeys(mine + _pending(state)), key=lambda d: d.count("/"), reverse=True):
        if _still_used(d, others):  # another live run's nodes mount over it: the last user removes it
            waiting.append(d)
            continue
        try:
            Path(d).rmdir()  # a mount point a run created: only while empty
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not empty: something else's now; left alone
        counts["dirs"] += d in mine
    _save_pending(state, waiting)
    _release_netns_dir(rec)
    rec.path.unlink(missing_ok=True)
    made = (STATE_DIR, STATE_DIR.parent) if rec.path.parent == STATE_DIR else (rec.path.parent,)
    for d in made:  # the state directory (and /run/agentrl), once empty
        try:
            d.rmdir()
        except OSError:
            break
    return counts


def _still_used(directory: str, others: list[RunRecord]) -> bool:
    """Whether a live run's nodes mount over `directory` or under it (say /run/sshd, or the shared
    /srv/agentrl/runs): removing it now would take the mount away from that run's processes."""
    prefix = directory.rstrip("/") + "/"
    return any(m == directory or m.startswith(prefix) for r in others for m in r.mount_points)


def _pending(state: Path) -> list[str]:
    """Mount points an ended run made while another run still used them, left for the last user."""
    try:
        found = json.loads((state / PENDING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [d for d in found if isinstance(d, str) and d.startswith("/")] if isinstance(found, list) else []


def _save_pending(state: Path, dirs: list[str]) -> None:
    path = state / PENDING
    if not dirs:
        path.unlink(missing_ok=True)
        return
    state.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(set(dirs))), encoding="utf-8")
    os.replace(tmp, path)


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
