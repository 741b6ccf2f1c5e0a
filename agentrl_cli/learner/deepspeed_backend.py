"""The DeepSpeed trainer backend: one rank of a GRPO policy under DeepSpeed ZeRO 0-3, on CPU with
gloo or on GPUs with NCCL. Implements `backend.TrainingBackend`; the step itself, the parameter
views and exports are `policy_rank.PolicyRank`'s, the same for every backend.

What belongs here: building the DeepSpeed config from `templates/deepspeed/zero<stage>.json` (or
`training.deepspeed_config`), joining the process group through DeepSpeed, the engine's backward and
step, gathering ZeRO-3 partitions, engine checkpoints. The loss maths live in `grpo.py` and
`corrections.py`; checkpoint rotation and resume policy live in `checkpoint.py`.

Choices worth knowing:
- The accumulation boundary is set on the last micro-batch of a step, whatever their number; the
  loss is scaled so that DeepSpeed's division by the world size gives the token mean over all ranks.
- A client `torch.optim.AdamW` (lr = training.learning_rate, no weight decay) is passed, so
  DeepSpeed JIT-compiles no optimizer op. On CPU, DeepSpeed's communication backend would also
  compile its shared-memory all-reduce op (`deepspeed_shm_comm`, measured 212 s on 2 cores the
  first time, then cached under ~/.cache/torch_extensions); it serves only DeepSpeed's inference
  all-reduce, so it is switched off unless AGENTRL_DS_SHM_COMM=1.
- With LoRA, checkpoints hold the adapter and its optimizer state (the base weights are the model
  directory's).
- Without RANK/WORLD_SIZE in the environment the backend is a single rank in this process on
  127.0.0.1 with a free port; the variables it sets are restored by `close()`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

import templates
from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.core.errors import ConfigError, NotFoundError
from agentrl_cli.learner.policy_rank import PolicyRank
from agentrl_cli.learner.process_group import ProcessGroup

TEMPLATE_DIR = Path(templates.__file__).parent / "deepspeed"
CKPT_TAG = "ckpt"
CLIENT_KEY = "agentrl_client_state"
ENTROPY_KEY = "agentrl_entropy_coef"  # the adaptive entropy bonus (training.entropy_target) to resume with


def build_deepspeed_config(cfg: TrainingConfig) -> dict:
    """The DeepSpeed config dict: the JSON file with its "auto" values filled from `cfg`. An explicit
    value that disagrees with `cfg` is an error, so the two never silently differ."""
    source = Path(cfg.deepspeed_config) if cfg.deepspeed_config else TEMPLATE_DIR / f"zero{cfg.zero_stage}.json"
    try:
        ds = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read DeepSpeed config {source}: {exc}",
                          "point training.deepspeed_config at a valid JSON file, or unset it to use the template") from exc
    fills = {("train_micro_batch_size_per_gpu",): ("micro_batch_size", cfg.micro_batch_size),
             ("gradient_accumulation_steps",): ("gradient_accumulation_steps", cfg.gradient_accumulation_steps),
             ("gradient_clipping",): ("max_grad_norm", cfg.max_grad_norm),
             ("zero_optimization", "stage"): ("zero_stage", cfg.zero_stage),
             ("bf16", "enabled"): ("precision", cfg.precision == "bf16"),
             ("fp16", "enabled"): ("precision", cfg.precision == "fp16")}
    for keys, (field, value) in fills.items():
        node = ds
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        current = node.get(keys[-1], "auto")
        if current != "auto" and current != value:
            raise ConfigError(f"DeepSpeed config {source} sets {'.'.join(keys)}={current!r} but training.{field} "
                              f"gives {value!r}", f'set {".".join(keys)} to "auto" in {source.name} or change training.{field}')
        node[keys[-1]] = value
    if ds.get("train_batch_size", None) == "auto":
        del ds["train_batch_size"]
    if "optimizer" in ds:
        raise ConfigError(f"DeepSpeed config {source} has an optimizer section",
                          "remove it: agentrl passes torch AdamW with training.learning_rate")
    left = _auto_keys(ds)
    if left:
        raise ConfigError(f"DeepSpeed config {source} leaves {', '.join(left)} as \"auto\"; agentrl fills only "
                          + ", ".join(".".join(k) for k in fills), "give those keys explicit values")
    return ds


def _auto_keys(node, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in _auto_keys(v, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if node == "auto" else []


def import_deepspeed():
    """Import DeepSpeed with its log handler pointed at stderr: it logs to stdout by default, which
    would break `--json` output (results on stdout, logs on stderr).

    Its autotuner imports mlflow if it is installed (the trackers extra), and pandas with it, only to
    log autotuning experiments, which agentrl never runs: 1.8 s of every rank's start-up here (3.9 s
    against 2.1 s for `import deepspeed`, measured). The import is refused while DeepSpeed loads, so
    the autotuner sees no mlflow; a later `import mlflow` in the process (a tracker) works as before."""
    import sys

    blocked = "mlflow" not in sys.modules
    if blocked:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, as when it is not installed
    try:
        with contextlib.redirect_stdout(sys.stderr):  # a no-op after the first import
            import deepspeed  # its logger binds the (redirected) stdout on the first import
    finally:
        if blocked and sys.modules.get("mlflow", False) is None:
            del sys.modules["mlflow"]
    return deepspeed


def _skip_shm_comm_op() -> None:
    """Stop DeepSpeed's CPU comm backend from JIT-compiling its shared-memory op (see module doc)."""
    if os.environ.get("AGENTRL_DS_SHM_COMM") == "1":
        return
    import_deepspeed()
    import deepspeed.ops
    with contextlib.suppress(Exception):
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _deepspeed_group(dist_backend: str) -> ProcessGroup:
    """The process group, joined through DeepSpeed's own initialiser (it keeps its communication state)."""
    deepspeed = import_deepspeed()
    _skip_shm_comm_op()

    def destroy() -> None:
        import deepspeed.comm

        # DeepSpeed's own destroy also drops the sub-groups it cached (deepspeed >= 0.18 does; with
        # older versions a second backend in the same process may find stale groups)
        deepspeed.comm.destroy_process_group()
    return ProcessGroup(dist_backend, destroy=destroy,
                        join=lambda backend: deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False))


class DeepSpeedBackend(PolicyRank):
    """One rank of the policy under DeepSpeed. See `policy_rank.py` for the step semantics."""

    def __init__(self, model_path: str | Path, training_config: TrainingConfig, *,
                 tokenizer_path: str | Path | None = None, temperature: float = 1.0) -> None:
        deepspeed = import_deepspeed()
        self._pg = _deepspeed_group(training_config.dist_backend)
        try:
            model = self._load_policy(model_path, training_config, tokenizer_path, temperature)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=training_config.learning_rate, weight_decay=0.0)
            self.ds_config = build_deepspeed_config(training_config)
            self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config)
            self._load_reference(model_path)
        except BaseException:
            self._pg.close()
            raise

    @property
    def step(self) -> int:
        return int(self.engine.global_steps)

    @property
    def module(self):
        return self.engine.module

    @property
    def forward_model(self):
        return self.engine

    @property
    def optimizer(self):
        return self.engine.optimizer

    @property
    def device(self):
        return self.engine.device

    def _begin_micro_batch(self, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)

    def _backward(self, loss) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def _end_micro_batch(self, last: bool) -> float | None:
        """The engine's step (an optimizer step only at the boundary); the step's gradient norm before
        clipping on the last micro-batch."""
        grad_norm = self._local_grad_norm() if last and self.engine.zero_optimization_stage() == 0 else None
        self.engine.step()
        if last and grad_norm is None:
            grad_norm = self.engine.get_global_grad_norm()
        return grad_norm

    def _local_grad_norm(self) -> float:
        norms = [p.grad.detach().float().norm() for p in self.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    def _gathered(self, params):
        """Full parameter values inside the block (ZeRO-3 partitions them; other stages hold them)."""
        if self.engine.zero_optimization_stage() != 3:
            return contextlib.nullcontext()
        import deepspeed

        unique = list({id(p): p for p in params}.values())
        return deepspeed.zero.GatheredParameters(unique, modifier_rank=None)

    def save_checkpoint(self, dir: Path, client_state: dict) -> None:
        """The engine's checkpoint (with LoRA only the adapter and its optimizer state: the frozen
        base weights are the model directory's; DeepSpeed still keeps a tied frozen weight under its
        second name, e.g. lm_head.weight, which loads back unchanged) and RECORD: the model and
        training config it needs (`export.py` rebuilds the trainer from it)."""
        self.engine.save_checkpoint(str(dir), tag=CKPT_TAG,
                                    client_state={CLIENT_KEY: dict(client_state), ENTROPY_KEY: self.entropy_coef},
                                    exclude_frozen_parameters=self.lora is not None)
        self._write_record(Path(dir))

    def load_checkpoint(self, dir: Path) -> dict:
        if not (Path(dir) / CKPT_TAG).is_dir():
            raise NotFoundError(f"no DeepSpeed checkpoint under {dir} (expected {Path(dir) / CKPT_TAG})",
                                "point at a directory written by save_checkpoint, or start without resuming")
        self._check_record(Path(dir))
        # with LoRA the checkpoint holds the adapter alone: the base weights stay as loaded
        path, client = self.engine.load_checkpoint(str(dir), tag=CKPT_TAG, load_module_strict=self.lora is None)
        if path is None:
            raise NotFoundError(f"DeepSpeed could not load the checkpoint under {dir}",
                                "check that every rank sees the directory and that the world size matches")
        self.entropy_coef = float((client or {}).get(ENTROPY_KEY, self.entropy_coef))
        return dict((client or {}).get(CLIENT_KEY, {}))

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
        self.engine = None
        self._pg.close()
