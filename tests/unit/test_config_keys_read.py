"""Every config key takes effect: each field of the typed config is read somewhere in the runtime
(agentrl_cli/ outside config/, stages/, harnesses/). Keys that are only recorded (archived with the
run, never acted on) say so in their description ("recorded only").

A key counts as read when the code accesses it through its section (`cfg.rollout.concurrency`,
`config.sandbox.pool_size`) or through a name bound to that section in the same file (`r =
cfg.rollout` then `r.concurrency`; `for h in cfg.harnesses` then `h.cpu`). Keys resolve by section:
a name bound to `cfg.sandbox` in one file does not read `training.backend` in another. Names so
common that any object has them (`name`, `port`, ...) need one of those forms; rarer names also
count when accessed as `.name`.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from agentrl_cli.config.models import PlatformConfig

ROOT = Path(__file__).resolve().parents[2]
GENERIC = {"name", "host", "port", "python", "backend", "mode", "seed", "weight", "path", "dtype", "cpu", "root", "prefix",
           "region", "bucket", "store", "options", "capacity", "quota", "nodes", "priority", "value", "tasks", "roles",
           "builder", "urls", "engine", "executor", "namespace", "compression", "timeout_s", "max_retries", "image_tag",
           "network", "allowlist", "minutes", "enabled", "steps", "bwrap", "seccomp", "lease_seconds", "replicas"}


def runtime_sources() -> list[str]:
    """The source of every runtime file, one string per file (aliases do not cross files)."""
    files = [p for d in ("agentrl_cli", "stages", "harnesses") for p in (ROOT / d).rglob("*.py")
             if "config" not in p.relative_to(ROOT / d).parts[:1]]
    return [p.read_text(encoding="utf-8") for p in files]


def fields(model: type[BaseModel], section: str = "", path: str = ""):
    """(dotted key, section attribute name, field name, description) of every leaf field."""
    for name, f in model.model_fields.items():
        ann = f.annotation
        nested = [a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            yield from fields(nested[0], name, f"{path}{name}.")
        else:
            yield f"{path}{name}", section, name, f.description or ""


def aliases(src: str, section: str) -> set[str]:
    lines = "\n".join(line for line in src.splitlines() if f".{section}" in line)
    found = set(re.findall(rf"(\w+)\s*=\s*[\w.()]*\.{section}\b(?!\.)", lines))
    found |= set(re.findall(rf"for\s+(\w+)\s+in\s+[\w.()]*\.{section}\b", lines))
    found |= set(re.findall(rf"\((\w+)\s+for\s+\w+\s+in\s+[\w.()]*\.{section}\b", lines))
    found |= {m[0] for m in re.findall(rf"(\w+)\s*=\s*next\(\(?(\w+) for \2 in [\w.()]*\.{section}\b", lines)}
    typed = "\n".join(line for line in src.splitlines() if "Config" in line)
    kinds = {section.capitalize(), section.capitalize().removesuffix("es")}  # HarnessConfig: one of cfg.harnesses
    found |= set(re.findall(rf"(\w+)\s*:\s*[\"']?\w*(?:{'|'.join(kinds)})\w*Config\b", typed))
    return found | {f"{section}_config", f"{section}_cfg"}  # the house names for a section passed as a parameter


def is_read(src: str, section: str, field: str, known: dict | None = None) -> bool:
    names = known[section] if known is not None and section in known else (aliases(src, section) if section else set())
    src = "\n".join(line for line in src.splitlines() if field in line)  # only lines that could read it
    if re.search(rf"getattr\(\w[\w.]*,\s*[\"']{field}[\"']", src):
        return True
    if not section:
        return bool(re.search(rf"\.{field}\b", src))
    if re.search(rf"\.{section}\.{field}\b", src) or re.search(rf"[\"']{section}\.{field}[\"']", src):
        return True
    if names and re.search(rf"\b(?:{'|'.join(map(re.escape, sorted(names)))})\.{field}\b", src):
        return True
    return field not in GENERIC and re.search(rf"\.{field}\b", src) is not None


def test_every_config_key_is_read_by_the_runtime_or_marked_recorded_only():
    all_fields = list(fields(PlatformConfig))
    sections = {f[1] for f in all_fields if f[1]}
    files = [(src, {section: aliases(src, section) for section in sections}) for src in runtime_sources()]
    dead = [key for key, section, field, description in all_fields
            if "recorded only" not in description and not any(is_read(src, section, field, known) for src, known in files)]
    assert dead == [], f"config keys no code reads (implement them, remove them, or mark them 'recorded only'): {dead}"


def test_a_name_bound_to_another_section_reads_nothing():
    sandbox_file = "def f(cfg):\n    s = cfg.sandbox\n    return s.backend\n"
    training_file = "def g(cfg):\n    t = cfg.training\n    return t.seq_len_limit\n"
    known = {"training": aliases(training_file, "training") | aliases(sandbox_file, "training")}
    assert is_read(sandbox_file, "sandbox", "backend") and not is_read(sandbox_file, "training", "backend", known)


def test_the_check_finds_a_key_nothing_reads():
    src = "def f(cfg):\n    r = cfg.rollout\n    return r.seed + cfg.sandbox.pool_size + other.python\n"
    assert is_read(src, "rollout", "seed") and is_read(src, "sandbox", "pool_size")  # through an alias; qualified
    assert not is_read(src, "rollout", "batch_window_ms") and not is_read(src, "sandbox", "python")
