"""The record a rehearsal run keeps of what it made on the host, so that a later process can remove
it after this one was killed: one JSON file per run under the state directory, rewritten (atomically)
before each thing is made, never after, so it never misses something that exists.

A run's id is `<owner pid>-<6 hex>`; every network namespace it makes is named `agrl-<run id>-<name>`,
so a namespace whose record was lost still names its run and its owner.

Belongs here: the record's fields, its file, and reading every record. Does not: making nodes
(`nodes.py`) or removing them (`leftovers.py`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentrl_cli.ops.rehearse.host import proc_start

SCHEMA_VERSION = 1
STATE_DIR = Path("/run/agentrl/rehearse")
PREFIX = "agrl-"
RUN_ID = re.compile(r"^(\d+)-[0-9a-f]{6}$")
NETNS_NAME = re.compile(r"^agrl-(\d+-[0-9a-f]{6})-[a-z][a-z0-9-]*$")


def new_run_id() -> str:
    return f"{os.getpid()}-{secrets.token_hex(3)}"


def run_of(netns: str) -> str | None:
    """The run id in a namespace name made by a rehearsal, None for any other namespace."""
    m = NETNS_NAME.match(netns)
    return m.group(1) if m else None


def owner_pid(run_id: str) -> int:
    return int(run_id.split("-", 1)[0])


@dataclass
class RunRecord:
    """What one run made: its namespaces, the processes it started in them (pid and start time), the
    directories it created (node files, missing mount points) and whether it mounted /run/netns."""

    run: str
    state_dir: str
    owner_start: int | None = None
    namespaces: list[str] = field(default_factory=list)
    processes: list[list[int | None]] = field(default_factory=list)  # [pid, start ticks]
    made_dirs: list[str] = field(default_factory=list)  # created by this run, removed when empty
    mount_points: list[str] = field(default_factory=list)  # directories this run's nodes mount over (kept while in use)
    netns_mount_made: bool = False  # /run/netns was no mount point before this run's first namespace
    netns_dir_made: bool = False  # /run/netns did not exist before it
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def new(cls, state_dir: Path = STATE_DIR) -> RunRecord:
        return cls(run=new_run_id(), state_dir=str(state_dir), owner_start=proc_start(os.getpid()))

    @property
    def path(self) -> Path:
        return Path(self.state_dir) / f"{self.run}.json"

    @property
    def files(self) -> Path:
        """The run's own directory: each node's files (its /etc/hosts)."""
        return Path(self.state_dir) / self.run

    def netns(self, name: str) -> str:
        return f"{PREFIX}{self.run}-{name}"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        for attempt in range(3):  # another run's removal may take the state directory away once empty
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                tmp.write_text(json.dumps(asdict(self), indent=1))
                os.replace(tmp, self.path)
                return
            except FileNotFoundError:
                if attempt == 2:
                    raise

    @classmethod
    def load(cls, path: Path) -> RunRecord | None:
        """The record in `path`; None when it is unreadable or not a record (it is then left alone)."""
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                return None
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            return None


def records(state_dir: Path = STATE_DIR) -> list[RunRecord]:
    """Every run record under `state_dir`."""
    paths = sorted(Path(state_dir).glob("*.json"))
    return [r for p in paths if (r := RunRecord.load(p)) is not None and RUN_ID.match(r.run)]
