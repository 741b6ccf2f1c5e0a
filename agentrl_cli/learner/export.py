"""A run's checkpoint as a model directory (`agentrl model export`): with LoRA the adapter (peft's
layout) or, with `merge`, the base model with the adapter merged in; without LoRA the full weights.

What belongs here: finding a run and its checkpoint, rebuilding the trainer backend that wrote it
(the record the backend keeps beside its checkpoint files, else the run's archived config), loading
the checkpoint and asking the backend to export. Not here: the command line (`cli/commands/model.py`),
how weights are merged or written (`lora.py`, `deepspeed_backend.py`), the checkpoint layout
(`checkpoint.py`).

A run directory holds one directory per training loop, each with its `checkpoints/`: `stage8`
(the run's training), `verify` (verify's own run), or the directory itself for a run started
outside the runbook. The newest checkpoint of the first loop that has one is exported, or the one
of `step`. Without `out`, the export goes to `<loop>/exports/step-NNNNNNNN-<kind>`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrl_cli.core.errors import ConfigError, NotFoundError, UsageError
from agentrl_cli.learner.checkpoint import CheckpointManager, step_dir_name

LOOPS = ("stage8", "verify")  # preferred first; then the run directory itself, then any other loop
ENGINE = "engine"  # the backend's part of a checkpoint (run/loop/checkpoints.py)


@dataclass
class ExportResult:
    run: str          # the run directory
    checkpoint: str   # the checkpoint directory exported
    step: int
    kind: str         # "adapter", "merged" or "full"
    out: str          # the directory written
    weight_bytes: int  # size of the weight files written
    lora: dict | None  # training.lora of the checkpoint
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def run_directory(run: str, runs_dir: Path) -> Path:
    """A run id under `runs_dir` (or `latest`), or a path to a run or loop directory."""
    from agentrl_cli.core.rundir import get_run

    path = Path(run).expanduser()
    if path.is_dir() and ((path / "meta.json").exists() or checkpoint_roots(path)):
        return path.absolute()
    return get_run(runs_dir, run).path


def checkpoint_roots(run_dir: Path) -> list[Path]:
    """The `checkpoints` directories of a run's training loops, in the order LOOPS prefers."""
    if not run_dir.is_dir():
        return []
    named = [run_dir / loop / "checkpoints" for loop in LOOPS] + [run_dir / "checkpoints"]
    others = sorted(p for p in run_dir.glob("*/checkpoints") if p not in named)
    return [p for p in named + others if p.is_dir()]


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The newest complete checkpoint of the first loop that has one, or the one of `step`."""
    roots = checkpoint_roots(run_dir)
    found: list[str] = []
    for root in roots:
        manager = CheckpointManager(root)
        if step is None:
            latest = manager.latest()
            if latest is not None:
                return latest
            continue
        wanted = root / step_dir_name(step)
        if manager.problem(wanted) is None:
            return wanted
        found += [f"{p.parent.parent.name}/{p.name}" for p in manager.list_complete()]
    where = ", ".join(str(r) for r in roots) or f"no checkpoints directory under {run_dir}"
    if step is None:
        raise NotFoundError(f"run {run_dir} has no complete checkpoint ({where})",
                            "train with checkpoints (training.checkpoint_interval_steps), or name another run")
    raise NotFoundError(f"run {run_dir} has no complete checkpoint of step {step} ({where})",
                        f"pick one that exists: {', '.join(found) or 'none'}; or leave out --step for the newest")


def _run_config(checkpoint: Path, fallback):
    """The platform config a checkpoint's trainer had: the run's archived config (meta.json of the
    loop's run) with the training section the backend recorded beside the checkpoint, when it did."""
    from pydantic import ValidationError

    from agentrl_cli.config.models import PlatformConfig, TrainingConfig
    from agentrl_cli.learner.policy_rank import RECORD

    loop = checkpoint.parent.parent
    cfg = fallback
    for meta_path in (loop / "meta.json", loop.parent / "meta.json"):
        if meta_path.is_file():
            try:
                cfg = PlatformConfig.model_validate(json.loads(meta_path.read_text(encoding="utf-8"))["config"])
            except (ValueError, KeyError, ValidationError) as exc:
                raise ConfigError(f"cannot read the run's archived config (the `config` of {meta_path}): {exc}",
                                  "fix that config in meta.json (an older agentrl may have written keys this one "
                                  "refuses), then export again") from None
            break
    record_path = checkpoint / ENGINE / RECORD
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
    if "training" in record:
        cfg = cfg.model_copy(update={"training": TrainingConfig.model_validate(record["training"])})
    return cfg, record.get("model_path")


def _model_path(cfg, recorded: str | None) -> Path:
    from agentrl_cli.model.resolve import resolve_model_path

    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    return Path(resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False))


def _fresh(out: Path) -> Path:
    out = Path(out).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty", "choose another --out, or remove it first")
    return out


def export_checkpoint(run: str, cfg, *, merge: bool, out: Path | None = None, step: int | None = None,
                      progress=lambda message: None) -> ExportResult:
    """Export the checkpoint of `run` (see the module docstring); `cfg` is the platform config used
    where the run archived none."""
    from agentrl_cli.learner.backends import make_backend

    run_dir = run_directory(run, Path(cfg.observe.runs_dir).expanduser())
    checkpoint = find_checkpoint(run_dir, step)
    step_done = int(CheckpointManager(checkpoint.parent).meta(checkpoint)["step"])
    run_cfg, recorded = _run_config(checkpoint, cfg)
    lora = run_cfg.training.lora
    kind = "full" if lora is None else "merged" if merge else "adapter"
    note = ("the run trained every weight (training.lora is null), so --merge changes nothing: wrote the full weights"
            if merge and lora is None else "")
    out = _fresh(out or checkpoint.parent.parent / "exports" / f"{checkpoint.name}-{kind}")
    model_path = _model_path(run_cfg, recorded)
    progress(f"rebuilding the trainer ({run_cfg.training.world_size} rank(s)) on {model_path}")
    with tempfile.TemporaryDirectory(prefix="agentrl-export-") as scratch:
        backend = make_backend(model_path, run_cfg, Path(scratch))
        try:
            progress(f"loading {checkpoint}")
            backend.load_checkpoint(checkpoint / ENGINE)
            progress(f"writing the {kind} weights to {out}")
            if kind == "adapter" and not hasattr(backend, "export_adapter"):
                raise ConfigError(f"training.backend={run_cfg.training.backend} cannot export a LoRA adapter",
                                  "export the merged weights with --merge")
            written = backend.export_adapter(out) if kind == "adapter" else backend.export_weights(out)
        finally:
            backend.close()
    weights = sum(p.stat().st_size for p in Path(written).glob("*.safetensors"))
    return ExportResult(run=str(run_dir), checkpoint=str(checkpoint), step=step_done, kind=kind, out=str(written),
                        weight_bytes=weights, lora=lora.model_dump(mode="json") if lora is not None else None, note=note)
