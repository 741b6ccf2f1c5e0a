"""The state store, the leader lease and fencing on SQLite (the same suite runs on PostgreSQL in
tests/integration/test_postgres.py)."""

from __future__ import annotations

import sqlite3

import pytest

from agentrl_cli.ops.controlplane.lease import LeaderLease, cluster_view
from agentrl_cli.ops.controlplane.registry import Registry
from agentrl_cli.ops.controlplane.store import SCHEMA_VERSION, FencedOut, StateStore, StoreUnreachable
from agentrl_cli.core.errors import ConfigError


def lease_contract(url: str) -> None:
    """What every state store must do; shared with the PostgreSQL tests."""
    a_store, b_store = StateStore(url), StateStore(url)
    try:
        a, b = LeaderLease(a_store, "a", 30.0), LeaderLease(b_store, "b", 30.0)
        first, second = a.try_acquire(), b.try_acquire()
        assert (first.leader, second.leader) == (True, False) and second.holder == "a"
        assert a.try_acquire().term == first.term  # renewing keeps the term
        registry_a = Registry(a_store)
        registry_a.record_run(first.term, "run-1", "exp", "hash-1", {"k": 1})
        # the leader's lease runs out without renewal: the follower takes over with a higher term
        a_store.query("UPDATE leader_lease SET expires_at = 0") if a_store.kind == "sqlite" else _expire(a_store)
        taken = b.try_acquire()
        assert taken.leader and taken.holder == "b" and taken.term == first.term + 1
        with pytest.raises(FencedOut, match="stale"):
            registry_a.record_result(first.term, "run-1", "stage", "3", "pass", {})
        Registry(b_store).record_result(taken.term, "run-1", "stage", "3", "pass", {})
        assert [r["fence"] for r in Registry(b_store).results("run-1")] == [taken.term]
        assert not a.try_acquire().leader  # the deposed instance is a follower now
        view = cluster_view(b_store, 30.0)
        assert view["leader"] == "b" and view["followers"] == ["a"]
        b.release()  # a clean shutdown hands over at once
        assert a.try_acquire().leader
        a.release()
    finally:
        a_store.close()
        b_store.close()


def _expire(store: StateStore) -> None:
    with store.transaction() as tx:
        tx.execute("UPDATE leader_lease SET expires_at = 0")


def test_schema_is_created_and_migrating_again_changes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/state.db"
    with StateStore(url) as store:
        assert store.schema_version() == SCHEMA_VERSION
    with StateStore(url) as store:
        assert store.migrate() == SCHEMA_VERSION
        assert [r["version"] for r in store.query("SELECT version FROM schema_migrations")] == list(range(1, SCHEMA_VERSION + 1))


def test_one_leader_takeover_and_a_stale_token_is_refused_on_sqlite(tmp_path):
    lease_contract(f"sqlite:///{tmp_path}/state.db")


def test_a_newer_schema_than_this_agentrl_knows_is_a_clear_error(tmp_path):
    db = tmp_path / "state.db"
    StateStore(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, 0)")
    with pytest.raises(ConfigError, match="schema version 99"):
        StateStore(f"sqlite:///{db}")


@pytest.mark.parametrize("url, words", [("mysql://db/x", "not a state store URL"), ("sqlite://", "no file path"),
                                        ("postgresql:///db", "names no host")])
def test_bad_store_urls_name_the_fix(url, words, monkeypatch):
    monkeypatch.delenv("PGHOST", raising=False)
    with pytest.raises(ConfigError, match=words) as info:
        StateStore(url)
    assert "postgresql://" in info.value.hint or "sqlite:///" in info.value.hint


def test_an_unwritable_sqlite_path_is_unreachable_with_a_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreUnreachable) as info:
        StateStore(f"sqlite:///{blocker}/sub/state.db")
    assert "controlplane.state_store" in info.value.hint


def test_an_unreachable_postgresql_url_is_a_clear_error_with_the_fix():
    from tests.conftest import free_port

    with pytest.raises(StoreUnreachable) as info:
        StateStore(f"postgresql://agentrl@127.0.0.1:{free_port()}/agentrl", connect_timeout_s=2)
    assert "is unreachable" in info.value.message and "start PostgreSQL or fix controlplane.state_store" in info.value.hint


def test_a_password_file_that_cannot_be_read_is_a_clear_error(monkeypatch, tmp_path):
    from tests.conftest import free_port

    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("AGENTRL_PGPASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(StoreUnreachable) as info:
        StateStore(f"postgresql://agentrl@127.0.0.1:{free_port()}/agentrl", connect_timeout_s=2)
    assert "AGENTRL_PGPASSWORD_FILE names" in info.value.message and "cannot be read" in info.value.message
