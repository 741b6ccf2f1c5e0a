"""Secrets kept out of everything an agentrl process writes: its log records, whatever it prints to
stdout and stderr (which a launcher sends to a log file), the stage reports, metrics.jsonl and the
HTML report.

`SecretRedactor` is the trajectory store's redactor (`core/redact.py`: bearer tokens, labelled
values, key formats; not its high-entropy rule, which would take the digests and file names a
process prints) plus the exact values of the secrets this process was
given: every secret key of its config (`inference.api_key`, ...; each line of a multi-key value),
the `AGENTRL_<SECTION>__<KEY>` variables and the files the `..._FILE` ones name, and environment
variables named like secrets (`*TOKEN*`, `*PASSWORD*`, `*SECRET*`, `*API_KEY*`, `*CREDENTIAL*`).
A known value shorter than MIN_KNOWN characters is left to the patterns (replacing a short word
everywhere would garble the output without protecting anything).

`protect_process(config)` installs one for the whole process (the one piece of process-wide state
here, as logging and the standard streams are process-wide): every log record is redacted when it
is made, whichever logger and handler take it, tracebacks included; sys.stdout and sys.stderr are
replaced by streams that redact line by line (Python warnings are printed there too). Calling it again
(once the config is known) swaps the redactor. `current()` is the installed redactor, or one built
from the environment, for writers of reports.

Not here: what the trajectory store redacts (`core/redact.py`, `runtime/data/writer.py`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

MIN_KNOWN = 8
SECRET_NAME = re.compile(r"(?i)api_?key|token|password|passwd|secret|credential")
_DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")
_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|[nrtbf"\\/])')
_GUARD = "\x00"
_URL_PASSWORD = re.compile(r"\b([a-z][a-z0-9+.-]*://[^:/@\s]+):[^@/\s]+@")  # postgresql://user:PASSWORD@host


# A config key set from the environment: AGENTRL_<SECTION>__<KEY>, or AGENTRL_<SECTION>__<KEY>_FILE
# naming a file that holds it (the config loader's convention); a secret one has a secret's name.
_CONFIG_VAR = re.compile(r"^AGENTRL_([A-Z0-9]+(?:_[A-Z0-9]+)*)__([A-Z0-9_]+?)(_FILE)?$")


def _config_secrets(config) -> list[tuple[str, str, Any]]:
    """(section, key, value) of every secret (a value with `get_secret_value`) a config holds."""
    out = []
    for section in type(config).model_fields if hasattr(type(config), "model_fields") else ():
        part = getattr(config, section, None)
        for key in type(part).model_fields if hasattr(type(part), "model_fields") else ():
            value = getattr(part, key, None)
            if hasattr(value, "get_secret_value"):
                out.append((section, key, value))
    return out


def known_secrets(config=None, env=None) -> dict[str, str]:
    """{value: what it is} of the secrets this process holds (see the module docstring)."""
    from agentrl_cli.core.security.keys import parse_keys

    env = os.environ if env is None else env
    found: dict[str, str] = {}

    def add(text: str | None, kind: str) -> None:
        for value in parse_keys(text or ""):
            if len(value) >= MIN_KNOWN:
                found.setdefault(value, kind)

    for name in sorted(env):
        m = _CONFIG_VAR.match(name)
        if not m or not SECRET_NAME.search(m.group(2)):
            continue
        kind = f"{m.group(1).lower()}.{m.group(2).lower()}"
        if not m.group(3):
            add(env[name], kind)
            continue
        try:
            add(Path(env[name]).read_text(encoding="utf-8"), kind)
        except (OSError, UnicodeDecodeError):
            pass  # the config loader reports an unreadable file
    for section, key, secret in _config_secrets(config) if config is not None else ():
        add(secret.get_secret_value(), f"{section}.{key}")
    for name, value in env.items():
        if SECRET_NAME.search(name) and not name.endswith("_FILE"):
            add(value.strip(), name)
    return found


class SecretRedactor:
    """`text()` and `strings()` with the known values first, then `base`'s patterns."""

    def __init__(self, base, known: dict[str, str] | None = None) -> None:
        self.base, self.known = base, dict(known or {})
        ordered = sorted(self.known, key=len, reverse=True)  # a value containing another goes first
        self._known = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    def build(cls, config=None, env=None) -> "SecretRedactor":
        from agentrl_cli.core.redact import DEFAULT_FIELD_NAMES, Redactor

        fields = getattr(getattr(config, "data", None), "redact_fields", None) or DEFAULT_FIELD_NAMES
        # no high-entropy rule: a process's own output is full of digests, run ids and file names,
        # and its secrets are known by value
        return cls(Redactor(fields, entropy_threshold=float("inf")), known_secrets(config, env))

    def text(self, s: str) -> str:
        if not s or not isinstance(s, str):
            return s
        if self._known is not None:
            s = self._known.sub(lambda m: f"[REDACTED:{self.known[m.group(0)]}]", s)
        s = _URL_PASSWORD.sub(r"\1:[REDACTED:password]@", s)
        if _GUARD in s or "\\" not in s:
            return self.base.text(s)
        # keep escapes whole (JSON's \n, \u00e9): a token after one must not take its letter, or the
        # JSON around it would no longer parse
        return self.base.text(_ESCAPE.sub(lambda m: m.group(0) + _GUARD, s)).replace(_GUARD, "")

    def strings(self, obj: Any) -> Any:
        """A copy of `obj` (dicts, lists, tuples) with every string in it redacted; keys and numbers kept."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {k: self.strings(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self.strings(v) for v in obj]
            return items if isinstance(obj, list) else tuple(items)
        return obj

    def config(self, data: dict) -> dict:
        """A resolved config (`LoadedConfig.resolved()`) as `config show` prints it: every string
        redacted, and the values of keys named like secrets (an `api_token` among a harness's options)
        replaced whole."""
        return self.base.value(self.strings(data))

    def html(self, page: str) -> str:
        """`page` redacted outside its data: URIs (embedded images are base64, which the entropy rule would take)."""
        out, last = [], 0
        for m in _DATA_URI.finditer(page):
            out += [self.text(page[last:m.start()]), m.group(0)]
            last = m.end()
        out.append(self.text(page[last:]))
        return "".join(out)


# ---- the process-wide installation -------------------------------------------------------------------

class _State:
    redactor: SecretRedactor | None = None
    factory = None  # the log record factory in place before ours


def current() -> SecretRedactor:
    """The redactor `protect_process` installed, else one built from the environment."""
    return _State.redactor if _State.redactor is not None else SecretRedactor.build()


class RedactingStream:
    """A text stream that redacts what is written to `raw`, a line at a time (a flush writes out a
    partial line too, so progress lines still appear). Everything else is `raw`'s."""

    def __init__(self, raw) -> None:
        self.raw, self._pending = raw, ""
        self._lock = threading.Lock()  # server threads print at once

    def write(self, s: str) -> int:
        with self._lock:  # whole lines, in the order written
            self._pending += s
            cut = max(self._pending.rfind("\n"), self._pending.rfind("\r")) + 1
            if cut:
                done, self._pending = self._pending[:cut], self._pending[cut:]
                self.raw.write(_redact(done))
        return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                done, self._pending = self._pending, ""
                self.raw.write(_redact(done))
        self.raw.flush()

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def _redact(text: str) -> str:
    redactor = _State.redactor
    return redactor.text(text) if redactor is not None else text


def _redact_args(redactor, record: logging.LogRecord) -> bool:
    """Redact the message and each argument in place, so the arguments stay arguments (formatters such as
    uvicorn's access log read them); False when that cannot be done or a secret would still show once
    formatted (split across arguments), and the caller redacts the formatted message instead."""
    args = record.args
    if not isinstance(record.msg, str) or not isinstance(args, (tuple, dict)) or not args:
        return False
    msg = redactor.text(record.msg)
    new = (tuple(_redact_arg(redactor, a) for a in args) if isinstance(args, tuple)
           else {k: _redact_arg(redactor, v) for k, v in args.items()})
    try:
        formatted = msg % new
    except Exception:  # noqa: BLE001 - a bad format string: the caller's path reports it
        return False
    if redactor.text(formatted) != formatted:
        return False
    record.msg, record.args = msg, new
    return True


def _redact_arg(redactor, value):
    """A log argument with any secret in it masked: numbers and None as they are, anything else as its
    text when that holds a secret (so `%d` and `%.2f` still format)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # noqa: BLE001 - an object that cannot print itself: logging reports it later
        return value
    clean = redactor.text(text)
    return clean if isinstance(value, str) or clean != text else value


def _redacting_factory(*args, **kwargs) -> logging.LogRecord:
    record = _State.factory(*args, **kwargs)
    redactor = _State.redactor
    if redactor is None:
        return record
    if not _redact_args(redactor, record):
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: logging reports it; redact what is there
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = redactor.text(message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redactor.text(record.exc_text)
    if record.stack_info:
        record.stack_info = redactor.text(record.stack_info)
    return record


def protect_process(config=None) -> SecretRedactor:
    """Redact every log record and everything printed (warnings included) by this process from now on,
    with the secrets of `config` (the whole platform config; None: the environment's only) known."""
    _State.redactor = SecretRedactor.build(config)
    if _State.factory is None:
        _State.factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_redacting_factory)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
    return _State.redactor
