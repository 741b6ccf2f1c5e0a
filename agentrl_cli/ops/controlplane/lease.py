"""The leader lease: which control-plane instance may change registry state, and its fencing token.

One row in `leader_lease` names the holder, its term and when the lease expires. An instance that
holds the lease renews it; when the lease has expired, any instance may take it and the term goes
up by one. The term is the fencing token: every registry write carries it, and the store refuses a
write whose token is not the current term (store.fenced), so a deposed leader that wakes up late
cannot change anything. Times come from the store's clock.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from agentrl_cli.ops.controlplane.store import LEASE_NAME, StateStore


@dataclass(frozen=True)
class LeaseState:
    leader: bool          # this instance holds the lease now
    term: int             # the current term (this instance's fencing token when leader)
    holder: str           # instance id of the current holder ('' if never held)
    expires_at: float     # store-clock time the current lease ends
    now: float            # store-clock time of this observation


def new_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LeaderLease:
    """Acquire, renew and release the lease for one instance id."""

    def __init__(self, store: StateStore, instance_id: str, lease_seconds: float, name: str = LEASE_NAME) -> None:
        self.store, self.instance_id, self.lease_seconds, self.name = store, instance_id, lease_seconds, name
        self.term = 0  # the fencing token while leader; 0 when not

    def try_acquire(self) -> LeaseState:
        """Renew if held, take over if expired or never held; otherwise observe the current leader."""
        lock = " FOR UPDATE" if self.store.kind == "postgresql" else ""
        with self.store.transaction() as tx:
            now = self.store.now()
            row = tx.one(f"SELECT holder, term, expires_at FROM leader_lease WHERE name = ?{lock}", (self.name,))
            expires = now + self.lease_seconds
            if row is None:
                tx.execute("INSERT INTO leader_lease (name, holder, term, acquired_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                           (self.name, self.instance_id, 1, now, expires))
                state = LeaseState(True, 1, self.instance_id, expires, now)
            elif row["holder"] == self.instance_id and int(row["term"]) == self.term and row["expires_at"] > now:
                tx.execute("UPDATE leader_lease SET expires_at = ? WHERE name = ? AND term = ?", (expires, self.name, self.term))
                state = LeaseState(True, self.term, self.instance_id, expires, now)
            elif row["expires_at"] <= now:
                term = int(row["term"]) + 1
                tx.execute("UPDATE leader_lease SET holder = ?, term = ?, acquired_at = ?, expires_at = ? WHERE name = ?",
                           (self.instance_id, term, now, expires, self.name))
                state = LeaseState(True, term, self.instance_id, expires, now)
            else:
                state = LeaseState(False, int(row["term"]), row["holder"], float(row["expires_at"]), now)
            self._heartbeat(tx, now, state.term if state.leader else 0)
        self.term = state.term if state.leader else 0
        return state

    def release(self) -> None:
        """Give the lease up at once (a clean shutdown), so a follower need not wait for it to expire."""
        if not self.term:
            return
        with self.store.transaction() as tx:
            tx.execute("UPDATE leader_lease SET expires_at = ? WHERE name = ? AND holder = ? AND term = ?",
                       (0.0, self.name, self.instance_id, self.term))
            tx.execute("DELETE FROM instances WHERE id = ?", (self.instance_id,))
        self.term = 0

    def leave(self) -> None:
        """Remove this instance from the member list (followers on shutdown)."""
        with self.store.transaction() as tx:
            tx.execute("DELETE FROM instances WHERE id = ?", (self.instance_id,))

    def _heartbeat(self, tx, now: float, term: int) -> None:
        updated = tx.execute("UPDATE instances SET last_seen = ?, term = ? WHERE id = ?", (now, term, self.instance_id))
        if not updated:
            tx.execute("INSERT INTO instances (id, lease, host, pid, started_at, last_seen, term) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (self.instance_id, self.name, socket.gethostname(), os.getpid(), now, now, term))


def cluster_view(store: StateStore, lease_seconds: float, name: str = LEASE_NAME) -> dict:
    """Leader, term, lease expiry and the instances seen within two leases (for `controlplane status`)."""
    now = store.now()
    row = store.query("SELECT holder, term, acquired_at, expires_at FROM leader_lease WHERE name = ?", (name,))
    lease = row[0] if row else None
    members = store.query("SELECT id, host, pid, last_seen, term FROM instances WHERE lease = ? ORDER BY started_at", (name,))
    live = [m for m in members if now - float(m["last_seen"]) <= 2 * lease_seconds]
    leader = lease["holder"] if lease and float(lease["expires_at"]) > now else ""
    return {
        "leader": leader,
        "term": int(lease["term"]) if lease else 0,
        "lease_expires_in_s": round(float(lease["expires_at"]) - now, 3) if lease and leader else 0.0,
        "followers": [m["id"] for m in live if m["id"] != leader],
        "instances": [{"id": m["id"], "host": m["host"], "pid": int(m["pid"]), "believes_leader": int(m["term"]) > 0,
                       "last_seen_s_ago": round(now - float(m["last_seen"]), 3)} for m in live],
    }
