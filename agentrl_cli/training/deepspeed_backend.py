"""The DeepSpeed trainer backend: one rank of a GRPO policy under DeepSpeed ZeRO 0-3, on CPU with
gloo or on GPUs with NCCL. Implements `backend.TrainingBackend`.

What belongs here: building the DeepSpeed config from `templates/deepspeed/zero<stage>.json` (or
`training.deepspeed_config`), process-group setup, the micro-batch loop of a train step, engine
checkpoints, weight export. The loss maths live in `grpo.py`; checkpoint rotation and resume
policy live in `checkpoint.py`.

Choices worth knowing:
- One `train_step` is one optimizer step. Its samples are split into micro-batches of
  `training.micro_batch_size`; the accumulation boundary is set on the last one, whatever their
  number (`training.gradient_accumulation_steps` only tells callers how many samples to pass:
  `samples_per_step`). Each micro-batch loss is divided by the step's masked-token count over ALL
  ranks and multiplied by the world size (DeepSpeed divides the summed gradients by it), so the
  update is the token mean over every rank's samples however unevenly the tokens fall, and the
  mean of the ranks' reported losses is the loss one rank would report on all the samples
  (`seq_mean` and `seq_mean_token_sum` likewise count the sequences of all ranks).
- Samples of a micro-batch that begin with the same prompt (a GRPO group) share one forward pass
  over it (`shared_prompts.py`): the same log-probs and gradients, for a fraction of the tokens.
- With `training.max_tokens_per_micro_batch` set, micro-batches are bins of at most that many
  tokens instead, each run as one packed row with no padding (`packing.py`; prompt sharing is then
  off); the loss is the padded one. Ranks with fewer bins run empty filler micro-batches so every
  rank runs as many (ZeRO reduces inside backward).
- With `training.correction` other than none, the step first computes pi_old: a no-grad forward
  (eval mode) over all its micro-batches with the weights the step starts from, before any of them
  trains, so it stays the step's starting policy however the micro-batches are accumulated. The
  behaviour weights and their diagnostics (`corrections.py`) come from it; with several ranks the
  diagnostics are gathered over every rank's units, so each rank reports the step's figures.
- A client `torch.optim.AdamW` (lr = training.learning_rate, no weight decay) is passed, so
  DeepSpeed JIT-compiles no optimizer op. On CPU, DeepSpeed's communication backend would also
  compile its shared-memory all-reduce op (`deepspeed_shm_comm`, measured 212 s on 2 cores the
  first time, then cached under ~/.cache/torch_extensions); it serves only DeepSpeed's inference
  all-reduce, so it is switched off unless AGENTRL_DS_SHM_COMM=1.
- With `training.lora` set, peft's LoRA layers are put in the model (`lora.py`) and only their
  parameters train and reach the optimizer. The KL reference is the same model with its adapters
  switched off. Checkpoints hold the adapter and its optimizer state (the base weights are the
  model directory's); `export_adapter` writes peft's adapter directory; `export_weights`,
  `parameter_names`, `named_parameter_sample` and `named_tensors` give the ordinary Hugging Face
  names with merged values (base + adapter), so a full weight sync needs no LoRA support.
- Without RANK/WORLD_SIZE in the environment the backend is a single rank in this process on
  127.0.0.1 with a free port; the variables it sets are restored by `close()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import torch

import templates
from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.errors import ConfigError, NotFoundError
from agentrl_cli.training import corrections, lora, packing, shared_prompts
from agentrl_cli.training.grpo import Sample, aggregation_weights, collate, mismatch_kl

TEMPLATE_DIR = Path(templates.__file__).parent / "deepspeed"
CKPT_TAG = "ckpt"
CLIENT_KEY = "agentrl_client_state"
RECORD = "agentrl-backend.json"  # beside the engine's files: the model and training config that wrote them


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_ifname() -> str:
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    return names[0] if names else "lo"


def import_deepspeed():
    """Import DeepSpeed with its log handler pointed at stderr: it logs to stdout by default, which
    would break `--json` output (results on stdout, logs on stderr)."""
    import sys

    with contextlib.redirect_stdout(sys.stderr):  # a no-op after the first import
        import deepspeed  # its logger binds the (redirected) stdout on the first import
    return deepspeed


def _skip_shm_comm_op() -> None:
    """Stop DeepSpeed's CPU comm backend from JIT-compiling its shared-memory op (see module doc)."""
    if os.environ.get("AGENTRL_DS_SHM_COMM") == "1":
        return
    import_deepspeed()
    import deepspeed.ops
    with contextlib.suppress(Exception):
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class _ProcessGroup:
    """Joins the launcher's process group, or makes a single-rank one on 127.0.0.1."""

    def __init__(self, dist_backend: str) -> None:
        deepspeed = import_deepspeed()

        self.saved_env: dict[str, str | None] = {}
        self.created = not torch.distributed.is_initialized()
        single = self.created and not ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
        if single:  # DeepSpeed reads these; the group itself uses an in-process store (no listening socket)
            self._setenv(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        self.backend = dist_backend if dist_backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend == "gloo" and os.environ.get("MASTER_ADDR") in ("127.0.0.1", "localhost"):
            if "GLOO_SOCKET_IFNAME" not in os.environ:
                self._setenv(GLOO_SOCKET_IFNAME=_loopback_ifname())  # bind gloo to loopback only
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        _skip_shm_comm_op()
        try:
            if single:
                torch.distributed.init_process_group(self.backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
            deepspeed.init_distributed(dist_backend=self.backend, auto_mpi_discovery=False, verbose=False)
        except BaseException:
            self.close()
            raise

    def _setenv(self, **values: str) -> None:
        for key, value in values.items():
            self.saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def close(self) -> None:
        if self.created and torch.distributed.is_initialized():
            import deepspeed.comm

            # DeepSpeed's own destroy also drops the sub-groups it cached (deepspeed >= 0.18 does; with
            # older versions a second backend in the same process may find stale groups)
            deepspeed.comm.destroy_process_group()
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.saved_env = {}


class DeepSpeedBackend:
    """One rank of the policy under DeepSpeed. See the module docstring for the step semantics."""

    def __init__(self, model_path: str | Path, training_config: TrainingConfig, *,
                 tokenizer_path: str | Path | None = None, temperature: float = 1.0) -> None:
        deepspeed = import_deepspeed()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = training_config
        self.correction = corrections.Correction.from_config(training_config)
        self.temperature = temperature
        self._pg = _ProcessGroup(training_config.dist_backend)
        try:
            self.rank = torch.distributed.get_rank()
            self.world_size = torch.distributed.get_world_size()
            torch.manual_seed(training_config.seed)
            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or model_path))
            model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
            self.model_path = str(Path(model_path).absolute()) if Path(model_path).is_dir() else str(model_path)
            pad = self.tokenizer.pad_token_id
            self.pad_id = int(pad if pad is not None else (model.config.pad_token_id or 0))
            self.lora, self.peft_model = training_config.lora, None
            if self.lora is not None:  # DeepSpeed trains the model with peft's layers in it (lora.py)
                self.peft_model = lora.wrap(model, self.lora)
                model = self.peft_model.get_base_model()
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=training_config.learning_rate, weight_decay=0.0)
            self.ds_config = build_deepspeed_config(training_config)
            self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config)
            # the KL penalty's reference: the starting policy, frozen (samples may also bring their own);
            # with LoRA, the trained model itself with its adapters switched off
            self.reference = None
            if training_config.kl_coef > 0 and self.peft_model is not None:
                self.reference = lora.AdaptersOff(self.peft_model, self.engine.module)
            elif training_config.kl_coef > 0:
                self.reference = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
                self.reference.eval().requires_grad_(False).to(self.engine.device)
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
    def samples_per_step(self) -> int:
        """Samples per rank that make micro_batch_size x gradient_accumulation_steps."""
        return self.config.micro_batch_size * self.config.gradient_accumulation_steps

    def train_step(self, samples: list[Sample]) -> dict:
        if not samples:
            raise ValueError("train_step: no samples; every rank must pass at least one")
        if self.config.max_tokens_per_micro_batch:
            batches, prompts, per_sample = self._packed_micro_batches(samples, self.config.max_tokens_per_micro_batch)
        else:
            mbs = self.config.micro_batch_size
            batches, prompts = [], []
            for i in range(0, len(samples), mbs):
                batch = collate(samples[i:i + mbs], self.pad_id, max_len=self.config.seq_len_limit)
                split = shared_prompts.split(batch, self.pad_id) if shared_prompts.cache_argument(self.engine) else None
                batches.append(batch.to(self.engine.device))
                prompts.append(split.to(self.engine.device) if split is not None else None)
            self._check_same_micro_batches(len(batches))
            per_sample = torch.cat([b.loss_mask.sum(dim=1) for b in batches])
        total = sum(b.num_tokens for b in batches)
        sequences = sum(int((b.loss_mask.sum(dim=1) > 0).sum()) for b in batches)
        global_total, global_sequences = self._global_counts(total, sequences)
        aggregation = getattr(self.config, "loss_aggregation", "token_mean")
        sums = dict.fromkeys(("clip_fraction", "approx_kl", "entropy", "mismatch_kl", "kl_ref"), 0.0)
        loss_sum, grad_norm = 0.0, None
        old = self._old_logprobs(batches, prompts) if self.correction.needs_old_logprobs else [None] * len(batches)
        weights = [corrections.behaviour_weights(o, b.old_logprobs, b.loss_mask, self.correction) if o is not None else None
                   for o, b in zip(old, batches)]
        self.engine.train()
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            self.engine.set_gradient_accumulation_boundary(last)
            new_lp, entropy = self._token_logprobs(self.engine, batch, prompts[i])
            ref_lp = batch.ref_logprobs
            if ref_lp is None and self.reference is not None:
                with torch.no_grad():
                    ref_lp, _ = self._token_logprobs(self.reference, batch, prompts[i])
            loss, m = corrections.policy_loss(
                new_lp, old[i], batch.old_logprobs, batch.advantages, batch.loss_mask, self.correction,
                weights[i].weights if weights[i] is not None else None, kl_coef=self.config.kl_coef, ref_lp=ref_lp,
                entropy=entropy, entropy_coef=self.config.entropy_coef, num_tokens=global_total,
                token_weights=aggregation_weights(aggregation, batch.loss_mask, global_sequences))
            loss = loss * self.world_size  # DeepSpeed divides the summed gradients by the world size
            m["mismatch_kl"] = mismatch_kl(batch.old_logprobs, new_lp, batch.loss_mask).item()
            for key, value in m.items():
                sums[key] += value * batch.num_tokens
            self.engine.backward(loss, scale_wrt_gas=False)
            loss_sum += float(loss.item())
            if last and self.engine.zero_optimization_stage() == 0:
                grad_norm = self._local_grad_norm()
            self.engine.step()
        if grad_norm is None:
            grad_norm = self.engine.get_global_grad_norm()
        metrics = {key: value / max(total, 1) for key, value in sums.items()}
        if batches[0].ref_logprobs is None and self.reference is None:
            metrics.pop("kl_ref")
        metrics.update(self._correction_metrics(weights, samples, per_sample))
        metrics.update(loss=loss_sum, grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                       lr=float(self.engine.optimizer.param_groups[0]["lr"]), tokens=total, samples=len(samples),
                       step=self.step)
        return metrics

    def _packed_micro_batches(self, samples: list[Sample], budget: int) -> tuple[list, list, torch.Tensor]:
        """(micro-batches, their packed rows, trained tokens of each sample in `samples` order) with
        packing on (`packing.py`): bins of at most `budget` tokens, as many on every rank."""
        limit = self.config.seq_len_limit
        if not getattr(self, "_packing_checked", False):
            packing.check_isolation(self.engine, self.engine.device)
            self._packing_checked = True
        bins = packing.plan([min(len(s.token_ids), limit) for s in samples], budget)
        if self.world_size > 1:
            bins = packing.fill(bins, self._most_micro_batches(len(bins)))
        batches, rows = [], []
        per_sample = torch.zeros(len(samples))
        for members in bins:
            batch = collate([samples[i] for i in members] or [packing.filler(samples[0])], self.pad_id, max_len=limit)
            if members:
                per_sample[members] = batch.loss_mask.sum(dim=1)
            batches.append(batch.to(self.engine.device))
            rows.append(packing.pack(batch).to(self.engine.device))
        return batches, rows, per_sample

    def _token_logprobs(self, model, batch, forward) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's (logprobs, entropy): through its packed row, or its shared prompts (or None)."""
        if isinstance(forward, packing.PackedRow):
            return packing.token_logprobs(model, batch, forward, self.temperature)
        return shared_prompts.token_logprobs(model, batch, forward, self.temperature)

    def _old_logprobs(self, batches, prompts) -> list[torch.Tensor]:
        """pi_old of every micro-batch: the step's starting weights, no gradient, before any update."""
        self.engine.eval()
        try:
            with torch.no_grad():
                return [self._token_logprobs(self.engine, b, p)[0] for b, p in zip(batches, prompts)]
        finally:
            self.engine.train()

    def _correction_metrics(self, weights: list, samples: list[Sample], per_sample: torch.Tensor) -> dict:
        """The behaviour weights' diagnostics over every rank's units (when a correction is on) and the
        token-weighted policy lag of this rank's samples (when they all carry their staleness)."""
        out: dict = {}
        parts = [w for w in weights if w is not None]
        if parts:
            mine = tuple(torch.cat([getattr(w, f) for w in parts]).cpu() for f in ("raw", "applied", "rejected"))
            every = [mine]
            if self.world_size > 1:
                every = [None] * self.world_size
                torch.distributed.all_gather_object(every, mine)
            out.update(corrections.diagnostics(*(torch.cat([e[j] for e in every]) for j in range(3))))
        lag = corrections.policy_lag([s.staleness for s in samples], per_sample)
        if lag is not None:
            out[corrections.POLICY_LAG] = lag
        return out

    def _global_counts(self, tokens: int, sequences: int) -> tuple[int, int]:
        """Masked tokens and trained sequences of the step over all ranks."""
        if self.world_size == 1:
            return tokens, sequences
        t = torch.tensor([tokens, sequences], dtype=torch.long, device=self.engine.device)
        torch.distributed.all_reduce(t)
        return int(t[0]), int(t[1])

    def _check_same_micro_batches(self, count: int) -> None:
        """ZeRO 2/3 reduce inside backward: ranks with different micro-batch counts would hang."""
        if self.world_size == 1:
            return
        t = torch.tensor([count, -count], dtype=torch.long, device=self.engine.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        if int(t[0]) != -int(t[1]):
            raise ValueError(f"train_step: ranks passed between {-int(t[1])} and {int(t[0])} micro-batches; "
                             f"give every rank the same number of samples (e.g. {self.samples_per_step})")

    def _most_micro_batches(self, count: int) -> int:
        """The largest micro-batch count of any rank (packed bins differ between ranks)."""
        t = torch.tensor([count], dtype=torch.long, device=self.engine.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t[0])

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
        self.engine.save_checkpoint(str(dir), tag=CKPT_TAG, client_state={CLIENT_KEY: dict(client_state)},
                                    exclude_frozen_parameters=self.lora is not None)
        if self.rank == 0:
            record = {"model_path": self.model_path, "training": self.config.model_dump(mode="json")}
            (Path(dir) / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def load_checkpoint(self, dir: Path) -> dict:
        if not (Path(dir) / CKPT_TAG).is_dir():
            raise NotFoundError(f"no DeepSpeed checkpoint under {dir} (expected {Path(dir) / CKPT_TAG})",
                                "point at a directory written by save_checkpoint, or start without resuming")
        self._check_lora_record(Path(dir))
        # with LoRA the checkpoint holds the adapter alone: the base weights stay as loaded
        path, client = self.engine.load_checkpoint(str(dir), tag=CKPT_TAG, load_module_strict=self.lora is None)
        if path is None:
            raise NotFoundError(f"DeepSpeed could not load the checkpoint under {dir}",
                                "check that every rank sees the directory and that the world size matches")
        return dict((client or {}).get(CLIENT_KEY, {}))

    def _check_lora_record(self, dir: Path) -> None:
        """A checkpoint written with other LoRA settings (or none) is refused by name, not half loaded."""
        try:
            record = json.loads((dir / RECORD).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return  # written before the record existed: by a trainer without LoRA
        saved = (record.get("training") or {}).get("lora")
        mine = self.lora.model_dump(mode="json") if self.lora is not None else None
        if saved != mine:
            raise ConfigError(f"the checkpoint under {dir} was trained with training.lora={saved}, and this trainer "
                              f"has training.lora={mine}", "resume with the checkpoint's training.lora settings, or "
                              "start a new run (training.resume_from_latest: false, or another run directory)")

    def export_adapter(self, dir: Path) -> Path:
        """peft's adapter directory (adapter_config.json, adapter_model.safetensors) at `dir`, written
        by rank 0; every rank must call it (ZeRO-3 gathers the adapter)."""
        if self.peft_model is None:
            raise ConfigError("export_adapter needs training.lora: this trainer trains every weight",
                              "set training.lora, or export the full weights (export_weights)")
        with self._gathered([p for _, p in lora.adapter_parameters(self.module)]):
            if self.rank == 0:
                lora.save_adapter(self.peft_model, Path(dir))
        if self.world_size > 1:
            torch.distributed.barrier()
        return Path(dir)

    def export_weights(self, dir: Path) -> Path:
        """An ordinary Hugging Face directory; with LoRA the adapter merged into a copy of the adapted
        weights (the training model keeps its adapter)."""
        from agentrl_cli.model.tiny import save_model_dir

        info = {"kind": "export", "step": self.step}
        if self.lora is not None:
            info["lora_merged"] = self.lora.model_dump(mode="json")
        with self._gathered(list(self.module.parameters())):
            if self.rank == 0:
                model = lora.merged_model(self.module) if self.lora is not None else self.module
                save_model_dir(model, self.tokenizer, Path(dir), info)
        if self.world_size > 1:
            torch.distributed.barrier()
        return Path(dir)

    def parameter_names(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, full shape) of every parameter, tied ones under each of their names; with LoRA the
        ordinary names of the model without adapters (lora.hf_parameters)."""
        return [(name, tuple(getattr(p, "ds_shape", p.shape)))
                for name, p, _ in lora.hf_parameters(self.module, remove_duplicate=False)]

    def named_parameter_sample(self, names: list[str], n: int) -> dict[str, list[float]]:
        """The first `n` values of each named parameter (with LoRA: merged), by ordinary name."""
        params = {name: (p, layer) for name, p, layer in lora.hf_parameters(self.module, remove_duplicate=False)}
        missing = [name for name in names if name not in params]
        if missing:
            raise KeyError(f"no parameter named {missing}; some that exist: {sorted(params)[:5]}")
        with self._gathered([q for name in names for q in lora.merge_inputs(*params[name])]):
            return {name: lora.merged_value(*params[name]).flatten()[:n].float().cpu().tolist() for name in names}

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Full CPU copies of every parameter under its Hugging Face name (tied ones once), in
        `named_parameters` order, on rank 0; {} on the other ranks. With LoRA: the merged weights under
        their ordinary names, no adapter tensors. Every rank must call it (ZeRO-3 gathers the
        partitions, as export_weights does)."""
        params = lora.hf_parameters(self.module)
        with self._gathered(list(self.module.parameters())):
            out = ({name: lora.merged_value(p, layer).to("cpu", copy=True) for name, p, layer in params}
                   if self.rank == 0 else {})
        return out

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
        self.engine = None
        self._pg.close()
