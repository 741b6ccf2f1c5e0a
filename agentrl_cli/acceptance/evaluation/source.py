"""What MODEL_OR_RUN names, and the model directory the evaluation serves.

A model: `builtin:tiny-agent` (installed on first use), a Hugging Face model directory, or the name of a
model imported with `agentrl model import`; none given means `model.path`. A run: its id under
`observe.runs_dir`, `latest` (the newest training run), or its directory; the newest complete
checkpoint of its first training loop that has one is exported as `agentrl model export --merge`
does (with LoRA the adapter merged in, else the full weights) into `<eval dir>/export/`, which is
removed when the evaluation ends, and exported again from the same checkpoint on `--resume`.

Not here: finding checkpoints and exporting them (`learner/export.py`), resolving model.path
(`model/resolve.py`).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from agentrl_cli.core.errors import NotFoundError, UsageError

EXPORT_DIR = "export"


@dataclass
class ModelSource:
    spec: str  # as given (or model.path)
    kind: str  # "model" | "run"
    path: str = ""  # kind model: the model directory
    run: str = ""  # kind run: the run directory, its checkpoint and the checkpoint's step
    checkpoint: str = ""
    step: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return self.path if self.kind == "model" else f"{Path(self.checkpoint).name} of run {self.run}"


def find_source(spec: str | None, cfg) -> ModelSource:
    """The model or run `spec` names (None: model.path); NotFoundError / UsageError (exit 2) with the fix."""
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.learner.export import checkpoint_roots

    if spec is None:
        return ModelSource(cfg.model.path, "model", str(resolve_model_path(cfg.model.path, cfg.model.cache_dir)))
    if spec.startswith("builtin:"):
        return ModelSource(spec, "model", str(resolve_model_path(spec, cfg.model.cache_dir)))
    runs_dir = Path(cfg.observe.runs_dir).expanduser()
    given = Path(spec).expanduser()
    if given.is_dir():
        if (given / "config.json").is_file():
            return ModelSource(spec, "model", str(given.absolute()))
        if (given / "meta.json").is_file() or checkpoint_roots(given):
            return _run(spec, str(given), runs_dir)
        raise UsageError(f"{given} is neither a model directory (no config.json) nor a run (no meta.json, no checkpoints)",
                         "give a Hugging Face model directory, a run id or directory, builtin:tiny-agent or an imported model's name")
    if spec == "latest" or (runs_dir / spec).is_dir():
        return _run(spec, spec if spec == "latest" else str(runs_dir / spec), runs_dir)
    if "/" not in spec:
        try:
            return ModelSource(spec, "model", str(resolve_model_path(spec, cfg.model.cache_dir)))
        except NotFoundError as exc:
            raise NotFoundError(f"{spec!r} is no run under {runs_dir} and no imported model ({exc.message})",
                                "`agentrl runs list` shows the runs; `agentrl model import SOURCE --name NAME` imports "
                                "a model; or give a model directory or builtin:tiny-agent") from None
    raise NotFoundError(f"no model directory or run at {spec}", "check the path; `agentrl runs list` shows the runs")


def _run(spec: str, where: str, runs_dir: Path) -> ModelSource:
    from agentrl_cli.learner.checkpoint import CheckpointManager
    from agentrl_cli.learner.export import find_checkpoint, run_directory

    run_dir = run_directory(where, runs_dir)
    checkpoint = find_checkpoint(run_dir)  # NotFoundError naming where it looked
    step = int(CheckpointManager(checkpoint.parent).meta(checkpoint)["step"])
    return ModelSource(spec, "run", run=str(run_dir), checkpoint=str(checkpoint), step=step)


def recorded_source(record: dict, cfg) -> ModelSource:
    """The source an evaluation recorded, checked again for its resume: a model directory that is
    gone is looked up again by its name; a run's checkpoint must still exist."""
    source = ModelSource(**record)
    if source.kind == "model":
        if (Path(source.path) / "config.json").is_file():
            return source
        return find_source(source.spec, cfg)
    if not Path(source.checkpoint).is_dir():
        raise NotFoundError(f"the checkpoint the evaluation played, {source.checkpoint}, is gone",
                            "keep it (training.keep_last_checkpoints) or start a new evaluation of the run")
    return source


@contextlib.contextmanager
def model_dir(source: ModelSource, cfg, eval_dir: Path, progress: Callable[[str], None]) -> Iterator[Path]:
    """The model directory to serve: the model's own, or the run's checkpoint exported into
    `<eval_dir>/export/` for as long as the evaluation plays."""
    if source.kind == "model":
        yield Path(source.path)
        return
    from agentrl_cli.learner.export import export_checkpoint

    out = eval_dir / EXPORT_DIR
    shutil.rmtree(out, ignore_errors=True)  # left by an invocation that was killed
    try:
        result = export_checkpoint(source.run, cfg, merge=True, out=out, step=source.step, progress=progress)
        yield Path(result.out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
