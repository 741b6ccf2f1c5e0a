"""The resource-planning table: what the configured run needs, each line with its formula and inputs.

Training accelerators per node come from weights + gradients + optimizer state under the chosen
ZeRO stage and precision; inference memory from weights plus the KV cache at the context length
and the episodes each server holds; environment hosts from concurrency times each harness's CPU and
memory; storage per day from checkpoint size and trajectory volume. The model's shape is read from
its config.json (the built-in model's architecture when it is not built yet), with parameters counted
by instantiating it on torch's meta device (no memory, exact for any architecture).
Belongs here: the arithmetic and the model shape. Rendering is in `cli/commands/plan.py`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from agentrl_cli.core import parts

GB = 1e9
BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
ACTIVATION_HEADROOM = 1.2  # training memory beyond the model states: activations, buffers, fragmentation


@dataclass
class ModelShape:
    source: str
    params: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int

    def to_dict(self) -> dict:
        return asdict(self)


def model_shape(model_config) -> ModelShape:
    """Parameters and KV geometry of `model.path` without loading weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = model_config.path
    if path.startswith("builtin:"):
        from agentrl_cli.model.resolve import builtin_dir

        built = builtin_dir(model_config.cache_dir, path.removeprefix("builtin:"))
        if (built / "config.json").exists():
            hf, source = AutoConfig.from_pretrained(built), str(built)
        else:
            from agentrl_cli.model.tiny import tiny_config
            from agentrl_cli.model.tokenizer import build_tokenizer

            hf, source = tiny_config(build_tokenizer()), f"{path} (architecture; not built yet)"
    else:
        from agentrl_cli.model.resolve import resolve_model_path

        d = resolve_model_path(path, model_config.cache_dir, build=False)
        hf, source = AutoConfig.from_pretrained(d), str(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    params = sum(p.numel() for p in model.parameters())
    heads = getattr(hf, "num_attention_heads", 1)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return ModelShape(source, params, getattr(hf, "num_hidden_layers", 0), getattr(hf, "num_key_value_heads", None) or heads,
                      head_dim, getattr(hf, "vocab_size", 0))


@dataclass
class PlanLine:
    area: str
    item: str
    value: float
    unit: str
    formula: str
    inputs: dict = field(default_factory=dict)


@dataclass
class PlanInputs:
    accelerator_memory_gb: float = 80.0
    env_host_cpus: float = 32.0
    env_host_memory_gb: float = 128.0
    step_seconds: float = 60.0
    trajectory_bytes_per_token: float = 6.0  # stored per token after compression: ids, mask, log-probs and text


def zero_state_bytes(params: int, precision: str, zero_stage: int, ranks: int) -> dict[str, float]:
    """Per-rank bytes of weights, gradients and Adam state (fp32 master + two moments) under ZeRO:
    stage 1 shards the optimizer state, 2 also the gradients, 3 also the weights."""
    w = BYTES[precision]
    opt = (4 if precision != "fp32" else 0) + 8
    return {"weights": params * w / (ranks if zero_stage >= 3 else 1),
            "gradients": params * w / (ranks if zero_stage >= 2 else 1),
            "optimizer": params * opt / (ranks if zero_stage >= 1 else 1)}


def build_plan(cfg, shape: ModelShape, inputs: PlanInputs) -> list[PlanLine]:
    t, inf, ro, cl = cfg.training, cfg.inference, cfg.rollout, cfg.cluster
    lines: list[PlanLine] = []
    p = shape.params
    ranks = max(t.world_size, 1)
    honours = (parts.row(parts.BACKENDS, t.backend) or parts.Part(t.backend, t.backend)).honours
    full_shard = "full_shard" in honours  # weights, gradients and optimizer state all sharded (FSDP)
    stage = 3 if full_shard else t.zero_stage
    sharding = f"{t.backend.upper()} (as ZeRO-3)" if full_shard else f"ZeRO-{t.zero_stage}"
    st = zero_state_bytes(p, t.precision, stage, ranks)
    per_rank = sum(st.values()) * ACTIVATION_HEADROOM
    lines.append(PlanLine("training", "memory per rank", per_rank / GB, "GB",
                          f"(weights {st['weights'] / GB:.3g} + gradients {st['gradients'] / GB:.3g} + optimizer "
                          f"{st['optimizer'] / GB:.3g}) x {ACTIVATION_HEADROOM} headroom; {sharding} shards "
                          "optimizer (1), + gradients (2), + weights (3) over the ranks",
                          {"params": p, "precision": t.precision, "backend": t.backend, "zero_stage": stage, "ranks": ranks}))
    fits = math.floor(inputs.accelerator_memory_gb * GB / per_rank) if per_rank else 0
    min_ranks = next((r for r in range(1, 4097) if sum(zero_state_bytes(p, t.precision, stage, r).values())
                      * ACTIVATION_HEADROOM <= inputs.accelerator_memory_gb * GB), None)
    lines.append(PlanLine("training", "smallest data-parallel size that fits", float(min_ranks or 0), "accelerators",
                          f"least n with memory per rank(n) <= {inputs.accelerator_memory_gb:g} GB per accelerator "
                          "(0 = does not fit: use ZeRO-3, lower precision or tensor parallelism)",
                          {"accelerator_memory_gb": inputs.accelerator_memory_gb}))
    lines.append(PlanLine("training", "accelerators per node (configured)", float(cl.gpus_per_node), "accelerators",
                          "cluster.gpus_per_node; nodes = ceil(world_size / gpus_per_node)",
                          {"world_size": t.world_size, "nodes": math.ceil(t.world_size / cl.gpus_per_node) if cl.gpus_per_node else 0,
                           "ranks_per_accelerator_fit": fits}))
    dtype_b = BYTES[cfg.model.dtype]
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_b
    per_server = math.ceil(ro.concurrency / inf.replicas)
    ctx = cfg.model.context_length
    kv = kv_per_token * ctx * per_server
    weights = p * dtype_b
    lines.append(PlanLine("inference", "KV cache per server", kv / GB, "GB",
                          f"2 (K,V) x layers {shape.layers} x kv_heads {shape.kv_heads} x head_dim {shape.head_dim} x "
                          f"{dtype_b} B x context {ctx} x episodes per server ceil({ro.concurrency}/{inf.replicas})",
                          {"kv_bytes_per_token": kv_per_token}))
    lines.append(PlanLine("inference", "memory per server", (weights + kv) / GB, "GB",
                          f"weights {p} x {dtype_b} B + KV cache; divide by tp_size {inf.tp_size} per accelerator",
                          {"weights_gb": round(weights / GB, 4), "tp_size": inf.tp_size}))
    lines += rollout_lines(cfg)
    trained = [h for h in cfg.harnesses]
    total_w = sum(h.weight for h in trained) or 1.0
    cpu = mem = 0.0
    for h in trained:
        share = ro.concurrency * (h.weight / total_w) if h.weight else 0.0
        if h.max_concurrency:
            share = min(share, h.max_concurrency)
        cpu += share * (h.cpu if h.cpu is not None else 1.0)  # no quota set: count a core per instance
        mem += share * (h.memory_gb if h.memory_gb is not None else cfg.sandbox.memory_mb / 1024)
    hosts = max(math.ceil(cpu / inputs.env_host_cpus), math.ceil(mem / inputs.env_host_memory_gb), 1 if cpu else 0)
    lines.append(PlanLine("environments", "CPU cores", cpu, "cores",
                          "sum over harnesses of concurrency x weight share (capped by max_concurrency) x harnesses[].cpu",
                          {"concurrency": ro.concurrency}))
    lines.append(PlanLine("environments", "memory", mem, "GB", "same shares x harnesses[].memory_gb"))
    lines.append(PlanLine("environments", "hosts", float(hosts), "hosts",
                          f"max(ceil(cores / {inputs.env_host_cpus:g}), ceil(memory / {inputs.env_host_memory_gb:g} GB))",
                          {"env_host_cpus": inputs.env_host_cpus, "env_host_memory_gb": inputs.env_host_memory_gb}))
    from agentrl_cli.ops.bench.storage import checkpoint_bytes

    ckpt = checkpoint_bytes(p, t.precision)
    per_day = 86400 / (inputs.step_seconds * t.checkpoint_interval_steps)
    lines.append(PlanLine("storage", "checkpoint size", ckpt / GB, "GB",
                          "params x (weight bytes + fp32 master if not fp32 + 8 B Adam moments)", {"precision": t.precision}))
    lines.append(PlanLine("storage", "checkpoints written per day", ckpt * per_day / GB, "GB/day",
                          f"checkpoint size x 86400 / ({inputs.step_seconds:g} s per step x {t.checkpoint_interval_steps} steps); "
                          f"kept on disk: {t.keep_last_checkpoints} x checkpoint size",
                          {"kept_gb": round(ckpt * t.keep_last_checkpoints / GB, 4)}))
    traj_per_step = t.micro_batch_size * t.gradient_accumulation_steps * t.world_size
    traj_bytes = t.seq_len_limit * inputs.trajectory_bytes_per_token
    lines.append(PlanLine("storage", "trajectories per day", traj_per_step * traj_bytes * 86400 / inputs.step_seconds / GB, "GB/day",
                          f"trajectories per step {traj_per_step} x seq_len_limit {t.seq_len_limit} x "
                          f"{inputs.trajectory_bytes_per_token:g} B/token x 86400 / {inputs.step_seconds:g} s per step; "
                          f"kept {cfg.data.retention_days} days",
                          {"retention_days": cfg.data.retention_days}))
    return lines


def rollout_lines(cfg) -> list[PlanLine]:
    """The rollout's backpressure limit derived from its memory budget (`config/buffer_budget.py`)."""
    from agentrl_cli.config.buffer_budget import ARRAY_BYTES_PER_TOKEN, EPISODE_OVERHEAD_BYTES, TEXT_BYTES_PER_TOKEN, MB, buffer_limit

    ro = cfg.rollout
    lim = buffer_limit(ro.max_buffer_mb, ro.buffer_size, cfg.model.context_length)
    inputs = {**lim.to_dict(), "array_bytes_per_token": ARRAY_BYTES_PER_TOKEN, "text_bytes_per_token": TEXT_BYTES_PER_TOKEN,
              "episode_overhead_bytes": EPISODE_OVERHEAD_BYTES}
    return [
        PlanLine("rollout", "memory per held episode", lim.bytes_per_episode / MB, "MiB",
                 f"model.context_length {lim.context_length} x ({ARRAY_BYTES_PER_TOKEN} B ids+mask+log-probs + "
                 f"{TEXT_BYTES_PER_TOKEN} B text) + {EPISODE_OVERHEAD_BYTES // 1024} KiB record", inputs),
        PlanLine("rollout", "episodes the memory budget holds", float(lim.budget_episodes), "episodes",
                 f"floor(rollout.max_buffer_mb {lim.max_buffer_mb:g} MiB / memory per held episode)"),
        PlanLine("rollout", "episodes held at most (in flight + buffered)", float(lim.capacity), "episodes",
                 lim.formula() + "; new episodes wait while this many are held", {"binds": lim.binds}),
        PlanLine("rollout", "episodes in flight at most", float(min(ro.concurrency, lim.capacity)), "episodes",
                 f"min(rollout.concurrency {ro.concurrency}, episodes held at most {lim.capacity})"),
    ]


def plan_dict(shape: ModelShape, lines: list[PlanLine], inputs: PlanInputs) -> dict:
    return {"model": shape.to_dict(), "inputs": asdict(inputs),
            "lines": [{**asdict(ln), "value": round(ln.value, 6)} for ln in lines]}
