"""Third-party logs kept off stdout, where agentrl writes results (`--json` must stay parseable).

DeepSpeed's logger gets a handler on the stdout of whoever imports it first, and its accelerator
probe logs a warning during that import. Transformers and accelerate import it on their own (any
model load), so redirecting stdout around agentrl's own import is not enough. A filter on the
`DeepSpeed` logger, installed before anything imports DeepSpeed, writes each record to stderr and
stops it before the stdout handler; the logger's level still decides what is logged.
"""

from __future__ import annotations

import logging
import sys

LIBRARY_LOGGERS = ("DeepSpeed",)
FORMAT = logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s")


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
