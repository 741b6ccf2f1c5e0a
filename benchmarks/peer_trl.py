"""agentrl against Hugging Face TRL's GRPOTrainer, side by side on this machine: the built-in model
loaded by both, the terminal_like `arith` prompts in the same order with the same prompt token ids,
GRPO groups of 8 x 8 prompts = 64 samples per step in one micro-batch, temperature 1.0, 32 new tokens
per model turn, lr 1e-5, no KL, fp32, PPO clip 0.2, the same reward (agentrl's `Scorer`).

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

samples/s counts trained samples over the steps after the first (start-up and the first step's
warm-up are left out for both). Each run prints what was trained: samples, and mean tokens per
sample (whole sequence, and the model's own tokens), which must agree within 5%.
Per-step breakdown of agentrl's time: waiting for samples, train step, weight sync, checkpoint and
the rest on the trainer's path; generation, reward, store writes and environment time beside it.

TRL is optional (the `bench` extra: pip install 'agentrl-cli[bench]'); without it the script says
so and exits 0 with the TRL figures skipped.

    python benchmarks/peer_trl.py [--json] [--rounds 2] [--steps 10] [--multi-steps 4]
                                  [--scenarios single,multi,sandboxed,tools_no_env]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import default_model, figure, parser, report  # noqa: E402

T0 = time.perf_counter()
TOKEN_TOLERANCE = 0.05
AGENTRL_ONLY = ("sandboxed", "tools_no_env")
SCENARIO_NAMES = ("single", "multi", "sandboxed", "tools_no_env")
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
    "trajectories: agentrl writes every episode to its trajectory store (Parquet); TRL keeps none",
    "threads: agentrl splits the cores between its trainer and its embedded server (training.cpu_threads and "
    "inference.cpu_threads, auto: one each on 2 cores); TRL runs in one process with torch's default thread count",
    "multi-turn: TRL calls tools one sample at a time (1.16 runs synchronous tools in turn and awaits async ones per "
    "sample); agentrl runs the environment steps of many episodes at once in its harness threads",
    "multi-turn stop: both end an episode at the first turn without a parsed run_shell call or at 4 turns; TRL parses "
    "calls with its Qwen response template, agentrl with harnesses.parsing (both the Hermes <tool_call> JSON block)",
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


def run_worker(system: str, scenario: str, steps: int, model: Path, workdir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peer_workers.py"), system, scenario, str(steps), str(model),
           str(workdir), *extra]
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
    say(f"{system:7} {scenario:9} {s['samples_per_s']:.2f} samples/s ({s['samples']} samples, "
        f"{s['sequence_tokens']:.1f} tokens/sample, {s['model_tokens']:.1f} model tokens/sample; load {out['load']})")
    return out


def rounds(args, model: Path, scenarios: list[str], with_trl: bool) -> dict[tuple[str, str], list[dict]]:
    results: dict[tuple[str, str], list[dict]] = {}
    work = Path(tempfile.mkdtemp(prefix="agentrl-peer-"))
    for r in range(args.rounds):
        for scenario in scenarios:
            systems = ["agentrl"] + (["trl"] if with_trl and scenario not in AGENTRL_ONLY else [])
            if r % 2:
                systems.reverse()
            steps = args.multi_steps if scenario == "multi" else args.steps
            for system in systems:
                say(f"round {r + 1}/{args.rounds}: {system} {scenario} ({steps} steps)")
                extra = args.set if system == "agentrl" else ([f"threads={args.trl_threads}"] if args.trl_threads else [])
                results.setdefault((system, scenario), []).append(
                    run_worker(system, scenario, steps, model, work / f"{system}-{scenario}-{r}", extra))
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


def _ratios(ours: list[dict], theirs: list[dict]) -> list[float]:
    return [round(a["summary"]["samples_per_s"] / b["summary"]["samples_per_s"], 3) for a, b in zip(ours, theirs)]


def _same_work(ours: list[dict], theirs: list[dict], name: str) -> dict:
    """Samples trained and mean tokens per sample of both sides, each within TOKEN_TOLERANCE."""
    same = {}
    for key in ("samples", "sequence_tokens", "model_tokens"):
        a, b = _median(ours, key), _median(theirs, key)
        same[key] = {"agentrl": round(a, 2), name: round(b, 2), "diff": round(abs(a - b) / max(b, 1e-9), 4)}
    ok = all(v["diff"] <= TOKEN_TOLERANCE for v in same.values())
    return figure(same, "per run: samples trained, mean tokens per sample", f"each within {TOKEN_TOLERANCE:.0%}", ok)


def figures(results: dict, scenarios: list[str], with_trl: bool, args) -> dict:
    figs: dict[str, dict] = {}
    for scenario in scenarios:
        ours = results[("agentrl", scenario)]
        figs[f"{scenario}_agentrl_samples_per_s"] = figure(_median(ours, "samples_per_s"), f"samples/s (median of {len(ours)})")
        figs[f"{scenario}_agentrl_breakdown"] = figure(breakdown(ours), "s per step (median of runs' means)")
        if scenario in AGENTRL_ONLY or not with_trl:
            continue
        theirs = results[("trl", scenario)]
        figs[f"{scenario}_trl_samples_per_s"] = figure(_median(theirs, "samples_per_s"), f"samples/s (median of {len(theirs)})")
        ratios = [a["summary"]["samples_per_s"] / b["summary"]["samples_per_s"] for a, b in zip(ours, theirs)]
        target = 1.0 if scenario == "single" else 3.0
        ratio = statistics.median(ratios)
        figs[f"{scenario}_vs_trl"] = figure(ratio, f"x samples/s (median of per-round ratios {[round(x, 2) for x in ratios]})",
                                            f">= {target:g}", ratio >= target)
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


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each runs every system once per scenario)")
    p.add_argument("--steps", type=int, default=10, help="training steps per run (single-turn scenarios)")
    p.add_argument("--multi-steps", type=int, default=4, help="training steps per run of the multi-turn scenario "
                   "(TRL calls 300 ms tools one at a time: about 20 s per step)")
    p.add_argument("--scenarios", default=",".join(SCENARIO_NAMES), help="comma-separated: " + ", ".join(SCENARIO_NAMES))
    p.add_argument("--model", default="", help="model directory (default: the built-in tiny model when cached)")
    p.add_argument("--set", action="append", default=[], help="extra agentrl config override KEY=VALUE (repeatable)")
    p.add_argument("--trl-threads", type=int, default=0,
                   help="torch threads for TRL (default 0: torch's own default, as a TRL user runs it); "
                        "1 gives TRL the thread count agentrl's trainer takes on 2 cores")
    args = p.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIO_NAMES)
    if unknown:
        print(f"unknown scenario(s) {sorted(unknown)}; choose from {', '.join(SCENARIO_NAMES)}", file=sys.stderr)
        return 2
    missing = trl_available()
    if missing:
        print(f"skipping the TRL side: {missing}", file=sys.stderr)
    model = Path(args.model) if args.model else default_model()
    say(f"model {model}; load {load()}")
    for line in DIFFERENCES:
        say("difference: " + line)
    results = rounds(args, model, scenarios, missing is None)
    figs = figures(results, scenarios, missing is None, args)
    if missing:
        figs["trl"] = figure("skipped", missing)
    figs["differences"] = figure(DIFFERENCES, "what differs in the work and could not be removed")
    return report(figs, args.json)


if __name__ == "__main__":
    sys.exit(main())
