"""What every trainer backend's rank does the same way, whatever engine runs the optimizer: loading
the policy (and its LoRA adapter and KL reference), one GRPO train step over micro-batches, the
off-policy correction, the parameter views weight sync reads, the export of Hugging Face weights
and the checkpoint record. A backend (`deepspeed_backend.py`, `fsdp_backend.py`) subclasses
`PolicyRank` and supplies the engine: the module it trains, backward, the optimizer step, gathering
sharded parameters, and its checkpoint files.

Step semantics (the same for every backend):
- One `train_step` is one optimizer step. Its samples are split into micro-batches of
  `training.micro_batch_size`; gradients accumulate over them and the optimizer steps after the last
  (`training.gradient_accumulation_steps` only tells callers how many samples to pass:
  `samples_per_step`). Each micro-batch loss is divided by the step's masked-token count over ALL
  ranks and multiplied by the world size (the engines average gradients over the ranks), so the
  update is the token mean over every rank's samples however unevenly the tokens fall, and the mean
  of the ranks' reported losses is the loss one rank would report on all the samples (`seq_mean` and
  `seq_mean_token_sum` likewise count the sequences of all ranks).
- Samples of a micro-batch that begin with the same prompt (a GRPO group) share one forward pass
  over it (`shared_prompts.py`): the same log-probs and gradients, for a fraction of the tokens.
- With `training.max_tokens_per_micro_batch` set, micro-batches are bins of at most that many
  tokens instead, each run as one packed row with no padding (`packing.py`; prompt sharing is then
  off); the loss is the padded one. Ranks with fewer bins run empty filler micro-batches so every
  rank runs as many (sharded engines gather or reduce inside forward and backward).
- With `training.correction` other than none, the step needs pi_old, the log-probs of the weights the
  step starts from. Those weights are the ones every micro-batch's training forward runs with (the
  step's one optimizer step comes after the last), so with no dropout in the model (LoRA's included)
  pi_old is that forward's log-probs, detached, as TRL's and verl's single-update steps take them.
  With dropout, the step first runs a no-grad forward (eval mode) over all its micro-batches before
  any of them trains. The behaviour weights and their diagnostics (`corrections.py`) come from pi_old;
  with several ranks the diagnostics are gathered over every rank's units, so each rank reports the
  step's figures.
- With `training.lora` set, peft's LoRA layers are put in the model (`lora.py`) and only their
  parameters train and reach the optimizer. The KL reference is the same model with its adapters
  switched off. `export_adapter` writes peft's adapter directory; `export_weights`,
  `parameter_names`, `named_parameter_sample` and `named_tensors` give the ordinary Hugging Face
  names with merged values (base + adapter), so a full weight sync needs no LoRA support.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.core import parts
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.learner import corrections, lora, packing, shared_prompts
from agentrl_cli.learner.grpo import Sample, aggregation_weights, collate, mismatch_kl
from agentrl_cli.learner.step_clock import StepClock

RECORD = "agentrl-backend.json"  # beside the engine's files: the model and training config that wrote them


class PolicyRank:
    """One rank of a GRPO policy. Subclasses set `self._pg` (a ProcessGroup) before `_load_policy`, and
    implement the engine hooks below (`module`, `forward_model`, `optimizer`, `step`, `device`,
    `_begin_micro_batch`, `_backward`, `_end_micro_batch`, `_gathered`, checkpoints, `close`)."""

    honours = parts.POLICY_STEP  # corrections, packing, loss aggregation, LoRA: this step runs them all

    # ---- set up ---------------------------------------------------------------------------------

    def _load_policy(self, model_path: str | Path, training_config: TrainingConfig, tokenizer_path, temperature: float):
        """The Hugging Face model to train (LoRA layers in it when `training.lora` is set), with the
        tokenizer, pad id, rank and correction set on `self`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = training_config
        self.correction = corrections.Correction.from_config(training_config)
        self.entropy_coef = training_config.entropy_coef  # moved after each step under training.entropy_target
        self.temperature = temperature
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        torch.manual_seed(training_config.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        self.model_path = str(Path(model_path).absolute()) if Path(model_path).is_dir() else str(model_path)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (model.config.pad_token_id or 0))
        self.lora, self.peft_model = training_config.lora, None
        if self.lora is not None:  # the engine trains the model with peft's layers in it (lora.py)
            self.peft_model = lora.wrap(model, self.lora)
            model = self.peft_model.get_base_model()
        return model

    def _load_reference(self, model_path: str | Path) -> None:
        """The KL penalty's reference: the starting policy, frozen (samples may also bring their own);
        with LoRA, the trained model itself with its adapters switched off."""
        from transformers import AutoModelForCausalLM

        self.reference = None
        if self.config.kl_coef > 0 and self.peft_model is not None:
            self.reference = lora.AdaptersOff(self.peft_model, self.module)
        elif self.config.kl_coef > 0:
            self.reference = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
            self.reference.eval().requires_grad_(False).to(self.device)

    @property
    def samples_per_step(self) -> int:
        """Samples per rank that make micro_batch_size x gradient_accumulation_steps."""
        return self.config.micro_batch_size * self.config.gradient_accumulation_steps

    # ---- the step -------------------------------------------------------------------------------

    def train_step(self, samples: list[Sample]) -> dict:
        if not samples:
            raise ValueError("train_step: no samples; every rank must pass at least one")
        model = self.forward_model
        if self.config.max_tokens_per_micro_batch:
            batches, prompts, per_sample = self._packed_micro_batches(samples, self.config.max_tokens_per_micro_batch)
        else:
            mbs = self.config.micro_batch_size
            batches, prompts = [], []
            for i in range(0, len(samples), mbs):
                batch = collate(samples[i:i + mbs], self.pad_id, max_len=self.config.seq_len_limit)
                split = shared_prompts.split(batch, self.pad_id) if shared_prompts.cache_argument(model) else None
                batches.append(batch.to(self.device))
                prompts.append(split.to(self.device) if split is not None else None)
            self._check_same_micro_batches(len(batches))
            per_sample = torch.cat([b.loss_mask.sum(dim=1) for b in batches])
        total = sum(b.num_tokens for b in batches)
        sequences = sum(int((b.loss_mask.sum(dim=1) > 0).sum()) for b in batches)
        global_total, global_sequences = self._global_counts(total, sequences)
        aggregation = getattr(self.config, "loss_aggregation", "token_mean")
        sums = dict.fromkeys(("clip_fraction", "approx_kl", "entropy", "mismatch_kl", "kl_ref"), 0.0)
        loss_sum, grad_norm = 0.0, None
        clock = StepClock(self.device)
        t = clock.mark()
        # pi_old: the weights the step starts from. They stay the weights of every micro-batch's training
        # forward until the step's one optimizer step, so where that forward computes what an eval-mode
        # forward does (no dropout) its detached log-probs are pi_old and the separate pass is skipped
        separate = self.correction.needs_old_logprobs and not self._forward_is_deterministic()
        old = self._old_logprobs(batches, prompts) if separate else [None] * len(batches)
        weights = [corrections.behaviour_weights(o, b.old_logprobs, b.loss_mask, self.correction) if o is not None else None
                   for o, b in zip(old, batches)]
        model.train()
        t = clock.span("forward", t)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            self._begin_micro_batch(last)
            new_lp, entropy = self._token_logprobs(model, batch, prompts[i])
            if self.correction.needs_old_logprobs and not separate:
                old[i] = new_lp.detach()
                weights[i] = corrections.behaviour_weights(old[i], batch.old_logprobs, batch.loss_mask, self.correction)
            ref_lp = batch.ref_logprobs
            if ref_lp is None and self.reference is not None:
                with torch.no_grad():
                    ref_lp, _ = self._token_logprobs(self.reference, batch, prompts[i])
            loss, m = corrections.policy_loss(
                new_lp, old[i], batch.old_logprobs, batch.advantages, batch.loss_mask, self.correction,
                weights[i].weights if weights[i] is not None else None, kl_coef=self.config.kl_coef, ref_lp=ref_lp,
                entropy=entropy, entropy_coef=self.entropy_coef, num_tokens=global_total,
                token_weights=aggregation_weights(aggregation, batch.loss_mask, global_sequences))
            loss = loss * self.world_size  # the engines average the summed gradients over the ranks
            m["mismatch_kl"] = mismatch_kl(batch.old_logprobs, new_lp, batch.loss_mask).item()
            for key, value in m.items():
                sums[key] += value * batch.num_tokens
            t = clock.span("forward", t)
            self._backward(loss)
            t = clock.span("backward", t)
            loss_sum += float(loss.item())
            norm = self._end_micro_batch(last)
            t = clock.span("optimizer", t)
            grad_norm = norm if norm is not None else grad_norm
        metrics = {key: value / max(total, 1) for key, value in sums.items()}
        metrics["entropy_coef"] = self.entropy_coef  # the bonus this step trained with
        self._control_entropy(sums["entropy"], total)
        if batches[0].ref_logprobs is None and self.reference is None:
            metrics.pop("kl_ref")
        metrics.update(self._correction_metrics(weights, samples, per_sample))
        metrics.update(loss=loss_sum, grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
                       lr=float(self.optimizer.param_groups[0]["lr"]), tokens=total, samples=len(samples),
                       step=self.step, sequence_tokens=sum(len(s.token_ids) for s in samples), **clock.seconds())
        return metrics

    def _packed_micro_batches(self, samples: list[Sample], budget: int) -> tuple[list, list, torch.Tensor]:
        """(micro-batches, their packed rows, trained tokens of each sample in `samples` order) with
        packing on (`packing.py`): bins of at most `budget` tokens, as many on every rank."""
        limit = self.config.seq_len_limit
        if not getattr(self, "_packing_checked", False):
            packing.check_isolation(self.forward_model, self.device)
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
            batches.append(batch.to(self.device))
            rows.append(packing.pack(batch).to(self.device))
        return batches, rows, per_sample

    def _token_logprobs(self, model, batch, forward) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's (logprobs, entropy): through its packed row, or its shared prompts (or None)."""
        if isinstance(forward, packing.PackedRow):
            return packing.token_logprobs(model, batch, forward, self.temperature)
        return shared_prompts.token_logprobs(model, batch, forward, self.temperature)

    def _forward_is_deterministic(self) -> bool:
        """Whether the training forward computes what an eval-mode forward does: no dropout anywhere (no
        `nn.Dropout` with p > 0, LoRA's included, and no config `*dropout` above 0, e.g. attention's)."""
        known = getattr(self, "_deterministic", None)
        if known is None:
            from transformers import PretrainedConfig

            modules = list(self.forward_model.modules())  # through DeepSpeed's / FSDP's and peft's wrappers
            dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in modules)
            configs = [m.config.to_dict() for m in modules if isinstance(getattr(m, "config", None), PretrainedConfig)]
            configured = any(k.endswith("dropout") and isinstance(v, (int, float)) and v > 0 for c in configs for k, v in c.items())
            known = self._deterministic = not (dropout or configured)
        return known

    def _old_logprobs(self, batches, prompts) -> list[torch.Tensor]:
        """pi_old of every micro-batch: the step's starting weights, no gradient, before any update."""
        model = self.forward_model
        model.eval()
        try:
            with torch.no_grad():
                return [self._token_logprobs(model, b, p)[0] for b, p in zip(batches, prompts)]
        finally:
            model.train()

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

    def _control_entropy(self, entropy_sum: float, tokens: int) -> None:
        """Adaptive entropy control (`training.entropy_target`): the next step's bonus, one
        `entropy_coef_step` up when this step's mean token entropy over every rank was below the
        target, one down (within [0, entropy_coef_max]) when above. Every rank computes the same."""
        target = getattr(self.config, "entropy_target", None)
        if target is None:
            return
        if self.world_size > 1:
            t = torch.tensor([entropy_sum, float(tokens)], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t)
            entropy_sum, tokens = float(t[0]), float(t[1])
        mean = entropy_sum / max(tokens, 1)
        move = self.config.entropy_coef_step if mean < target else -self.config.entropy_coef_step
        self.entropy_coef = min(max(self.entropy_coef + move, 0.0), self.config.entropy_coef_max)

    def _global_counts(self, tokens: int, sequences: int) -> tuple[int, int]:
        """Masked tokens and trained sequences of the step over all ranks."""
        if self.world_size == 1:
            return tokens, sequences
        t = torch.tensor([tokens, sequences], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t)
        return int(t[0]), int(t[1])

    def _check_same_micro_batches(self, count: int) -> None:
        """Sharded engines gather or reduce inside forward and backward: ranks with different
        micro-batch counts would hang."""
        if self.world_size == 1:
            return
        t = torch.tensor([count, -count], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        if int(t[0]) != -int(t[1]):
            raise ValueError(f"train_step: ranks passed between {-int(t[1])} and {int(t[0])} micro-batches; "
                             f"give every rank the same number of samples (e.g. {self.samples_per_step})")

    def _most_micro_batches(self, count: int) -> int:
        """The largest micro-batch count of any rank (packed bins differ between ranks)."""
        t = torch.tensor([count], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t[0])

    # ---- parameter views and exports --------------------------------------------------------------

    def _gathered(self, params):
        """Full parameter values of `params` inside the block (every rank enters it together)."""
        return contextlib.nullcontext()

    def _plain_model(self):
        """The model to save as Hugging Face weights, inside `_gathered`: with LoRA a merged copy."""
        return lora.merged_model(self.module) if self.lora is not None else self.module

    def export_adapter(self, dir: Path) -> Path:
        """peft's adapter directory (adapter_config.json, adapter_model.safetensors) at `dir`, written
        by rank 0; every rank must call it (sharded engines gather the adapter)."""
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
                save_model_dir(self._plain_model(), self.tokenizer, Path(dir), info)
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
            params = {name: (p, layer) for name, p, layer in lora.hf_parameters(self.module, remove_duplicate=False)}
            return {name: lora.merged_value(*params[name]).flatten()[:n].float().cpu().tolist() for name in names}

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Full CPU copies of every parameter under its Hugging Face name (tied ones once), in
        `named_parameters` order, on rank 0; {} on the other ranks. With LoRA: the merged weights under
        their ordinary names, no adapter tensors. Every rank must call it (sharded engines gather the
        parameters, as export_weights does)."""
        with self._gathered(list(self.module.parameters())):
            params = lora.hf_parameters(self.module)
            out = ({name: lora.merged_value(p, layer).to("cpu", copy=True) for name, p, layer in params}
                   if self.rank == 0 else {})
        return out

    # ---- checkpoint record ------------------------------------------------------------------------

    def _write_record(self, dir: Path) -> None:
        """RECORD beside the engine's files: the model and training config that wrote them (`export.py`
        rebuilds the trainer from it)."""
        if self.rank == 0:
            record = {"model_path": self.model_path, "training": self.config.model_dump(mode="json")}
            (Path(dir) / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def _check_record(self, dir: Path) -> None:
        """A checkpoint written with other LoRA settings (or none), or by another backend, is refused by
        name, not half loaded."""
        try:
            record = json.loads((dir / RECORD).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return  # written before the record existed: by a DeepSpeed trainer without LoRA
        saved_training = record.get("training") or {}
        saved_backend = saved_training.get("backend", "deepspeed")
        if saved_backend != self.config.backend:
            raise ConfigError(f"the checkpoint under {dir} was written by training.backend={saved_backend!r}, and this "
                              f"trainer is {self.config.backend!r}; engine checkpoints do not load across backends",
                              f"resume with training.backend: {saved_backend}, or carry the weights over with "
                              "`agentrl model export RUN` and start a new run from the exported model")
        saved = saved_training.get("lora")
        mine = self.lora.model_dump(mode="json") if self.lora is not None else None
        if saved != mine:
            raise ConfigError(f"the checkpoint under {dir} was trained with training.lora={saved}, and this trainer "
                              f"has training.lora={mine}", "resume with the checkpoint's training.lora settings, or "
                              "start a new run (training.resume_from_latest: false, or another run directory)")
