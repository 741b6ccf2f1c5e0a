"""Creating a run directory: `create_run` makes `runs/<run_id>/` and writes its `meta.json` - the
resolved config and its hash, package versions, host, seeds, harness versions, image tags (labels),
the image each harness's episodes run in (its reference and digest), the image lock and the task-set version. Reading and listing runs lives in `agentrl_cli/core/rundir.py`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentrl_cli.config import LoadedConfig
from agentrl_cli.config.load import mask_override
from agentrl_cli.core.environment import PACKAGES, host_facts, package_versions
from agentrl_cli.engines.registry import engine_packages
from agentrl_cli.core.errors import UsageError
from agentrl_cli.core.report import atomic_write_text
from agentrl_cli.core.rundir import META_SCHEMA_VERSION, RUN_ID_RE, RunDir, new_run_id, now_iso


def harness_records(loaded: LoadedConfig) -> list[dict]:
    from harnesses.base import CONTRACT_VERSION
    from harnesses.registry import harness_version  # local: harness modules may be heavy

    return [{"name": h.name, "version": harness_version(h.name), "contract": CONTRACT_VERSION, "image_tag": h.image_tag,
             "image": image_record(h.name, loaded.config), "held_out": h.held_out} for h in loaded.config.harnesses]


def image_record(name: str, config) -> dict:
    """What the harness's episodes run in: {"ref", "digest", "sandboxed"} ("" = the host root); an
    image that cannot be resolved is recorded with the reason (the run refuses it when it starts)."""
    from agentrl_cli.envs.images import ImageError
    from harnesses.images import harness_image

    try:
        return harness_image(name, config).to_dict()
    except ImageError as exc:
        ref = next((h.image for h in config.harnesses if h.name == name), "")
        return {"ref": ref, "digest": None, "error": exc.message}


def create_run(loaded: LoadedConfig, run_id: str | None = None, command: list[str] | None = None) -> RunDir:
    """Create (or reopen, when `run_id` names an existing run) a run directory and write meta.json."""
    root = Path(loaded.config.observe.runs_dir)
    if run_id is not None and not RUN_ID_RE.match(run_id):
        raise UsageError(f"bad run id {run_id!r}", "use letters, digits, '.', '_' and '-' only")
    run = RunDir(root / (run_id or new_run_id()))
    run.reports.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    previous = run.meta()
    cfg = loaded.config
    meta = {
        "schema_version": META_SCHEMA_VERSION,
        "run_id": run.run_id,
        "created_at": previous.get("created_at") or now_iso(),
        "updated_at": now_iso(),
        "command": [mask_override(a) for a in (command if command is not None else sys.argv)],
        "config_source": loaded.source,
        "config_overrides": loaded.masked_overrides(),
        "config_hash": loaded.hash,
        "config": loaded.resolved(),
        "packages": package_versions(PACKAGES + engine_packages(cfg.inference.engine)),
        "host": host_facts(),
        "seeds": {"rollout": cfg.rollout.seed, "training": cfg.training.seed},
        "harnesses": harness_records(loaded),
        "image_tags": {h.name: h.image_tag for h in cfg.harnesses} | {"base": cfg.cluster.base_image},
        "task_set_version": task_set_version(),
        "image_lock": image_lock_record(cfg),
    }
    if previous and previous.get("config_hash") not in (None, loaded.hash):
        meta["config_history"] = previous.get("config_history", []) + [previous.get("config_hash")]
    atomic_write_text(run.meta_path, json.dumps(meta, indent=2, default=str) + "\n")
    return run


def image_lock_record(cfg) -> dict:
    from agentrl_cli.ops.image.lock import run_record  # local: reads every installed package's metadata

    try:
        return run_record(cfg)
    except Exception as exc:  # noqa: BLE001 - a run is never refused for its metadata; the reason is recorded
        return {"error": f"{type(exc).__name__}: {exc}"}


def task_set_version() -> str:
    from harnesses.tasks import TASK_SET_VERSION, task_set_digest

    return f"{TASK_SET_VERSION}+{task_set_digest()}"
