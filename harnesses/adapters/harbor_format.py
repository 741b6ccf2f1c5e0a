"""Harbor's task-directory format, read from disk (no sandbox here): a task set from a directory of
task directories, and the pieces of one task the adapter (`harnesses.adapters.harbor`) needs.

A Harbor task directory (https://harborframework.com/docs/task-format, harbor 0.25's
`harbor.models.task`) holds `instruction.md` (what the agent is told; leading canary comment lines
are stripped, as Harbor does), `task.toml` (`[metadata]` difficulty/category, `[verifier]`
timeout_sec and env, `[agent]` timeout_sec, `[environment]` workdir, docker_image, limits ...),
`core/environment/` (the container's build context: a Dockerfile and files), `tests/test.sh` (+ files;
Harbor copies them to /tests after the agent finished and runs test.sh from the working directory;
it writes the reward to /logs/verifier/reward.txt, a number, or reward.json, a JSON object of named
numbers, which wins when both exist) and `solution/solve.sh` (the oracle).

agentrl's split rule: Harbor has none, so every task is both a train and an eval task (two
TaskSpecs, `train/<dir>` and `eval/<dir>`) unless `[metadata] split = "train"` or `"eval"`.
Difficulty "easy" | "medium" | "hard" becomes 1 | 2 | 3. The task set's version is a digest of
every file of every task directory.

Belongs here: parsing, validation with ConfigError naming the fix, the container-path mapping,
parsing the reward file. Not here: sandboxes and grading (`harbor_verify`), the harness (`harbor`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tomllib
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from harnesses.base import TaskSet, TaskSpec

NAME = "harbor"
DEFAULT_TASKS_DIR = Path(__file__).parent / "harbor_tasks"
OPTIONS = ("tasks_dir", "build", "base_images", "fallback_image", "build_dir", "build_network")  # all but the first: harbor_image
DOCKER_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"})
DIFFICULTY = {"easy": 1, "medium": 2, "hard": 3}
MAX_ENVIRONMENT_BYTES = 4 << 20  # every episode copies these into its sandbox
_CANARY_LINE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def task_set(options: dict) -> TaskSet:
    """One TaskSpec per task directory and split (see the module docstring), sorted by directory."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"harnesses[{NAME}].options: unknown key(s) {', '.join(unknown)}",
                          f"the harbor adapter takes: {', '.join(OPTIONS)}")
    root = Path(options.get("tasks_dir") or DEFAULT_TASKS_DIR).expanduser()
    if not root.is_dir():
        raise ConfigError(f"harnesses[{NAME}].options.tasks_dir: {root} is not a directory",
                          "point tasks_dir at a directory of Harbor task directories (each with task.toml)")
    dirs = [root] if (root / "task.toml").is_file() else sorted(
        d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and (d / "task.toml").is_file())
    if not dirs:
        raise ConfigError(f"harnesses[{NAME}].options.tasks_dir: no Harbor task in {root}",
                          "a task directory holds task.toml, instruction.md and tests/test.sh")
    digest = hashlib.sha256()
    tasks: list[TaskSpec] = []
    for d in dirs:
        digest.update(d.name.encode() + b"\0" + dir_digest(d).encode())
        tasks += _specs(d.resolve())
    return TaskSet(f"harbor-{digest.hexdigest()[:12]}", tuple(tasks))


def _specs(d: Path) -> list[TaskSpec]:
    config = read_config(d)
    meta = config.get("metadata") or {}
    split = meta.get("split", "both")
    if split not in ("train", "eval", "both"):
        raise ConfigError(f"{d / 'task.toml'}: [metadata] split = {split!r}", 'use "train", "eval" or "both" (the default)')
    env_bytes = sum(len(data) for data, _ in environment_files(d).values())
    if env_bytes > MAX_ENVIRONMENT_BYTES:
        raise ConfigError(f"{d / 'environment'}: {env_bytes} bytes of files, more than {MAX_ENVIRONMENT_BYTES}",
                          "every episode copies environment/ into its sandbox: keep it small, or generate data in test.sh")
    label = str(meta.get("difficulty", "")).lower()
    verifier = config.get("verifier") or {}
    info = {"name": (config.get("task") or {}).get("name") or d.name, "difficulty": label or None,
            "category": meta.get("category"), "verifier_timeout_s": float(verifier.get("timeout_sec", 600.0)),
            "agent_timeout_s": (config.get("agent") or {}).get("timeout_sec"), "workdir": container_workdir(d, config),
            "verifier_env": dict(verifier.get("env") or {}), "solution_env": dict((config.get("solution") or {}).get("env") or {})}
    prompt = strip_canary((d / "instruction.md").read_text(encoding="utf-8"))
    return [TaskSpec(task_id=f"{s}/{d.name}", harness=NAME, prompt=prompt, answer=None, difficulty=DIFFICULTY.get(label, 1),
                     split=s, meta={"family": d.name, "verify": "harness", "task_dir": str(d), "harbor": info})
            for s in (("train", "eval") if split == "both" else (split,))]


def read_config(d: Path) -> dict:
    """task.toml, checked for what this adapter cannot honour (each refused with the reason)."""
    try:
        config = tomllib.loads((d / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{d / 'task.toml'}: cannot be read: {exc}", "fix the TOML (see harbor's task-format docs)") from None
    missing = [p for p in ("instruction.md", "tests/test.sh") if not (d / p).is_file()]
    if missing:
        raise ConfigError(f"Harbor task {d}: missing {', '.join(missing)}",
                          "a task needs instruction.md and tests/test.sh (which writes /logs/verifier/reward.txt)")
    env = config.get("environment") or {}
    refused = [what for what, present in (("multi-step tasks ([[steps]])", config.get("steps")),
                                          ("[environment].env (variables for the agent)", env.get("env")),
                                          ("a non-Linux environment", str(env.get("os", "linux")).lower() != "linux"))
               if present]
    if refused:
        raise ConfigError(f"Harbor task {d}: {', '.join(refused)} not supported by agentrl's harbor adapter",
                          "use single-step Linux tasks without [environment].env (see harnesses/adapters/harbor.py)")
    return config


def strip_canary(text: str) -> str:
    """Leading canary comment lines and the blank lines after them removed (harbor's strip_canary)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY_LINE.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def container_workdir(d: Path, config: dict) -> str | None:
    """The container's working directory: `[environment] workdir`, else the Dockerfile's last WORKDIR."""
    configured = (config.get("environment") or {}).get("workdir")
    if configured:
        return str(configured).rstrip("/") or None
    try:
        found = _WORKDIR.findall((d / "environment" / "Dockerfile").read_text(encoding="utf-8"))
    except OSError:
        return None
    if not found or not found[-1].startswith("/"):
        return None
    return found[-1].rstrip("/") or None


def map_paths(text: str, table: dict[str, str]) -> str:
    """`text` with each container path of `table` (a whole path component: `/tests`, `/tests/x`,
    never `/tests2` or `a/tests`) replaced by the sandbox's path for it."""
    for src, dst in sorted(table.items(), key=lambda kv: -len(kv[0])):
        if src and src != "/":
            text = re.sub(r"(?<![\w.~/$-])" + re.escape(src) + r"(?![\w.-])", lambda _m, dst=dst: dst, text)
    return text


def _files(d: Path, skip=frozenset()) -> dict[str, tuple[bytes, int]]:
    out: dict[str, tuple[bytes, int]] = {}
    if not d.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(d):
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            rel = p.relative_to(d).as_posix()
            if rel in skip or not p.is_file():
                continue
            out[rel] = (p.read_bytes(), 0o755 if os.access(p, os.X_OK) else 0o644)
    return out


def environment_files(d: Path) -> dict[str, tuple[bytes, int]]:
    """environment/'s files but the Docker ones: relative path -> (content, mode)."""
    return _files(d / "environment", DOCKER_FILES)


def verifier_files(d: Path) -> dict[str, tuple[bytes, int]]:
    """tests/'s files: relative path -> (content, mode)."""
    return _files(d / "tests")


def dir_digest(d: Path) -> str:
    h = hashlib.sha256()
    for rel, (data, mode) in sorted(_files(d).items()):
        h.update(f"{rel}\0{mode:o}\0".encode() + hashlib.sha256(data).digest())
    return h.hexdigest()


def resolve_env(env: dict, where: str) -> dict[str, str]:
    """`[verifier] env` / `[solution] env` values with `${VAR}` and `${VAR:-default}` taken from this
    process's environment, as Harbor resolves them on the host."""
    def one(key: str, value) -> str:
        def sub(m: re.Match) -> str:
            if m.group(1) in os.environ:
                return os.environ[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(f"{where}.{key} needs ${{{m.group(1)}}}, which is not set", f"export {m.group(1)} before the run")
        return _TEMPLATE.sub(sub, str(value))
    return {str(k): one(str(k), v) for k, v in (env or {}).items()}


def parse_reward(reward_json: bytes | None, reward_txt: bytes | None) -> tuple[float, str]:
    """(reward, the file it came from) by Harbor's rules: reward.json wins; its `reward` key, else its
    only value; reward.txt is one finite number. ValueError names what is wrong; a missing file is
    the caller's to report."""
    if reward_json is not None:
        try:
            data = json.loads(reward_json)
        except ValueError as exc:
            raise ValueError(f"reward.json is not JSON: {exc}") from None
        values = data if isinstance(data, dict) else {"reward": data}
        if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values.values()):
            raise ValueError(f"reward.json holds {reward_json[:200]!r}: every reward must be a finite number")
        if "reward" not in values and len(values) != 1:
            raise ValueError(f"reward.json names {sorted(values)} and no `reward`: which one is the reward is ambiguous")
        return float(values.get("reward", next(iter(values.values())))), "reward.json"
    try:
        value = float(reward_txt.decode("utf-8", "replace"))
    except ValueError:
        raise ValueError(f"reward.txt holds {reward_txt[:200]!r}, not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"reward.txt holds {value!r}, not a finite number")
    return value, "reward.txt"
