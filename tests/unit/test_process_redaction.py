"""Secrets stay out of what a process writes: the redactor knows the secrets it was given (config,
AGENTRL_* variables, key files) on top of the store's patterns; once a process is protected, no log
record, print, warning or traceback carries one, JSON output still parses, and the stage reports,
metrics rows and `config show` come out redacted."""

from __future__ import annotations

import json
import subprocess
import sys

from agentrl_cli.config import load_config
from agentrl_cli.core.redaction import SecretRedactor
from agentrl_cli.runtime.observe.step_metrics import MetricsLog
from agentrl_cli.core.report import Check, CheckStatus, StageReport, write_report

PLANTED = "plant-0123456789abcdef"  # no pattern catches it: only knowing the value does


def test_the_secrets_given_are_redacted_wherever_they_appear(tmp_path):
    key_file = tmp_path / "sandbox.key"
    key_file.write_text("file-key-0123456789\nold-file-key-0123456789\n")
    env = {"AGENTRL_REWARD__API_KEY": PLANTED, "AGENTRL_SANDBOX__API_KEY_FILE": str(key_file),
           "MY_SERVICE_TOKEN": "env-token-0123456789", "AGENTRL_GATEWAY__API_KEY": "short"}
    cfg = load_config(None, ["inference.api_key=config-key-0123456789"], env={}).config
    r = SecretRedactor.build(cfg, env)
    text = f"a {PLANTED} b file-key-0123456789 c old-file-key-0123456789 d env-token-0123456789 e config-key-0123456789"
    assert r.text(text) == ("a [REDACTED:reward.api_key] b [REDACTED:sandbox.api_key] c [REDACTED:sandbox.api_key] "
                            "d [REDACTED:MY_SERVICE_TOKEN] e [REDACTED:inference.api_key]")
    assert r.text("the short one stays: short") == "the short one stays: short"  # too short to replace everywhere
    assert r.text("postgresql://agentrl:hunter2@db:5432/agentrl") == "postgresql://agentrl:[REDACTED:password]@db:5432/agentrl"


def test_json_stays_valid_when_a_secret_follows_an_escape():
    r = SecretRedactor.build(None, {"AGENTRL_REWARD__API_KEY": PLANTED})
    token = "aB3dE5fG7hJ9kL1mN3pQ5rS7tV9wX1yZ3bC5dF7"  # labelled: the pattern rule takes it
    doc = json.dumps({"detail": f"line\nBearer {token}\t{PLANTED}", "name": "é" + PLANTED})
    out = json.loads(r.text(doc))
    assert out == {"detail": "line\nBearer [REDACTED:bearer_token]\t[REDACTED:reward.api_key]",
                   "name": "é[REDACTED:reward.api_key]"}


def test_digests_and_file_names_a_process_prints_are_left_alone():
    r = SecretRedactor.build(None, {})
    line = "wrote data/date=2001-01-01/part-aB3dE5fG7hJ9kL1mN3pQ5rS7tV9wX1yZ3bC5dF7.parquet"
    assert r.text(line) == line


def test_an_html_page_keeps_its_images_whole():
    r = SecretRedactor.build(None, {"AGENTRL_REWARD__API_KEY": PLANTED})
    image = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" * 3
    page = f"<p>{PLANTED}</p><img src='{image}'>"
    assert r.html(page) == f"<p>[REDACTED:reward.api_key]</p><img src='{image}'>"


PROBE = r"""
import json, logging, sys, warnings
early = logging.getLogger("early")
early.addHandler(logging.StreamHandler(sys.stderr))  # holds the raw stream: only the record factory protects it
from agentrl_cli.core.redaction import protect_process
protect_process()
secret = "{secret}"
early.error("early handler: %s", secret)
logging.getLogger("late").error("no handler, last resort: key=%s", secret)
late = logging.getLogger("late.handled"); late.addHandler(logging.StreamHandler(sys.stdout)); late.propagate = False
late.warning("handler added later: " + secret)
try:
    raise RuntimeError("failed with " + secret)
except RuntimeError:
    logging.getLogger("tb").exception("a traceback")
warnings.warn("warned: " + secret)
print("printed", secret)
sys.stdout.write(json.dumps({{"detail": "x\n" + secret}}) + "\n")
sys.stderr.write("partial " + secret); sys.stderr.flush()
"""


def test_a_protected_process_writes_no_secret_anywhere():
    env = {"PATH": "/usr/bin:/bin", "AGENTRL_INFERENCE__API_KEY": PLANTED}
    done = subprocess.run([sys.executable, "-c", PROBE.format(secret=PLANTED)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    assert PLANTED not in both
    for seen in ("early handler: [REDACTED", "last resort: key=[REDACTED", "handler added later: [REDACTED",
                 "failed with [REDACTED", "warned: [REDACTED", "printed [REDACTED", "partial [REDACTED"):
        assert seen in both, (seen, both)
    assert json.loads(done.stdout.splitlines()[-1]) == {"detail": "x\n[REDACTED:inference.api_key]"}


def test_stage_reports_and_metrics_rows_are_written_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_REWARD__API_KEY", PLANTED)
    report = StageReport(stage=8, title="training", status=CheckStatus.FAIL, checks=[
        Check("harness output", CheckStatus.FAIL, {"sample": f"the tool said {PLANTED}"}, "nothing secret",
              detail=f"observation: {PLANTED}", hint="none")], started_at="2026-01-01T00:00:00Z", duration_s=1.0,
        run_id="r1", config_hash="0" * 16)
    json_path, md_path = write_report(report, tmp_path)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"train/step": 1, "env/h/last_error": f"tool failed: {PLANTED}"})
    log.close()
    for path in (json_path, md_path, tmp_path / "metrics.jsonl"):
        text = path.read_text()
        assert PLANTED not in text and "[REDACTED:reward.api_key]" in text, path
    assert json.loads(json_path.read_text())["checks"][0]["measured"] == {"sample": "the tool said [REDACTED:reward.api_key]"}


def test_config_show_masks_every_secret(cli, write_yaml):
    write_yaml("harnesses:\n  - name: terminal_like\n    options: {api_token: opt-token-0123456789}\n"
               "controlplane:\n  state_store: postgresql://agentrl:db-password-0123@db:5432/agentrl\n")
    env = {"AGENTRL_REWARD__API_KEY": PLANTED}
    for args in (("config", "show", "--json"), ("config", "show"),
                 ("config", "show", "--json", "--set", "sandbox.api_key=set-key-0123456789")):
        result = cli(*args, env=env)
        assert result.exit_code == 0, result.output
        for secret in (PLANTED, "opt-token-0123456789", "db-password-0123", "set-key-0123456789"):
            assert secret not in result.output, (args, secret)
    shown = json.loads(cli("config", "show", "--json", env=env).stdout)["config"]
    assert shown["harnesses"][0]["options"]["api_token"] == "[REDACTED:token]"
    assert shown["reward"]["api_key"] != PLANTED and shown["controlplane"]["state_store"].endswith("@db:5432/agentrl")


def test_log_arguments_stay_arguments_and_lose_their_secrets(monkeypatch):
    """Formatters that read a record's arguments (uvicorn's access log) still work once a process is protected."""
    import logging

    from uvicorn.logging import AccessFormatter

    from agentrl_cli.core import redaction

    monkeypatch.setattr(redaction._State, "factory", logging.LogRecord)
    monkeypatch.setattr(redaction._State, "redactor", SecretRedactor.build(None, {"AGENTRL_REWARD__API_KEY": PLANTED}))
    make = redaction._redacting_factory
    access = make("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                  ("127.0.0.1:5000", "GET", f"/score?k={PLANTED}", "1.1", 200), None)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s", use_colors=False).format(access)
    assert line == '127.0.0.1:5000 GET /score?k=[REDACTED:reward.api_key] HTTP/1.1 200 OK'
    split = make("x", logging.INFO, __file__, 1, "key=%s%s", (PLANTED[:6], PLANTED[6:]), None)
    assert split.args is None and PLANTED not in split.getMessage()  # a secret across two arguments: the whole line
    named = make("x", logging.INFO, __file__, 1, "%(who)s took %(ms).1f ms", ({"who": PLANTED, "ms": 2.25},), None)
    assert named.getMessage() == "[REDACTED:reward.api_key] took 2.2 ms"
