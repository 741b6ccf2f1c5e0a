"""Bearer keys of the platform's services: where they come from, which are valid, how they rotate.

A key source (a config value or a key file) holds one key per line. The first line is the current
key, the one clients send; servers accept every line. A rotation therefore has two keys valid at
once: `agentrl secrets rotate FILE` puts a new key first and keeps the old one second, and
`agentrl secrets retire-old FILE` drops the old one once every client sends the new one.

A service's keys are its config section's `api_key` (`inference`, `reward`, `sandbox`, `gateway`,
`controlplane`): from the YAML, from `AGENTRL_<SECTION>__API_KEY`, or from the file that
`AGENTRL_<SECTION>__API_KEY_FILE` names (a mounted Kubernetes Secret). A ring read from such a file
reads it again whenever it changes, so a rotation reaches running servers without a restart.

A key is never written anywhere but its file: logs and audit lines name it by its id, `k-` and the
first 12 hex digits of its SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from agentrl_cli.core.errors import ConfigError

SERVICES = ("inference", "reward", "sandbox", "gateway", "controlplane")
KEY_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits


def key_id(key: str) -> str:
    """The name of `key` in logs and audit lines (a hash prefix, which does not reveal the key)."""
    return "k-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def parse_keys(text: str) -> list[str]:
    """The keys in `text`: one per line, current first; blank lines and `#` comments skipped."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line not in out:
            out.append(line)
    return out


def generate_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def _secret_text(value) -> str:
    return value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)


def client_key(secret) -> str | None:
    """The key a client sends for `secret` (a SecretStr, a string or None): its first line."""
    if secret is None:
        return None
    keys = parse_keys(_secret_text(secret))
    return keys[0] if keys else None


def env_file_var(section: str) -> str:
    return f"AGENTRL_{section.upper()}__API_KEY_FILE"


class KeyRing:
    """The keys a server accepts. `match()` compares in constant time with every key; a ring built
    `from_file` follows the file (read again when its modification time, size or inode changes)."""

    def __init__(self, keys: Sequence[str] = (), *, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._keys: tuple[str, ...] = tuple(keys)
        self._digests = [hashlib.sha256(k.encode()).digest() for k in self._keys]
        self._stamp = None
        if self.path is not None:
            self._refresh(strict=True)
        if not self._keys:
            raise ConfigError(f"no key in {self.path or 'the value given'}",
                              "write one with `agentrl secrets rotate FILE`, or unset the key to run without one")

    @classmethod
    def from_secret(cls, secret) -> "KeyRing | None":
        """The ring of a config value (SecretStr or str, one key per line); None for None or blank."""
        if secret is None:
            return None
        keys = parse_keys(_secret_text(secret))
        return cls(keys) if keys else None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "KeyRing":
        return cls(path=path)

    @classmethod
    def coerce(cls, value) -> "KeyRing | None":
        """A KeyRing for a ring, a key string, a SecretStr or None (a create_app's `api_key` argument)."""
        return value if isinstance(value, KeyRing) or value is None else cls.from_secret(value)

    def _refresh(self, strict: bool = False) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return
            keys = parse_keys(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            if strict:
                raise ConfigError(f"the key file {self.path} cannot be read: {exc}",
                                  "point the variable at a readable file holding the key(s), one per line "
                                  "(`agentrl secrets rotate FILE` writes one)") from None
            return  # replaced this instant (a Secret's symlink swap): keep the keys held, look again next time
        if keys or strict:
            self._keys, self._stamp = tuple(keys), stamp
            self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def keys(self) -> tuple[str, ...]:
        if self.path is not None:
            self._refresh()
        return self._keys

    @property
    def current(self) -> str:
        """The key clients send."""
        return self.keys[0]

    def ids(self) -> list[str]:
        return [key_id(k) for k in self.keys]

    def match(self, presented: str | None) -> str | None:
        """The id of the key `presented` when it is one of the ring's, else None. Every key is compared,
        digest against digest, so neither the time taken nor a length difference tells which is near."""
        if not presented:
            return None
        self.keys  # noqa: B018 - follows a rotated file
        given = hashlib.sha256(presented.encode()).digest()
        found = None
        for key, digest in zip(self._keys, self._digests):
            if hmac.compare_digest(given, digest):
                found = key
        return key_id(found) if found is not None else None


def service_keys(config, section: str, env: Mapping[str, str] | None = None) -> KeyRing | None:
    """The keys service `section` accepts under `config` (None: it takes requests without a key).
    When `AGENTRL_<SECTION>__API_KEY_FILE` names the file the config's value came from, the ring
    follows that file."""
    secret = getattr(getattr(config, section), "api_key", None)
    if secret is None:
        return None
    env = os.environ if env is None else env
    path = env.get(env_file_var(section))
    if path:
        try:
            same = parse_keys(Path(path).read_text(encoding="utf-8")) == parse_keys(_secret_text(secret))
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            return KeyRing.from_file(path)
    return KeyRing.from_secret(secret)


# ---- key files ---------------------------------------------------------------------------------------

def read_key_file(path: str | os.PathLike) -> list[str]:
    """The keys in a key file ([] when it does not exist yet)."""
    try:
        return parse_keys(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the key file {path} cannot be read: {exc}", "check its path and permissions") from None


def write_key_file(path: str | os.PathLike, keys: Sequence[str]) -> None:
    """Replace the file's keys at once (a reader sees the old file or the new one), readable by its owner only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{k}\n" for k in keys))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rotate(path: str | os.PathLike, keep_old: bool = True) -> tuple[list[str], list[str]]:
    """Put a new key first in the file; the current one stays valid second (`keep_old`) or is dropped.
    Returns (the ids before, the ids after)."""
    before = read_key_file(path)
    after = [generate_key()] + (before[:1] if keep_old else [])
    write_key_file(path, after)
    return [key_id(k) for k in before], [key_id(k) for k in after]


def retire_old(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Keep the current key only. Returns (the ids before, the ids after)."""
    before = read_key_file(path)
    if not before:
        raise ConfigError(f"no key in {path}", "write one with `agentrl secrets rotate FILE`")
    write_key_file(path, before[:1])
    return [key_id(k) for k in before], [key_id(before[0])]
