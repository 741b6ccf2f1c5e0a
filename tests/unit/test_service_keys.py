"""Service keys and the audit log, without servers: two keys valid at once, a key file that rotates
under a ring that follows it, ids that never reveal a key, the sandbox service's refusal to start
without one, `agentrl secrets` printing ids only, and audit lines that go somewhere even when their
file cannot be written."""

from __future__ import annotations

import json
import stat

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.core.errors import UsageError
from agentrl_cli.envs.sandbox.service import check_exposure
from agentrl_cli.core.security import AuditLog, KeyRing, client_key, key_id, service_keys
from agentrl_cli.core.security.http import bearer_token
from agentrl_cli.core.security.keys import read_key_file, retire_old, rotate


def test_a_ring_accepts_each_of_its_keys_and_names_them_by_an_id_that_hides_them():
    ring = KeyRing.from_secret("new-key-0123456789\nold-key-0123456789\n")
    assert ring.current == "new-key-0123456789"
    assert ring.match("new-key-0123456789") == key_id("new-key-0123456789") == ring.ids()[0]
    assert ring.match("old-key-0123456789") == ring.ids()[1]
    for wrong in ("", None, "new-key-012345678", "new-key-0123456789x", "NEW-KEY-0123456789"):
        assert ring.match(wrong) is None
    assert all("key-0123456789" not in i and len(i) == 14 for i in ring.ids())
    assert KeyRing.from_secret(None) is None and KeyRing.from_secret(" \n") is None
    assert client_key("new-key-0123456789\nold-key-0123456789") == "new-key-0123456789"


def test_bearer_token_reads_only_the_bearer_scheme():
    assert bearer_token("Bearer abc") == "abc" and bearer_token(b"bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None and bearer_token("") is None and bearer_token(None) is None


def test_rotation_keeps_the_old_key_valid_until_retired_and_the_ring_follows_the_file(tmp_path):
    path = tmp_path / "keys" / "sandbox.key"
    _, first = rotate(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [old] = read_key_file(path)
    ring = KeyRing.from_file(path)
    assert ring.match(old) == first[0]
    before, after = rotate(path)
    new = read_key_file(path)[0]
    assert before == first and after == [key_id(new), key_id(old)]
    assert ring.match(new) == key_id(new) and ring.match(old) == key_id(old)  # both valid, no rebuild
    assert ring.current == new
    retire_old(path)
    assert ring.match(new) == key_id(new) and ring.match(old) is None
    rotate(path, keep_old=False)
    assert ring.match(new) is None and len(read_key_file(path)) == 1


def test_service_keys_follow_the_file_the_environment_names_unless_an_override_replaced_it(tmp_path):
    path = tmp_path / "reward.key"
    rotate(path)
    env = {"AGENTRL_REWARD__API_KEY_FILE": str(path)}
    cfg = load_config(None, [], env=env).config
    ring = service_keys(cfg, "reward", env)
    assert ring.path == path
    rotate(path)
    assert len(ring.keys) == 2  # a rotation reaches the running server
    overridden = load_config(None, ["reward.api_key=set-on-the-command-line"], env=env).config
    assert service_keys(overridden, "reward", env).keys == ("set-on-the-command-line",)
    assert service_keys(load_config(None, [], env={}).config, "reward", {}) is None


def test_the_sandbox_service_needs_a_key_unless_told_to_serve_loopback_without_one():
    ring = KeyRing.from_secret("k" * 20)
    check_exposure("0.0.0.0", ring, insecure_loopback=False)  # a key: anywhere
    check_exposure("127.0.0.1", None, insecure_loopback=True)
    check_exposure("::1", None, insecure_loopback=True)
    for host, insecure in (("0.0.0.0", False), ("0.0.0.0", True), ("10.1.2.3", True), ("127.0.0.1", False)):
        with pytest.raises(UsageError) as info:
            check_exposure(host, None, insecure_loopback=insecure)
        assert "AGENTRL_SANDBOX__API_KEY_FILE" in info.value.hint


def test_serve_sandbox_refuses_before_building_a_pool(cli):
    result = cli("serve", "sandbox", "--host", "0.0.0.0", "--set", "sandbox.backend=process")
    assert result.exit_code == 2 and "needs a key" in result.output
    result = cli("serve", "sandbox", "--set", "sandbox.backend=process")
    assert result.exit_code == 2 and "--insecure-loopback" in result.output


def test_secrets_commands_print_ids_never_keys(cli, tmp_path):
    path = tmp_path / "gateway.key"
    first = cli("secrets", "rotate", str(path), "--json")
    second = cli("secrets", "rotate", "gateway", "--json", env={"AGENTRL_GATEWAY__API_KEY_FILE": str(path)})
    keys = read_key_file(path)
    assert json.loads(second.stdout)["keys"] == [key_id(k) for k in keys] and len(keys) == 2
    assert json.loads(second.stdout)["before"] == json.loads(first.stdout)["keys"]
    retired = cli("secrets", "retire-old", str(path))
    shown = cli("secrets", "show", str(path), "--json")
    assert json.loads(shown.stdout)["keys"] == [key_id(keys[0])]
    for result in (first, second, retired, shown):
        assert result.exit_code == 0 and not any(k in result.output for k in keys)
    missing = cli("secrets", "rotate", "sandbox")
    assert missing.exit_code == 2 and "AGENTRL_SANDBOX__API_KEY_FILE is not set" in missing.output


def test_audit_lines_carry_the_fields_and_fall_back_to_stderr(tmp_path, capsys):
    log = AuditLog(tmp_path / "audit.jsonl", "sandbox")
    log.record(key_id="k-0123456789ab", method="POST", endpoint="/sandboxes/x/exec", status=200, client="127.0.0.1")
    log.record(key_id=None, method="POST", endpoint="/sandboxes", status=401)
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["outcome"], r["status"], r["key_id"]) for r in lines] == [("ok", 200, "k-0123456789ab"),
                                                                         ("unauthorized", 401, None)]
    assert set(lines[0]) == {"time", "service", "key_id", "method", "endpoint", "outcome", "status", "client"}
    (tmp_path / "blocked").write_text("a file where a directory should be")
    AuditLog(tmp_path / "blocked" / "audit.jsonl", "controlplane").record(key_id=None, method="POST", endpoint="/jobs", status=201)
    err = capsys.readouterr().err
    assert '"endpoint":"/jobs"' in err and err.startswith("audit ")
