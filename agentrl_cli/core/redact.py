"""Secret redaction for trajectory rows and logs (docs/security.md row 29).

Belongs here: the patterns that recognise credentials in free text (AWS access key ids and labelled
secret keys, GitHub tokens, PEM private key blocks, bearer / Authorization tokens, `password=…`-style
labelled values, generic high-entropy tokens), the recursive walk over rows, dicts and dataclasses,
and the logging filter. Not here: deciding *what* to store (`writer.py`) or the schema (`schema.py`).

Each secret is replaced by `[REDACTED:<kind>]`, so a reader still sees that something was there.
Redaction is idempotent. Pure hex (sha256 digests, uuid4 hex ids), ordinary prose and code, and
numeric columns (token ids, logprobs) are left as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_FIELD_NAMES = ("api_key", "token", "password", "secret")

# Row columns that are identifiers or fixed metadata, never free text: left exactly as written.
_ROW_VERBATIM = frozenset({
    "schema_version", "run_id", "trajectory_id", "task_id", "group_id", "harness", "date",
    "harness_version", "task_set_version", "policy_version_first", "policy_version_last",
    "token_ids", "loss_mask", "logprobs", "started_at", "ended_at",
})

_ARROW_VERBATIM = frozenset({"artifacts.sha256"})  # digests inside otherwise scanned columns

_PEM = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|.*\Z)", re.S)
_AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_AWS_SECRET = re.compile(
    r"(?i)((?:aws_?)?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9/+=]{20,})")
_GITHUB = re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{20,255})")
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9\-._~+/]{8,}=*)")
_AUTHORIZATION = re.compile(
    r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?(?:basic\s+|token\s+|digest\s+)?)(?!bearer\s)([^\s\"',;]{6,})")
_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/=_-]{32,}(?![A-Za-z0-9+/=_-])")
_HEX = re.compile(r"[0-9a-fA-F]+")
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def shannon_entropy(s: str) -> float:
    """Bits per character of `s` (0 for an empty string)."""
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _looks_random(token: str, threshold: float) -> bool:
    if _HEX.fullmatch(token.replace("-", "").replace("_", "")):
        return False  # sha256 digests, uuids, ids: not secrets by themselves
    classes = sum((any(c.islower() for c in token), any(c.isupper() for c in token),
                   any(c.isdigit() for c in token)))
    if classes < 2:
        return False
    if _wordy(token):
        return False  # camelCase identifiers, paths
    if "/" in token and all(len(seg) < 12 or _wordy(seg) or _HEX.fullmatch(seg) for seg in token.split("/")):
        return False  # a path such as data/s3/2006-03-01/endpoints-rule-set-1
    return shannon_entropy(token) >= threshold


def _squash(name: str) -> str:
    """Lower case without separators, so "X-Api-Key", "API_KEY" and "apikey" compare equal."""
    return re.sub(r"[-_. ]", "", name.lower())


def _wordy(token: str) -> bool:
    """Made of words (camelCase, snake_case, paths): random tokens average under 3 chars a piece."""
    pieces = _WORDS.findall(token)
    return sum(map(len, pieces)) / max(len(pieces), 1) > 3.6


def _credential_like(token: str) -> bool:
    """A value that could be a credential rather than code or a plain word."""
    if any(c in "([{" for c in token):
        return False  # a call or subscript: code
    if any(c.isdigit() for c in token) or any(c in "+/=~" for c in token):
        return True
    mixed = token.lower() != token and token.upper() != token and len(token) >= 8
    return not _wordy(token) and (mixed or len(token) >= 16)


def _replace_if_credential(m: re.Match, kind: str) -> str:
    if m.group(2).startswith("[REDACTED") or not _credential_like(m.group(2)):
        return m.group(0)
    return f"{m.group(1)}[REDACTED:{kind}]"


class Redactor:
    """Replaces credentials in text and structured values with `[REDACTED:<kind>]`.

    `field_names`: dict keys containing one of these (case-insensitive) have their string values
    replaced wholesale; in free text, `NAME=value` and `NAME: "value"` labels are redacted too.
    `entropy_threshold`: bits per character at or above which a 32+ character base64-like token that
    mixes character classes (and is neither hex nor made of words) counts as a secret.
    """

    def __init__(self, field_names: Iterable[str] = DEFAULT_FIELD_NAMES, *,
                 entropy_threshold: float = 4.0, min_token_length: int = 32) -> None:
        self.field_names = tuple(n.lower() for n in field_names if n)
        self.entropy_threshold = entropy_threshold
        self.min_token_length = min_token_length
        self._quoted = self._assign = self._colon = None
        # A superset of what any pattern below can match: text without a trigger is returned as is
        # after one scan (most observations), instead of one scan per pattern.
        names = "|".join(re.escape(n).replace("_", "[_-]?") for n in self.field_names)
        self._trigger_pattern = (r"-----BEGIN|AKIA|ASIA|secret|gh[pousr]_|github_pat_|bearer|authorization"
                                 + (f"|{names}" if names else "") + r"|[A-Za-z0-9+/=_-]{%d,}" % min(32, min_token_length))
        self._trigger = re.compile("(?i)" + self._trigger_pattern)
        if self.field_names:
            alts = "|".join(re.escape(n).replace("_", "[_-]?") for n in self.field_names)
            label = rf"[A-Za-z0-9_.-]*(?:{alts})"  # a label that ends with a field name
            # "name": "value"  /  name = 'value'  (quoted values after : or =)
            self._quoted = re.compile(rf"(?i)(?<![A-Za-z0-9])({label}[\"']?\s*[:=]\s*)([\"'])([^\"'\n]+)\2")
            # NAME=value with no spaces (shell, env files, URLs): only credential-looking values
            self._assign = re.compile(rf"(?i)(?<![A-Za-z0-9])({label}=)(?![\"'\[])([^\s\"'&;,)]+)")
            # name: value (YAML, HTTP headers): only credential-looking values
            self._colon = re.compile(rf"(?i)(?<![A-Za-z0-9])({label}:[ \t]+)(?![\"'\[])([^\s\"'&;,()\[\]{{}}]+)")

    @classmethod
    def from_config(cls, data_config: Any) -> "Redactor":
        """A redactor for `DataConfig` (uses `data.redact_fields`)."""
        return cls(getattr(data_config, "redact_fields", DEFAULT_FIELD_NAMES))

    # ---- text ------------------------------------------------------------------------------------

    def text(self, s: str) -> str:
        """`s` with every recognised secret replaced."""
        if not s or not isinstance(s, str) or self._trigger.search(s) is None:
            return s
        s = _PEM.sub("[REDACTED:private_key]", s)
        s = _AWS_KEY_ID.sub("[REDACTED:aws_access_key]", s)
        s = _AWS_SECRET.sub(lambda m: m.group(1) + "[REDACTED:aws_secret_key]", s)
        s = _GITHUB.sub("[REDACTED:github_token]", s)
        s = _BEARER.sub(lambda m: _replace_if_credential(m, "bearer_token"), s)
        s = _AUTHORIZATION.sub(lambda m: _replace_if_credential(m, "authorization"), s)
        if self._quoted is not None:
            s = self._quoted.sub(lambda m: self._label(m, m.group(1) + m.group(2), m.group(3), m.group(2)), s)
            s = self._assign.sub(self._unquoted_label, s)
            s = self._colon.sub(self._unquoted_label, s)
        return _CANDIDATE.sub(self._entropy, s)

    def _field_kind(self, label: str) -> str:
        low = _squash(label)
        return next((n for n in self.field_names if _squash(n) in low), "secret")

    def _label(self, m: re.Match, prefix: str, value: str, closing: str) -> str:
        if value.startswith("[REDACTED") or len(value) < 2 or (value.startswith("<") and value.endswith(">")):
            return m.group(0)  # already redacted, or a special token such as "<|endoftext|>"
        return f"{prefix}[REDACTED:{self._field_kind(m.group(1))}]{closing}"

    def _unquoted_label(self, m: re.Match) -> str:
        value = m.group(2)
        if not _credential_like(value) or value.startswith("[REDACTED"):
            return m.group(0)
        return f"{m.group(1)}[REDACTED:{self._field_kind(m.group(1))}]"

    def _entropy(self, m: re.Match) -> str:
        token = m.group(0)
        if len(token) >= self.min_token_length and _looks_random(token, self.entropy_threshold):
            return "[REDACTED:high_entropy]"
        return token

    # ---- structured values -----------------------------------------------------------------------

    def _key_matches(self, key: Any) -> str | None:
        if not isinstance(key, str):
            return None
        low = _squash(key)
        return next((n for n in self.field_names if _squash(n) in low), None)

    def _wholesale(self, obj: Any, kind: str) -> Any:
        """Every string inside `obj` replaced (the value of a secret-named key)."""
        if isinstance(obj, str):
            return f"[REDACTED:{kind}]" if obj else obj
        if isinstance(obj, dict):
            return {k: self._wholesale(v, kind) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._wholesale(v, kind) for v in obj]
            return items if isinstance(obj, list) else tuple(items)
        return obj

    def value(self, obj: Any) -> Any:
        """A redacted copy of `obj`: strings scanned, dict keys named like secrets blanked wholesale,
        recursion through dicts, lists, tuples and dataclass instances; other values returned as is."""
        return self._walk(obj, keys=True)

    def _walk(self, obj: Any, keys: bool) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                kind = self._key_matches(k) if keys else None
                out[k] = self._wholesale(v, kind) if kind else self._walk(v, keys)
            return out
        if isinstance(obj, (list, tuple)):
            if obj and all(isinstance(v, (int, float)) for v in obj):
                return obj  # numeric lists (token ids, logprobs) carry no text
            items = [self._walk(v, keys) for v in obj]
            return items if isinstance(obj, list) else tuple(items)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            changes = {f.name: self._walk(getattr(obj, f.name), keys)
                       for f in dataclasses.fields(obj) if f.init}
            return dataclasses.replace(obj, **changes)
        return obj

    def row(self, row: dict) -> dict:
        """A redacted copy of a trajectory row (`TrajectoryRecord.to_row()` shape).

        Identifier and numeric columns are kept verbatim, artifact sha256 digests are kept, every
        other string is scanned. Column names are schema names, so the key-name rule does not apply
        to them (`token_ids` is not a secret); free-form JSON (tool arguments) is text and scanned."""
        out = {}
        for key, v in row.items():
            if key in _ROW_VERBATIM:
                out[key] = v
            elif key == "artifacts" and isinstance(v, list):
                out[key] = [self._artifact(a) for a in v]
            else:
                out[key] = self._walk(v, keys=False)
        return out

    # ---- Arrow tables (the writer's path) ---------------------------------------------------------

    def table(self, table: pa.Table) -> pa.Table:
        """`table` (the file schema) with every free-text string redacted, as `row` would. Strings are
        screened in C++ (RE2) with the trigger pattern; only the few that match go through `text`,
        so clean data costs one vectorised scan instead of a Python regex walk per string. The scan
        runs once over all text columns concatenated (Arrow compiles the pattern per call, which
        cost more than the scan itself when done per column); only a table with a hit is walked."""
        import pyarrow as pa
        import pyarrow.compute as pc

        leaves = [leaf for name in table.column_names if name not in _ROW_VERBATIM
                  for chunk in table.column(name).chunks for leaf in _text_leaves(chunk, name)]
        if not leaves:
            return table
        hits = pc.match_substring_regex(pa.concat_arrays(leaves), self._trigger_pattern, ignore_case=True)
        if not pc.any(hits).as_py():
            return table
        columns = []
        for name in table.column_names:
            col = table.column(name)
            if name not in _ROW_VERBATIM:
                col = pa.chunked_array([self._array(chunk, name) for chunk in col.chunks], type=col.type)
            columns.append(col)
        return pa.Table.from_arrays(columns, schema=table.schema)

    def _array(self, arr: pa.Array, path: str) -> pa.Array:
        import pyarrow as pa
        import pyarrow.compute as pc

        t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if path in _ARROW_VERBATIM or len(arr) == 0:
                return arr
            hits = pc.match_substring_regex(arr, self._trigger_pattern, ignore_case=True)
            where = pc.indices_nonzero(pc.fill_null(hits, False)).to_pylist()
            if not where:
                return arr
            values = arr.to_pylist()
            for i in where:
                values[i] = self.text(values[i])
            return pa.array(values, type=t)
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            values = self._array(arr.values, path)
            if values is arr.values:
                return arr
            cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
            return cls.from_arrays(arr.offsets, values, type=t, mask=arr.is_null() if arr.null_count else None)
        if pa.types.is_struct(t):
            children = [arr.field(i) for i in range(t.num_fields)]
            redacted = [self._array(c, f"{path}.{t.field(i).name}") for i, c in enumerate(children)]
            if all(a is b for a, b in zip(redacted, children)):
                return arr
            return pa.StructArray.from_arrays(redacted, fields=list(t), mask=arr.is_null() if arr.null_count else None)
        return arr  # numbers, timestamps, maps of numbers: no text

    def _artifact(self, artifact: Any) -> Any:
        if not isinstance(artifact, dict):
            return self._walk(artifact, keys=False)
        return {k: (v if k == "sha256" else self._walk(v, keys=False)) for k, v in artifact.items()}


# ---- logging ---------------------------------------------------------------------------------------

class RedactingFilter(logging.Filter):
    """Redacts a record's formatted message (msg % args), exception text and stack text in place.

    Attach it to handlers (a logger's own filters do not see records propagated from its children);
    `install_log_redaction` does that."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_agentrl_redacted", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: keep logging's own error path, redact the parts
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = self.redactor.text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor.text(record.stack_info)
        record._agentrl_redacted = True
        return True


def install_log_redaction(redactor: Redactor, logger: logging.Logger | None = None) -> RedactingFilter:
    """Add a `RedactingFilter` to `logger` (default: the root logger) and to each of its handlers.

    Call it after the handlers are configured; handlers added later need `handler.addFilter(f)` with
    the returned filter. Returns the filter so a caller can remove it again."""
    logger = logger if logger is not None else logging.getLogger()
    f = RedactingFilter(redactor)
    logger.addFilter(f)
    for handler in logger.handlers:
        handler.addFilter(f)
    return f


def _text_leaves(arr: pa.Array, path: str) -> list[pa.Array]:
    """The string arrays inside `arr` that `Redactor._array` would scan, as plain `string` arrays.
    Child arrays are taken whole (ignoring a parent's slice): a superset, fine for a screen."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [] if path in _ARROW_VERBATIM or len(arr) == 0 else [arr.cast(pa.large_string())]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _text_leaves(arr.values, path)
    if pa.types.is_struct(t):
        return [leaf for i in range(t.num_fields) for leaf in _text_leaves(arr.field(i), f"{path}.{t.field(i).name}")]
    return []
