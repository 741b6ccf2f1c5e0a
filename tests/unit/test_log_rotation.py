"""The log files of a run stay within observe.log_max_mb × (1 + observe.log_backups): agentrl's own
records (a RotatingFileHandler on `logs/agentrl.log`) and the output of a real child process started as
the run starts its servers (`launcher.start_process`, appending to `logs/<name>.log`), rotated from
outside by copy-and-truncate; the child carries on at the start of the file. observe.log_level reaches
a child agentrl process through the environment and takes effect in its loaders' logging; secrets
never reach agentrl.log."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

from agentrl_cli.config import load_config
from agentrl_cli.engines.inference.launcher import start_process
from agentrl_cli.core.logstreams import AGENTRL_LOGGERS, LEVEL_ENV, MB, RUN_LOG, RunLogs, configure_logging, level_env
from agentrl_cli.core.redaction import protect_process
from agentrl_cli.runtime.observe.step_metrics import MetricsLog

CHUNK = 40_000
CHILD = r"""
import os, sys, time
out = sys.stdout
out.write("a" * {chunk} + "\n"); out.flush()
end = time.monotonic() + 60
while not os.path.exists({go!r}) and time.monotonic() < end:  # the test rotates the file meanwhile
    time.sleep(0.02)
out.write("b" * 1000 + "\n"); out.flush()
"""


def wait_for(predicate, what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def sizes(logs, name: str) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in logs.glob(f"{name}*")}


def test_agentrl_log_rotates_at_the_limit_and_keeps_its_backups(tmp_path):
    logs = RunLogs(tmp_path / "logs", max_mb=10_000 / MB, backups=2).start()
    logger = logging.getLogger("agentrl_cli.test_rotation")
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        for i in range(400):  # ~40 KB of records, four times the limit
            logger.info("record %04d %s", i, "x" * 80)
    finally:
        logger.setLevel(old)
        logs.close()
    got = sizes(tmp_path / "logs", RUN_LOG)
    assert sorted(got) == ["agentrl.log", "agentrl.log.1", "agentrl.log.2"]  # the oldest beyond 2 backups dropped
    assert all(size <= 10_000 for size in got.values()) and sum(got.values()) <= 10_000 * 3
    assert "record 0399" in (tmp_path / "logs" / RUN_LOG).read_text()
    assert not any(isinstance(h, logging.Handler) and getattr(h, "baseFilename", "").endswith(RUN_LOG)
                   for name in AGENTRL_LOGGERS for h in logging.getLogger(name).handlers)  # removed on close


def test_zero_backups_starts_the_file_again(tmp_path):
    logs = RunLogs(tmp_path / "logs", max_mb=2_000 / MB, backups=0).start()
    logger = logging.getLogger("agentrl_cli.test_rotation")
    logger.setLevel(logging.INFO)
    try:
        for i in range(100):
            logger.info("record %04d %s", i, "y" * 80)
    finally:
        logger.setLevel(logging.NOTSET)
        logs.close()
    assert sorted(sizes(tmp_path / "logs", RUN_LOG)) == ["agentrl.log"]
    assert (tmp_path / "logs" / RUN_LOG).stat().st_size <= 2_000


def test_a_child_process_log_is_copied_and_truncated_and_the_child_carries_on(tmp_path):
    logs_dir, go = tmp_path / "logs", tmp_path / "go"
    child = start_process("child", [sys.executable, "-c", CHILD.format(chunk=CHUNK, go=str(go))], "http://127.0.0.1:1", logs_dir)
    log = logs_dir / "child.log"
    rotation = RunLogs(logs_dir, max_mb=10_000 / MB, backups=1)  # check() alone: no thread
    try:
        wait_for(lambda: log.stat().st_size > CHUNK, "the child's first chunk")
        assert rotation.check() == [log]
        assert (logs_dir / "child.log.1").stat().st_size == CHUNK + 1 and log.stat().st_size == 0
        go.touch()
        assert child.proc.wait(timeout=60) == 0
    finally:
        child.stop()
    data = log.read_bytes()
    assert data == b"b" * 1000 + b"\n"  # at offset 0, no hole of zeros where the old content was
    assert rotation.check() == []


def test_metrics_log_keeps_the_run_logs_in_bounds_while_open(tmp_path):
    observe = load_config(None, ["observe.log_max_mb=0.01", "observe.log_backups=1"], env={}).config.observe
    metrics = MetricsLog(tmp_path / "run" / "metrics.jsonl", observe, run_id="r")
    try:
        assert metrics.logs is not None and metrics.logs.handler.maxBytes == int(0.01 * MB)
        (tmp_path / "run" / "logs" / "hf-0.log").write_bytes(b"z" * 20_000)
        wait_for(lambda: (tmp_path / "run" / "logs" / "hf-0.log.1").exists(), "the rotation thread")
    finally:
        metrics.close()
    assert metrics.logs is None


def test_log_level_reaches_a_child_agentrl_process_through_the_environment(tmp_path):
    probe = ("import logging; from agentrl_cli.cli.commands.common import load; cfg = load(None, []).config; "
             "print(cfg.observe.log_level, logging.getLogger('agentrl_cli').level, logging.getLogger('harnesses').level)")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AGENTRL_")}
    out = subprocess.run([sys.executable, "-c", probe], env={**env, **level_env("debug")}, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["debug", str(logging.DEBUG), str(logging.DEBUG)]
    assert level_env("error") == {LEVEL_ENV: "error"}


def test_configure_logging_sends_agentrl_records_to_stderr_at_the_level(capsys):
    logger = logging.getLogger("agentrl_cli.test_levels")
    try:
        configure_logging("warning")
        logger.info("hidden at warning")
        logger.warning("shown at warning")
        configure_logging("debug")
        configure_logging("debug")  # idempotent: one handler
        logger.debug("shown at debug")
    finally:
        configure_logging("info")
    err = capsys.readouterr().err
    assert "hidden" not in err and err.count("shown at warning") == 1 and err.count("shown at debug") == 1


def test_secrets_never_reach_agentrl_log(tmp_path, monkeypatch):
    secret = "pw-7c1e9a2b4d6f8e0a1c3e"
    monkeypatch.setenv("SERVICE_PASSWORD", secret)
    protect_process()
    logs = RunLogs(tmp_path / "logs", max_mb=1, backups=1).start()
    try:
        logging.getLogger("agentrl_cli.test_rotation").error("connecting with %s", secret)
    finally:
        logs.close()
    text = (tmp_path / "logs" / RUN_LOG).read_text()
    assert secret not in text and "[REDACTED:SERVICE_PASSWORD]" in text
