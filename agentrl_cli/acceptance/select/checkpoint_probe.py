"""Criterion 6, checkpoint resume and fault tolerance, measured per backend through the seam
(`backend_class(TrainingConfig)`, one rank in this process):

- own resume: train a step, save a checkpoint (the checkpoint manager's atomic layout), train the
  next step; a fresh backend loads the checkpoint and trains that same next step: the two losses
  must agree within `RESUME_RTOL` and the restored step must be 1;
- the kept fixtures of earlier agentrl versions (`acceptance/verify/old_checkpoint.py`; a fixture names the
  backend that wrote it, DeepSpeed when it names none): each of this backend's loads and trains a
  finite step;
- the other backends' checkpoints (those written here, and their kept fixtures): loaded where the
  format allows, else the reason it refused. Reported, not judged: across backends the portable
  form is the exported Hugging Face weights (`agentrl model export`, `export_weights`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

RESUME_RTOL = 1e-4
TRAINING = dict(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, learning_rate=1e-3, resume_from_latest=False)


def _samples(seed: int) -> list:
    from agentrl_cli.acceptance.select.stress_worker import samples

    return samples(2, 16, 64, seed)


def _backend(name: str, model: Path, **training):
    from agentrl_cli.config.models import TrainingConfig
    from agentrl_cli.learner.backend import backend_class

    cfg = TrainingConfig(**{**TRAINING, **training, "backend": name})
    return backend_class(cfg)(str(model), cfg)


def own_resume(name: str, model: Path, workdir: Path) -> tuple[dict, Path | None]:
    """(figures, the checkpoint's engine directory)."""
    from agentrl_cli.learner.checkpoint import CheckpointManager

    first, second = _samples(1), _samples(2)
    manager = CheckpointManager(workdir / name / "checkpoints")
    a = _backend(name, model)
    try:
        a.train_step(first)
        saved = manager.save(1, lambda d: a.save_checkpoint(d / "engine", {"step": 1, "probe": "agentrl select"}),
                             {"version": 1, "run_id": "select"})
        continued = float(a.train_step(second)["loss"])
    finally:
        a.close()
    b = _backend(name, model)
    try:
        state = b.load_checkpoint(manager.latest() / "engine")
        restored_step = b.step
        resumed = float(b.train_step(second)["loss"])
    finally:
        b.close()
    rel = abs(resumed - continued) / max(abs(continued), 1e-12)
    ok = state.get("step") == 1 and restored_step == 1 and math.isfinite(resumed) and rel <= RESUME_RTOL
    return ({"ok": ok, "checkpoint": saved.name, "restored_step": restored_step, "loss_continued": round(continued, 8),
             "loss_resumed": round(resumed, 8), "relative_difference": rel}, Path(saved) / "engine")


def kept_fixtures() -> list[tuple[Path, str, dict]]:
    """(fixture root, the backend that wrote it, fixture.json) of every kept fixture."""
    from agentrl_cli.acceptance.verify.old_checkpoint import fixtures

    out = []
    for root in fixtures():
        meta = json.loads((root / "fixture.json").read_text(encoding="utf-8"))
        out.append((root, meta.get("backend") or meta.get("training", {}).get("backend") or "deepspeed", meta))
    return out


def load_and_step(name: str, model: Path, engine_dir: Path, training: dict | None = None) -> dict:
    """Load `engine_dir` with backend `name` and train one step: {"loaded", "loss"} or {"loaded": False, "why"}."""
    training = {k: v for k, v in (training or {}).items() if k not in ("backend",)}
    try:
        backend = _backend(name, model, **training)
    except Exception as exc:  # noqa: BLE001 - reported as the reason
        return {"loaded": False, "why": f"the backend did not build: {type(exc).__name__}: {exc}"}
    try:
        state = backend.load_checkpoint(engine_dir)
        loss = float(backend.train_step(_samples(3))["loss"])
        return {"loaded": math.isfinite(loss), "step": state.get("step"), "loss_after_one_step": round(loss, 6)}
    except Exception as exc:  # noqa: BLE001 - a refusal is the finding
        return {"loaded": False, "why": f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"}
    finally:
        backend.close()


def fixture_engine(root: Path) -> Path | None:
    from agentrl_cli.learner.checkpoint import CheckpointManager

    latest = CheckpointManager(root / "checkpoints").latest()
    return None if latest is None else latest / "engine"


def probe_all(backends: list[str], model: Path, workdir: Path, progress=lambda message: None) -> dict[str, dict]:
    """backend -> {"own_resume", "kept_fixtures", "other_backends"} (see module doc)."""
    results: dict[str, dict] = {}
    written: dict[str, Path] = {}
    for name in backends:
        progress(f"checkpoint: {name} saves, resumes and continues")
        own, engine = own_resume(name, model, workdir)
        results[name] = {"own_resume": own, "kept_fixtures": [], "other_backends": []}
        if engine is not None:
            written[name] = engine
    fixtures = kept_fixtures()
    for name in backends:
        for root, writer, meta in fixtures:
            engine = fixture_engine(root)
            entry = {"fixture": root.name, "format_version": meta.get("format_version"), "written_by": writer}
            progress(f"checkpoint: {name} loads the kept fixture {root.name} ({writer})")
            outcome = ({"loaded": False, "why": f"no complete checkpoint under {root / 'checkpoints'}"} if engine is None
                       else load_and_step(name, root / "model", engine, meta.get("training")))
            (results[name]["kept_fixtures"] if writer == name else results[name]["other_backends"]).append({**entry, **outcome})
        for other, engine in written.items():
            if other != name:
                progress(f"checkpoint: {name} loads the checkpoint {other} wrote")
                results[name]["other_backends"].append({"checkpoint": f"written by {other} here", "written_by": other,
                                                        **load_and_step(name, model, engine)})
    return results
