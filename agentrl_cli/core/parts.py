"""The registries' tables as data: every swappable part agentrl ships, a row each - its config name,
the `module:Class` it is built from, and what it honours. The config validates names and knobs
against these rows; the factories (`learner/backend.py`, `weightsync/registry.py`, the reward
registry, the store and executor factories) load from them; the capability matrix in the README is
generated from them (`capabilities.py`).

A part written by a user (`training.backend: my.mod:MyBackend`) has no row: it says what it honours
with a class attribute `honours` (a set of the feature names below; an engine with its `capabilities`);
a part without one honours none of them, and a knob that needs a feature it lacks is refused at load (`refused_knobs`).

Belongs here: the rows and the knob table. Does not: loading classes (`plugins.py`), the parts'
code (each in its own wing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl_cli.core.plugins import PLUGIN_PATH, import_target


@dataclass(frozen=True)
class Part:
    """One row: a part's config name, the `module:Class` it is built from, and what it honours."""

    name: str
    target: str
    honours: frozenset[str] = field(default_factory=frozenset)
    summary: str = ""
    packages: tuple[str, ...] = ()  # the distributions its engine comes from (select's dependency and maintenance probes)


# Features a backend row may name besides the step's: "sharding" (it shards over the ranks) and how -
# "zero_stage" (it reads training.zero_stage, 0-3) or "full_shard" (weights, gradients and optimizer
# state all sharded, as ZeRO-3).
# What the learner's one step honours (the loss, its corrections, packing, aggregation and LoRA):
# the built-in backends run that step (`learner/policy_rank.py`), so they honour all of it.
POLICY_STEP = frozenset({"correction", "packing", "loss_aggregation", "lora"})

BACKENDS: tuple[Part, ...] = (  # training.backend
    Part("deepspeed", "agentrl_cli.learner.deepspeed_backend:DeepSpeedBackend", POLICY_STEP | {"sharding", "zero_stage"},
         "DeepSpeed ZeRO stage 0-3 (training.zero_stage)", ("deepspeed",)),
    Part("fsdp", "agentrl_cli.learner.fsdp_backend:FSDPBackend", POLICY_STEP | {"sharding", "full_shard"},
         "PyTorch FSDP2, parameters sharded over the ranks", ("torch",)),
)
TRANSPORTS: tuple[Part, ...] = (  # training.weight_sync
    Part("disk", "agentrl_cli.weightsync.disk:DiskTransport", frozenset({"full", "adapter"}),
         "safetensors on a shared path, loaded by every server"),
    Part("distributed", "agentrl_cli.weightsync.distributed:DistributedTransport", frozenset({"full"}),
         "a broadcast over a process group the servers join"),
)
LORA_TRANSPORTS: tuple[Part, ...] = (  # training.weight_sync with training.lora set
    Part("disk", "agentrl_cli.weightsync.lora:LoraTransport", frozenset({"adapter"}), "the adapter alone"),
)
# inference.engine: what each honours is its class's `capabilities` (engines/engine.py; a test keeps the
# two in step): "transport:<name>" per weight-sync transport its servers take, "adapters" (LoRA adapters
# loaded at run time), "pause:<mode>" per pause mode, "tool_choice" (a named tool_choice enforced),
# "pipeline_parallel" (inference.pp_size above 1).
ENGINES: tuple[Part, ...] = (
    Part("hf", "agentrl_cli.engines.embedded:EmbeddedEngine",
         frozenset({"transport:disk", "transport:distributed", "adapters", "pause:abort", "pause:retract", "pause:in_place",
                    "dialect:sglang", "dialect:vllm"}),
         "the embedded Hugging Face server on this host's CPU, in SGLang's or vLLM's dialect (inference.dialect)"),
    Part("sglang", "agentrl_cli.engines.sglang:SGLangEngine",
         frozenset({"transport:disk", "transport:distributed", "adapters", "pause:abort", "pause:retract", "pause:in_place",
                    "tool_choice", "pipeline_parallel", "dialect:sglang"}),
         "SGLang servers on GPU hosts, behind sglang-router with several replicas", ("sglang", "sglang-router")),
    Part("vllm", "agentrl_cli.engines.vllm:VLLMEngine",
         frozenset({"transport:disk", "transport:distributed", "adapters", "pause:abort", "pause:wait", "pause:keep",
                    "tool_choice", "pipeline_parallel", "dialect:vllm"}),
         "vLLM servers on GPU hosts, behind vllm-router with several replicas", ("vllm", "vllm-router")),
)
DIALECTS = ("sglang", "vllm")  # inference.dialect: the native protocols; an engine row honours "dialect:NAME"
VERIFIERS: tuple[Part, ...] = (  # reward.verifiers
    Part("judge", "agentrl_cli.runtime.reward.judge:JudgeVerifier", summary="a model judge over HTTP"),
    Part("reward_model", "agentrl_cli.runtime.reward.reward_model:RewardModelVerifier",
         summary="a reward model trained from stored trajectories"),
)
# reward.weights: the terms every reward result carries (`harness` only with reward: mix), computed
# in `runtime/reward/aggregate.py`.
REWARD_TERMS: tuple[Part, ...] = tuple(
    Part(name, f"agentrl_cli.runtime.reward.aggregate:{name}") for name in
    ("outcome", "format", "tool_legality", "turns_in_range", "invalid_action_ratio", "harness"))
STORES: tuple[Part, ...] = (  # data.store
    Part("local", "agentrl_cli.runtime.data.local_store:LocalStore", summary="files under data.root"),
    Part("s3", "agentrl_cli.runtime.data.s3:S3Store", frozenset({"spool"}),
         "any S3-compatible endpoint, spooling under data.root/spool in an outage"),
)
EXECUTORS: tuple[Part, ...] = (  # controlplane.executor
    Part("local", "agentrl_cli.ops.controlplane.local:LocalExecutor", summary="subprocesses on this host"),
    Part("slurm", "agentrl_cli.ops.controlplane.slurm:SlurmExecutor", summary="sbatch"),
    Part("kubernetes", "agentrl_cli.ops.controlplane.kubernetes:KubernetesExecutor",
         summary="Jobs queued by Kueue"),
)


def names(rows: tuple[Part, ...]) -> tuple[str, ...]:
    return tuple(p.name for p in rows)


def table(rows: tuple[Part, ...]) -> dict[str, str]:
    """{name: module:Class}, the form `plugins.load_class` reads."""
    return {p.name: p.target for p in rows}


def row(rows: tuple[Part, ...], name: str) -> Part | None:
    return next((p for p in rows if p.name == name), None)


@dataclass(frozen=True)
class Knob:
    """A config key that takes effect only where the chosen part honours `feature`."""

    key: str
    feature: str
    is_set: Callable[[Any], bool]  # the section's value -> does it ask for the feature
    fix: str


BACKEND_KNOBS: tuple[Knob, ...] = (
    Knob("training.correction", "correction", lambda t: t.correction != "none", "set training.correction: none"),
    Knob("training.max_tokens_per_micro_batch", "packing", lambda t: t.max_tokens_per_micro_batch > 0,
         "set training.max_tokens_per_micro_batch: 0 (no packing)"),
    Knob("training.loss_aggregation", "loss_aggregation", lambda t: t.loss_aggregation != "token_mean",
         "set training.loss_aggregation: token_mean"),
    Knob("training.lora", "lora", lambda t: t.lora is not None, "unset training.lora (full fine-tuning)"),
)

ENGINE_KNOBS: tuple[Knob, ...] = (
    Knob("inference.pp_size", "pipeline_parallel", lambda i: i.pp_size > 1,
         "set inference.pp_size: 1 (the model whole in each server; more servers with inference.replicas)"),
)


def engine_features(capabilities: Any) -> frozenset[str]:
    """An engine class's `capabilities` (engines/engine.py's `Capabilities`) as the features its row
    would name: how a `module:Class` engine says what it honours."""
    c = capabilities
    flags = {"adapters": "adapters", "constrained_tool_choice": "tool_choice", "pipeline_parallel": "pipeline_parallel"}
    return frozenset({f"transport:{t}" for t in getattr(c, "transports", ())} | {f"pause:{m}" for m in getattr(c, "pause_modes", ())}
                     | {feature for attr, feature in flags.items() if getattr(c, attr, False)}
                     | {f"dialect:{d}" for d in getattr(c, "dialects", ())})


def honours(rows: tuple[Part, ...], name: str, key: str) -> frozenset[str]:
    """What the part `name` honours: its row's set, or a `module:Class` part's `honours` attribute
    (imported here; an import failure names `key`)."""
    hit = row(rows, name)
    if hit is not None:
        return hit.honours
    if not PLUGIN_PATH.match(name):
        return frozenset()
    cls = import_target(f"{key} {name!r}", name)
    declared = frozenset(getattr(cls, "honours", ()) or ())
    if getattr(cls, "capabilities", None) is not None:  # an engine says what it honours in its capabilities
        declared |= engine_features(cls.capabilities)
    if hasattr(cls, "export_adapter"):  # the LoRA members (learner/backend.py) are how a backend honours lora
        declared |= {"lora"}
    return declared


def refused_knobs(rows: tuple[Part, ...], name: str, key: str, section: Any,
                  knobs: tuple[Knob, ...]) -> list[tuple[str, str]]:
    """(what is wrong, the fix) per knob set in `section` that the part `name` (named by `key`) does
    not honour; a part is imported only when a knob asks something of it."""
    asked = [k for k in knobs if k.is_set(section)]
    if not asked:
        return []
    have = honours(rows, name, key)
    return [(f"{k.key} is set but the {key} {name!r} does not honour it (it honours: "
             f"{', '.join(sorted(have)) or 'none of ' + ', '.join(sorted(x.feature for x in knobs))})",
             f"{k.fix}, or choose a part that does (one of {', '.join(p.name for p in rows if k.feature in p.honours)}"
            f", or a `module:Class` whose `honours` names {k.feature!r})") for k in asked if k.feature not in have]
