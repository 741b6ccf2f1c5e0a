"""Where the logs of agentrl's processes go, at what level, and how big they may grow.

- Library logs off stdout: agentrl writes results on stdout (`--json` must stay parseable). DeepSpeed's
  logger gets a handler on the stdout of whoever imports it first, and its accelerator probe logs a
  warning during that import; Transformers and accelerate import it on their own, so redirecting
  stdout around agentrl's own import is not enough. A filter on the `DeepSpeed` logger, installed
  before anything imports DeepSpeed, writes each record to stderr and stops it before the stdout
  handler; the logger's level still decides what is logged (`keep_library_logs_off_stdout`).
- The level (`observe.log_level`, `configure_logging`): agentrl's own loggers (`agentrl_cli…`,
  `agentrl…`, `harnesses…`, `stages…`) and DeepSpeed's log at it, to stderr; other libraries keep
  their own levels (warnings and above reach stderr). Every process a run starts gets the level:
  `agentrl serve …` children through AGENTRL_OBSERVE__LOG_LEVEL (`level_env`), which the config
  loader reads like any AGENTRL_ variable; trainer ranks through the same variable; SGLang through
  its `--log-level`. Secrets are redacted from every record by `observe.redaction.protect_process`.
- Size (`observe.log_max_mb`, `observe.log_backups`, `RunLogs`): a run's `logs/` directory holds
  `agentrl.log` (this process's agentrl records while the run is open; a RotatingFileHandler) and
  the output of the processes the run starts (servers, trainer ranks), which write to their file
  themselves. Those are rotated from outside by copy-and-truncate, as logrotate's `copytruncate`
  does: every CHECK_S seconds a file past the limit is copied to NAME.log.1 (older copies shift to
  .2 …, the oldest past `log_backups` is deleted) and truncated; the child writes in append mode, so
  it carries on at the start of the file. Lines written between the copy and the truncation are
  lost, and a file can pass the limit by what its process writes within CHECK_S.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from logging.handlers import RotatingFileHandler
from pathlib import Path

LIBRARY_LOGGERS = ("DeepSpeed",)
AGENTRL_LOGGERS = ("agentrl_cli", "agentrl", "harnesses", "stages")
LEVEL_ENV = "AGENTRL_OBSERVE__LOG_LEVEL"  # the config loader's name for observe.log_level
FORMAT = logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s")
RUN_LOG = "agentrl.log"
CHECK_S = 2.0
MB = 1024 * 1024


class ToStderr(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            sys.stderr.write(FORMAT.format(record) + "\n")
        except (OSError, ValueError):  # stderr closed: the record is dropped, never sent to stdout
            pass
        return False


def keep_library_logs_off_stdout() -> None:
    """Install the filter on each library logger (idempotent)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ToStderr) for f in logger.filters):
            logger.addFilter(ToStderr())


# ---- the level --------------------------------------------------------------------------------------

class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record comes (a redacting stream, a test's capture)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(FORMAT)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it once; the property reads sys.stderr instead
        pass


def configure_logging(level: str) -> None:
    """agentrl's loggers (and DeepSpeed's) at `level` (debug, info, warning, error), to stderr; idempotent."""
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        number = logging.INFO
    for name in AGENTRL_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(number)
        if not any(isinstance(h, StderrHandler) for h in logger.handlers):
            logger.addHandler(StderrHandler())
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(number)


def level_env(level: str) -> dict[str, str]:
    """The environment that gives a child agentrl process (a server, a trainer rank) the run's log level."""
    return {LEVEL_ENV: level}


# ---- size --------------------------------------------------------------------------------------------

class RotatingLog(RotatingFileHandler):
    """A RotatingFileHandler that also honours `backupCount=0`: the file starts again, nothing kept."""

    def doRollover(self) -> None:
        if self.backupCount > 0:
            super().doRollover()
            return
        if self.stream:
            self.stream.close()
        self.stream = open(self.baseFilename, "w", encoding=self.encoding)  # noqa: SIM115 - the handler owns it


def rotate_file(path: Path, backups: int) -> None:
    """Copy-and-truncate `path`: NAME.1 … NAME.<backups> shift up (the oldest deleted), NAME is copied to
    NAME.1 and truncated in place (its writer, in append mode, carries on at offset 0)."""
    path = Path(path)
    if backups > 0:
        Path(f"{path}.{backups}").unlink(missing_ok=True)
        for i in range(backups - 1, 0, -1):
            older = Path(f"{path}.{i}")
            if older.exists():
                os.replace(older, f"{path}.{i + 1}")
        shutil.copyfile(path, f"{path}.1")
    os.truncate(path, 0)


class RunLogs:
    """The log files of one run's `logs/` directory, kept to `max_mb` each with `backups` rotated
    copies: `agentrl.log` gets agentrl's records from this process, the others (the output of the
    processes the run started) are rotated by a thread every CHECK_S seconds."""

    def __init__(self, logs_dir: Path, max_mb: float, backups: int) -> None:
        self.dir = Path(logs_dir)
        self.max_bytes = max(1, int(max_mb * MB))
        self.backups = backups
        self.handler: RotatingLog | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RunLogs":
        self.dir.mkdir(parents=True, exist_ok=True)
        self.handler = RotatingLog(self.dir / RUN_LOG, maxBytes=self.max_bytes, backupCount=self.backups, encoding="utf-8")
        self.handler.setFormatter(FORMAT)
        for name in AGENTRL_LOGGERS:
            logging.getLogger(name).addHandler(self.handler)
        self._thread = threading.Thread(target=self._run, name="log-rotation", daemon=True)
        self._thread.start()
        return self

    def check(self) -> list[Path]:
        """Rotate the children's logs past the limit now; returns the files rotated."""
        rotated = []
        for path in sorted(self.dir.glob("*.log")):
            if path.name == RUN_LOG:
                continue
            try:
                if path.stat().st_size > self.max_bytes:
                    rotate_file(path, self.backups)
                    rotated.append(path)
            except OSError as exc:  # a file removed meanwhile, a full disk: tried again at the next check
                logging.getLogger(__name__).warning("rotating %s failed: %s", path, exc)
        return rotated

    def _run(self) -> None:
        while not self._stop.wait(CHECK_S):
            self.check()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.handler is not None:
            for name in AGENTRL_LOGGERS:
                logging.getLogger(name).removeHandler(self.handler)
            self.handler.close()
            self.handler = None
