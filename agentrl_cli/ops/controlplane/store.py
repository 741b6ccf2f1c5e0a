"""The state store: one SQL database (SQLite file by default, PostgreSQL by URL) with the schema the
tool creates and migrates itself, and the one write path that enforces the leader's fencing token.

Belongs here: connecting, the migration list, transactions, the fenced write. Not here: what the
tables mean (registry.py) or how a leader is chosen (lease.py).

SQL is written once with `?` placeholders; for PostgreSQL they become `%s`. Every write that changes
registry state goes through `fenced()`, which locks the lease row inside the same transaction and
refuses the write when the token it carries is not the current leader's term.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from agentrl_cli.core.errors import AgentrlError, ConfigError

LEASE_NAME = "controlplane"
PASSWORD_FILE_ENV = "AGENTRL_PGPASSWORD_FILE"  # a file holding the PostgreSQL password (a mounted Secret)

# Each migration is a list of statements; its index + 1 is the schema version it brings the store to.
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE IF NOT EXISTS leader_lease (name TEXT PRIMARY KEY, holder TEXT NOT NULL, term BIGINT NOT NULL,"
        " acquired_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS instances (id TEXT PRIMARY KEY, lease TEXT NOT NULL, host TEXT NOT NULL, pid BIGINT NOT NULL,"
        " started_at DOUBLE PRECISION NOT NULL, last_seen DOUBLE PRECISION NOT NULL, term BIGINT NOT NULL DEFAULT 0)",
        "CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS config_versions (hash TEXT PRIMARY KEY, config_json TEXT NOT NULL,"
        " created_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, experiment TEXT NOT NULL REFERENCES experiments(name),"
        " config_hash TEXT NOT NULL REFERENCES config_versions(hash), created_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS results (run_id TEXT NOT NULL REFERENCES runs(run_id), kind TEXT NOT NULL,"
        " name TEXT NOT NULL, status TEXT NOT NULL, report_json TEXT NOT NULL, recorded_at DOUBLE PRECISION NOT NULL,"
        " fence BIGINT NOT NULL, PRIMARY KEY (run_id, kind, name))",
        "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, pool TEXT NOT NULL, priority TEXT NOT NULL,"
        " priority_value BIGINT NOT NULL, command_json TEXT NOT NULL, cpus BIGINT NOT NULL, state TEXT NOT NULL,"
        " reason TEXT NOT NULL DEFAULT '', executor TEXT NOT NULL, external_id TEXT NOT NULL DEFAULT '',"
        " exit_code BIGINT, restarts BIGINT NOT NULL DEFAULT 0, log_path TEXT NOT NULL DEFAULT '',"
        " submitted_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION, ended_at DOUBLE PRECISION,"
        " updated_at DOUBLE PRECISION NOT NULL, fence BIGINT NOT NULL DEFAULT 0, cancel_requested BIGINT NOT NULL DEFAULT 0)",
        "CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state)",
    ],
    [  # 2: the nodes a job spans (the training job: cluster.nodes)
        "ALTER TABLE jobs ADD COLUMN nodes BIGINT NOT NULL DEFAULT 1",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreUnreachable(AgentrlError):
    """The state store URL names a database that cannot be opened."""


class FencedOut(AgentrlError):
    """A write carried a fencing token older than the current leader's term: this instance was deposed."""

    exit_code = 1


class StateStore:
    """A connection to the state store. Not shared between threads; open one per instance."""

    def __init__(self, url: str, base_dir: Path | None = None, connect_timeout_s: float = 5.0) -> None:
        self.url = url
        self.kind, self._target = _parse(url, base_dir)
        self._conn = self._connect(connect_timeout_s)
        self.migrate()

    @property
    def display_url(self) -> str:
        """The URL with any password removed (safe for reports)."""
        parts = urlsplit(self.url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return parts._replace(netloc=netloc).geturl()
        return self.url

    def _connect(self, timeout_s: float):
        if self.kind == "sqlite":
            path = Path(self._target)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA foreign_keys=ON")
            except (OSError, sqlite3.Error) as exc:
                raise StoreUnreachable(f"state store {self.url} cannot be opened: {exc}",
                                       "point controlplane.state_store at a writable path (sqlite:///runs/state.db)") from None
            return conn
        import psycopg

        # a password file (a mounted Kubernetes Secret): libpq ignores a PGPASSFILE that its group may read,
        # and a Secret volume with fsGroup always is, so agentrl reads this one itself
        extra = {}
        pw_file = os.environ.get(PASSWORD_FILE_ENV)
        if pw_file and not os.environ.get("PGPASSWORD"):
            try:
                extra["password"] = Path(pw_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise StoreUnreachable(f"{PASSWORD_FILE_ENV} names {pw_file}, which cannot be read: {exc}",
                                       f"point {PASSWORD_FILE_ENV} at a readable file holding the password, or unset it") from None
        try:
            return psycopg.connect(self._target, autocommit=True, connect_timeout=max(1, int(timeout_s)), **extra)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnreachable(
                f"state store {self.display_url} is unreachable: {first}",
                "start PostgreSQL or fix controlplane.state_store (postgresql://USER@HOST:PORT/DB; the password "
                f"comes from PGPASSWORD, the file ${PASSWORD_FILE_ENV} names, or ~/.pgpass)") from None

    def reconnect(self, timeout_s: float = 5.0) -> None:
        """Drop the connection and open a new one (after the database restarted or the network dropped)."""
        self.close()
        self._conn = self._connect(timeout_s)

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection must not raise
            pass

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- SQL -------------------------------------------------------------------------------------
    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.kind == "postgresql" else sql

    @contextmanager
    def transaction(self) -> Iterator["Tx"]:
        """One write transaction. SQLite takes the database write lock at BEGIN (IMMEDIATE)."""
        begin = "BEGIN IMMEDIATE" if self.kind == "sqlite" else "BEGIN"
        cur = self._conn.cursor()
        cur.execute(begin)
        try:
            yield Tx(self, cur)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(sql), params)
            cols = [d[0] for d in cur.description] if cur.description else []
            return [dict(zip(cols, row)) for row in cur.fetchall()]
        finally:
            cur.close()

    def now(self) -> float:
        """Seconds since the epoch on the store's clock (PostgreSQL's, so instances on several hosts agree)."""
        if self.kind == "postgresql":
            return float(self.query("SELECT extract(epoch from clock_timestamp()) AS t")[0]["t"])
        return time.time()

    # -- schema ----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        rows = self.query("SELECT max(version) AS v FROM schema_migrations")
        return int(rows[0]["v"] or 0)

    def migrate(self) -> int:
        """Create the schema or bring it to SCHEMA_VERSION; safe to run from several instances at once."""
        cur = self._conn.cursor()
        try:
            cur.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        finally:
            cur.close()
        with self.transaction() as tx:
            if self.kind == "postgresql":
                tx.execute("LOCK TABLE schema_migrations IN EXCLUSIVE MODE")
            current = int(tx.one("SELECT max(version) AS v FROM schema_migrations")["v"] or 0)
            if current > SCHEMA_VERSION:
                raise ConfigError(f"state store {self.display_url} has schema version {current}, newer than this agentrl's "
                                  f"{SCHEMA_VERSION}", "upgrade agentrl, or point controlplane.state_store at another store")
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for stmt in MIGRATIONS[version - 1]:
                    tx.execute(stmt)
                tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, time.time()))
        return SCHEMA_VERSION

    # -- the fenced write ------------------------------------------------------------------------
    @contextmanager
    def fenced(self, token: int, lease: str = LEASE_NAME) -> Iterator["Tx"]:
        """A transaction that commits only if `token` is the current term of `lease`; else FencedOut."""
        with self.transaction() as tx:
            lock = " FOR UPDATE" if self.kind == "postgresql" else ""
            row = tx.one(f"SELECT term, holder FROM leader_lease WHERE name = ?{lock}", (lease,))
            current = int(row["term"]) if row else 0
            if token != current:
                raise FencedOut(f"write refused: fencing token {token} is stale (the current leader term is {current}, "
                                f"held by {row['holder'] if row else 'nobody'})",
                                "this instance lost the leader lease; it must stop writing and rejoin as a follower")
            yield tx


class Tx:
    """A cursor inside one transaction, with `?` placeholders for both databases."""

    def __init__(self, store: StateStore, cur) -> None:
        self._store, self._cur = store, cur

    def execute(self, sql: str, params: tuple = ()) -> int:
        self._cur.execute(self._store._sql(sql), params)
        return self._cur.rowcount

    def all(self, sql: str, params: tuple = ()) -> list[dict]:
        self._cur.execute(self._store._sql(sql), params)
        cols = [d[0] for d in self._cur.description]
        return [dict(zip(cols, row)) for row in self._cur.fetchall()]

    def one(self, sql: str, params: tuple = ()) -> dict[str, Any] | None:
        rows = self.all(sql, params)
        return rows[0] if rows else None


def _parse(url: str, base_dir: Path | None) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        raw = url[len("sqlite://"):]
        if not raw.startswith("/") or raw == "/":
            raise ConfigError(f"controlplane.state_store {url!r} has no file path",
                              "use sqlite:///relative/path.db or sqlite:////absolute/path.db")
        path = Path(raw[1:])  # sqlite:///rel/path.db is relative, sqlite:////abs/path.db absolute
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        return "sqlite", str(path)
    if parts.scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        target = url.replace("postgresql+psycopg://", "postgresql://", 1).replace("postgres://", "postgresql://", 1)
        if not parts.hostname and "host=" not in (parts.query or "") and not os.environ.get("PGHOST"):
            raise ConfigError(f"controlplane.state_store {url!r} names no host",
                              "use postgresql://USER@HOST:PORT/DATABASE")
        return "postgresql", target
    raise ConfigError(f"controlplane.state_store {url!r} is not a state store URL",
                      "use sqlite:///runs/state.db (the default) or postgresql://USER@HOST:PORT/DATABASE")
