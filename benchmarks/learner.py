"""Learner benchmark: the off-policy corrections (`training.correction`, learner/corrections.py)
against `none`, side by side in one run, on the same short asynchronous training run.

Every run: the built-in model, the stage 8 short recipe (groups of 8, 32 trajectories per step,
learning rate 3e-4, KL 0.1 to the warm start, the curriculum) with `rollout.mode: async`,
`rollout.max_staleness: 3` and a weight sync every step (so a version is a step), on terminal_like
with a seeded delay on a quarter of the training tasks (`delayed_harness.py`: 2 s per environment
step, the same tasks in every arm of a seed), so those groups reach the trainer late and train
under newer weights than sampled them. Each arm runs once per seed (`rollout.seed`,
`training.seed` and the delay's seed), each run a training run in its own process for a fixed
number of steps, with a greedy evaluation of 12 eval-split tasks of every terminal_like family
(48 tasks) before the first step and after the last. The figures are read from each run's
metrics.jsonl.

Per arm (mean over seeds; the per-seed values in the unit): final eval success; `mismatch_kl` (k3
KL between the server's log-probs and the trainer's at the start of each step, over the trained
tokens: how far off-policy the trained samples were), mean policy lag (versions), clip fraction,
training reward over the last half of the steps, train-step seconds, episodes dropped as stale, and
for the corrected arms the importance-weight diagnostics (ESS, max and p99 of rho, rejected
fraction). Per corrected arm, the paired difference against `none` (same seed) of eval success,
mismatch_kl and late reward, with its spread (sample SD over seeds).

Judged: every run trained all its steps with finite losses and was evaluated before and after
(`runs_complete`), and every run was off-policy (mean policy lag >= 1 version: otherwise nothing
was there to correct, `off_policy`). The arm comparison is reported, not judged: with 3 seeds and
48 eval tasks a difference of a few points is within noise, and the spread says so. An async run is
not deterministic (which groups finish first, hence their lag, follows the machine's timing), so a
rerun of one arm and seed differs too: on this machine two `none` runs of a seed differed by one
eval task and up to 0.06 in late training reward.

`recommended_correction` applies the rule for `training.correction`'s default (`recommend`): a
correction replaces `none` only when, averaged over the paired seeds, its final eval success is not
lower and its mismatch_kl is not higher than `none`'s; among those, the highest eval success.

The credit arms (`--arms episode,turn`, `training.advantage`) run instead on the middle-turn task
(`middle_turn_harness.py`: three turns, good and bad episodes differ only in the middle one, which
carries a step reward): synchronous rollout, no delay, otherwise the same recipe without the
curriculum, each arm once per seed with the same seeds, a greedy evaluation of its eval tasks before
the first step and after the last. Per arm: final eval success, the late share of sampled training
episodes that succeeded (`success_late`: less prone than greedy evaluation to saturate), late
training reward, and in the
`turn` arm the per-turn metrics (`rollout/turn_advantage_spread`, `rollout/step_advantage_share`);
`turn_minus_episode_*`: the paired differences by seed with their SD. Reported, not judged, beyond
`runs_complete`.

Progress goes to stderr; each run's log and directory, and results.json (every run's figures), are in
the work directory (printed).

    python benchmarks/learner.py [--json] [--steps 16] [--seeds 1,2,3] [--arms none,tis]
                                 [--eval-per-family 12] [--delay-s 2.0] [--delayed-fraction 0.25]
    python benchmarks/learner.py --arms episode,turn [--json] [--steps 12] [--seeds 1,2,3,4,5] [--min-chars 140]
    python benchmarks/learner.py --arms sync,async [--json] [--steps 16] [--seeds 1,2,3]

The speed arms (`--arms sync,async`, issue: learning is not traded for speed) run the recipe on plain
terminal_like with generation and training in lock-step (`sync`) against overlapped at a staleness of one
version with `training.correction: tis` (`async`), each once per seed; per arm the final eval success, late
reward, policy lag and the steps' wall seconds, `async_minus_sync_*` paired by seed, and `async_no_worse`:
async's mean eval difference not below minus its seed SD (reported: the SmolLM2 recipe keeps `sync` unless it holds).
"""

from __future__ import annotations

import json
import math
import socket
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
HARNESS = "benchmarks.delayed_harness:DelayedTerminalLike"
MAX_STALENESS = 3
MIN_LAG = 1.0  # versions: a run whose samples lag less than this had little to correct
# the stage 8 short recipe (config/models.py SHORT_RECIPE) with asynchronous rollout
RECIPE = {"rollout.mode": "async", "rollout.max_staleness": MAX_STALENESS, "rollout.weight_sync_interval_steps": 1,
          "rollout.group_size": 8, "rollout.curriculum": True, "training.micro_batch_size": 8,
          "training.gradient_accumulation_steps": 4, "training.learning_rate": 3e-4, "training.kl_coef": 0.1,
          "rollout.eval_concurrency": 0}
CREDIT_ARMS = ("episode", "turn")  # training.advantage values: the arms run on the middle-turn task
CREDIT_HARNESS = "benchmarks.middle_turn_harness:MiddleTurn"
CREDIT_RECIPE = {"rollout.mode": "sync", "rollout.weight_sync_interval_steps": 1, "rollout.group_size": 8,
                 "training.micro_batch_size": 8, "training.gradient_accumulation_steps": 2, "training.learning_rate": 3e-4,
                 "training.kl_coef": 0.1, "rollout.eval_concurrency": 0, "rollout.max_steps_per_trajectory": 3,
                 "inference.max_new_tokens": 48}
CREDIT_KEYS = ("rollout/turn_advantage_spread", "rollout/step_advantage_share")
# the speed arms (`--arms sync,async`): the recipe on plain terminal_like (no delay), generation and training
# in lock-step against overlapped at a staleness of one version with the truncated importance-weight correction
SPEED_ARMS = {"sync": {"rollout.mode": "sync", "training.correction": "none"},
              "async": {"rollout.mode": "async", "rollout.max_staleness": 1, "training.correction": "tis"}}
IS_KEYS = ("is_ess", "is_weight_mean", "is_weight_p99", "is_weight_max", "is_rejected_fraction")


def say(msg: str) -> None:
    print(f"[learner bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def run_sets(arm: str, seed: int, workdir: Path, port: int, delay_s: float, fraction: float) -> list[str]:
    """The config overrides of one run: the recipe, the arm's correction, the seed, the delayed harness."""
    harness = {"name": HARNESS, "options": {"delay_s": delay_s, "delayed_fraction": fraction, "delay_seed": seed}}
    return [*(f"{k}={json.dumps(v)}" for k, v in RECIPE.items()), f"training.correction={arm}",
            f"rollout.seed={seed}", f"training.seed={seed}", f"inference.port={port}",
            "training.checkpoint_interval_steps=100000", f"data.root={workdir / 'store'}", "harnesses=" + json.dumps([harness])]


def credit_sets(arm: str, seed: int, workdir: Path, port: int, min_chars: int) -> list[str]:
    """The config overrides of one credit run: the middle-turn recipe, the arm's training.advantage, the seed."""
    harness = {"name": CREDIT_HARNESS, "options": {"min_chars": min_chars}}
    return [*(f"{k}={json.dumps(v)}" for k, v in CREDIT_RECIPE.items()), f"training.advantage={arm}",
            f"rollout.seed={seed}", f"training.seed={seed}", f"inference.port={port}",
            "training.checkpoint_interval_steps=100000", f"data.root={workdir / 'store'}", "harnesses=" + json.dumps([harness])]


def speed_sets(arm: str, seed: int, workdir: Path, port: int) -> list[str]:
    """The config overrides of one speed run: the recipe on terminal_like with the arm's rollout mode."""
    sets = {**RECIPE, **SPEED_ARMS[arm]}
    return [*(f"{k}={json.dumps(v)}" for k, v in sets.items()), f"rollout.seed={seed}", f"training.seed={seed}",
            f"inference.port={port}", "training.checkpoint_interval_steps=100000", f"data.root={workdir / 'store'}",
            'harnesses=[{"name": "terminal_like"}]']


def eval_tasks(cfg, per_family: int) -> dict:
    """`per_family` eval-split tasks of every task family, spread evenly over the family."""
    from harnesses.task_sources import task_set

    h = cfg.harnesses[0]
    by_family: dict[str, list] = {}
    for t in task_set(h, cfg.data).select("eval"):
        by_family.setdefault(t.meta.get("family", ""), []).append(t)
    return {h.name: [t for ts in by_family.values() for t in ts[::max(1, len(ts) // per_family)][:per_family]]}


def worker(spec: dict) -> int:
    """One training run (in its own process): `spec` as `run_arm` writes it."""
    import asyncio

    from agentrl_cli.config import load_config
    from agentrl_cli.run.training_run import train

    workdir = Path(spec["workdir"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sets = (credit_sets(spec["arm"], spec["seed"], workdir, port, spec["min_chars"]) if spec["arm"] in CREDIT_ARMS
            else speed_sets(spec["arm"], spec["seed"], workdir, port) if spec["arm"] in SPEED_ARMS
            else run_sets(spec["arm"], spec["seed"], workdir, port, spec["delay_s"], spec["fraction"]))
    cfg = load_config(None, sets, env={}).config
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)
    asyncio.run(train(cfg, workdir / "run", Path(spec["model"]), spec["steps"], run_id=f"learner-{spec['arm']}-{spec['seed']}",
                      progress=progress, eval_tasks=eval_tasks(cfg, spec["per_family"]),
                      on_step=lambda row: progress(f"step {row['step']}: mismatch_kl {row.get('train/mismatch_kl')}, "
                                                   f"policy lag {row.get('train/policy_lag')}")))
    return 0


def run_arm(arm: str, seed: int, args, model: Path, work: Path) -> dict:
    workdir = work / f"{arm}-seed{seed}"
    workdir.mkdir(parents=True)
    spec = {"arm": arm, "seed": seed, "steps": args.steps, "workdir": str(workdir), "model": str(model),
            "per_family": args.eval_per_family, "delay_s": args.delay_s, "fraction": args.delayed_fraction,
            "min_chars": args.min_chars}
    log = workdir / "run.log"
    t = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT,
                              cwd=ROOT, timeout=3600)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed (exit {proc.returncode}); its log {log}:\n{log.read_text()[-3000:]}")
    rows = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    run = summarize(rows, args.steps)
    run["wall_s"] = wall
    say(f"{arm} seed {seed}: eval {run['eval_start']} -> {run['eval_final']}, mismatch_kl {_fmt(run['mismatch_kl'])}, "
        f"policy lag {_fmt(run['policy_lag'])}, late reward {_fmt(run['reward_late'])}, {wall:.0f} s ({log})")
    return run


def _mean(values) -> float | None:
    values = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.fmean(values) if values else None


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _sig(value: float | None) -> float | None:
    """4 significant digits, for per-seed lists in a figure's unit."""
    return None if value is None else float(f"{value:.4g}")


def _milli(value: float | None) -> float | None:
    """KL figures are ~1e-5..1e-2 nats: reported in thousandths so the table's 4 decimals keep them."""
    return None if value is None else value * 1e3


def summarize(rows: list[dict], steps: int) -> dict:
    """One run's figures from its metrics.jsonl rows: evaluation rows carry `eval/<harness>/success_rate`,
    step rows `train/*`."""
    from agentrl_cli.runtime.observe import keys

    evals = [(r[keys.STEP], v) for r in rows for k, v in r.items() if keys.eval_harness(k) is not None]
    train = [r for r in rows if keys.TRAIN_LOSS in r]
    late = train[len(train) // 2:]
    losses = [r[keys.TRAIN_LOSS] for r in train]
    out = {"steps": len(train), "finite_losses": all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses),
           "eval_start": next((v for s, v in evals if s == 0), None),
           "eval_final": next((v for s, v in reversed(evals) if s == steps), None),
           "mismatch_kl": _mean(r.get(keys.TRAIN_MISMATCH_KL) for r in train),
           "policy_lag": _mean(r.get(keys.TRAIN_POLICY_LAG) for r in train),
           "clip_fraction": _mean(r.get("train/clip_fraction") for r in train),
           "reward_late": _mean(r.get(keys.REWARD_MEAN) for r in late),
           "success_late": _mean(r.get(keys.REWARD_SUCCESS_RATE) for r in late),
           "train_s": _mean(r.get(keys.TIME_TRAIN_S) for r in train),
           "dropped_stale": train[-1].get(keys.ROLLOUT_DROPPED_STALE) if train else None,
           "steps_wall_s": train[-1].get(keys.ELAPSED_S) if train else None}
    for name in CREDIT_KEYS:
        out[name] = _mean(r.get(name) for r in train)
    for name in IS_KEYS:
        values = [r.get(f"train/{name}") for r in train]
        out[name] = max((v for v in values if v is not None), default=None) if name == "is_weight_max" else _mean(values)
    return out


def paired(runs: list[dict], base: list[dict], key: str) -> list[float] | None:
    """Per seed, this arm's figure minus `none`'s (runs in seed order); None when one is missing."""
    diffs = [a[key] - b[key] if a[key] is not None and b[key] is not None else None for a, b in zip(runs, base)]
    return None if not diffs or None in diffs else diffs


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def recommend(results: dict[str, list[dict]]) -> tuple[str, str]:
    """(the default for training.correction, why): a correction replaces `none` only when, over the paired
    seeds, its mean final eval success is not lower and its mean mismatch_kl not higher than none's;
    among those, the highest eval success."""
    base = results.get("none")
    if base is None:
        return "none", "no `none` arm measured: nothing to compare with, the default stays"
    qualified, reasons = [], []
    for arm, runs in results.items():
        if arm == "none":
            continue
        d_eval, d_kl = paired(runs, base, "eval_final"), paired(runs, base, "mismatch_kl")
        if d_eval is None or d_kl is None:
            reasons.append(f"{arm}: a figure is missing")
            continue
        me, mk = statistics.fmean(d_eval), statistics.fmean(d_kl)
        ok = me >= 0 and mk <= 0
        sd = spread(d_eval)
        noise = "one seed, no spread" if math.isnan(sd) else f"{'within' if abs(me) <= sd else 'beyond'} its seed SD {sd:.3f}"
        reasons.append(f"{arm}: eval success {me:+.3f} ({noise}), "
                       f"mismatch_kl {mk:+.2e} against none: {'qualifies' if ok else 'does not qualify'}")
        if ok:
            qualified.append((statistics.fmean(r["eval_final"] for r in runs), arm))
    choice = max(qualified)[1] if qualified else "none"
    return choice, "; ".join(reasons) or "no correction arm measured"


def _per_seed(runs: list[dict], key: str) -> list:
    """One figure of each run (seed order), rounded for a unit's text."""
    return [None if r[key] is None else round(r[key], 4) for r in runs]


def _paired_figures(runs: list[dict], base: list[dict], label: str, keys) -> dict:
    """`<label>_<name>` per (key, name): `runs` minus `base` paired by seed, mean, with the per-seed values and SD."""
    figs = {}
    for key, name in keys:
        diffs = paired(runs, base, key)
        figs[f"{label.replace(' - ', '_minus_')}_{name}"] = (
            figure("n/a", "a run lacks the figure") if diffs is None else
            figure(statistics.fmean(diffs), f"{label}, paired by seed, mean (per seed {[_sig(d) for d in diffs]}, "
                   f"SD {_fmt(spread(diffs))})"))
    return figs


def runs_complete(every: list[dict], steps: int) -> dict:
    """Judged: every run trained `steps` steps with finite losses and was evaluated before and after."""
    complete = [r["steps"] == steps and r["finite_losses"] and r["eval_start"] is not None and r["eval_final"] is not None
                for r in every]
    return figure(sum(complete), f"of {len(every)} runs trained {steps} steps with finite losses and were "
                  "evaluated before and after", f"all {len(every)}", all(complete))


def credit_figures(results: dict[str, list[dict]], seeds: list[int], steps: int) -> dict:
    """The credit arms' figures: per arm eval success and late reward (and the turn metrics), and turn - episode paired by seed."""
    figs: dict[str, dict] = {}
    every = [r for runs in results.values() for r in runs]
    figs["runs_complete"] = runs_complete(every, steps)
    for arm, runs in results.items():
        n = f"mean of {len(runs)} seeds {seeds}"
        figs[f"{arm}_eval_success"] = figure(_mean(r["eval_final"] for r in runs),
                                             f"greedy success (middle turn good) at step {steps}, {n} (per seed "
                                             f"{_per_seed(runs, 'eval_final')}; at step 0 {_per_seed(runs, 'eval_start')})")
        figs[f"{arm}_reward_late"] = figure(_mean(r["reward_late"] for r in runs),
                                            f"mean training reward over the last half of the steps, {n} (per seed "
                                            f"{_per_seed(runs, 'reward_late')})")
        figs[f"{arm}_success_late"] = figure(_mean(r["success_late"] for r in runs),
                                             f"share of sampled training episodes that succeeded (middle turn good) over the "
                                             f"last half of the steps, {n} (per seed {_per_seed(runs, 'success_late')})")
        if arm == "turn":
            for key in CREDIT_KEYS:
                figs[f"turn_{key.split('/')[1]}"] = figure(_mean(r[key] for r in runs), f"{key}, mean over steps, {n} "
                                                           f"(per seed {_per_seed(runs, key)})")
    if "turn" in results and "episode" in results:
        figs.update(_paired_figures(results["turn"], results["episode"], "turn - episode",
                                    (("eval_final", "eval_success"), ("success_late", "success_late"),
                                     ("reward_late", "reward_late"))))
    figs["run_wall_s"] = figure(_mean(r["wall_s"] for r in every), "s per training run (start-up, 2 evaluations, the steps)")
    figs["benchmark_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figs


def speed_figures(results: dict[str, list[dict]], seeds: list[int], steps: int) -> dict:
    """The speed arms' figures: per arm eval success, late reward, policy lag and seconds; async - sync paired by
    seed, and whether async may be the default: its mean eval success difference not below minus its seed SD."""
    figs: dict[str, dict] = {"runs_complete": runs_complete([r for runs in results.values() for r in runs], steps)}
    for arm, runs in results.items():
        n = f"mean of {len(runs)} seeds {seeds}"
        figs[f"{arm}_eval_success"] = figure(_mean(r["eval_final"] for r in runs),
                                             f"greedy success at step {steps}, {n} (per seed {_per_seed(runs, 'eval_final')}; "
                                             f"at step 0 {_per_seed(runs, 'eval_start')})")
        figs[f"{arm}_reward_late"] = figure(_mean(r["reward_late"] for r in runs), f"mean training reward over the last "
                                            f"half of the steps, {n} (per seed {_per_seed(runs, 'reward_late')})")
        figs[f"{arm}_policy_lag"] = figure(_mean(r["policy_lag"] for r in runs), f"versions, {n}")
        figs[f"{arm}_steps_wall_s"] = figure(_mean(r["steps_wall_s"] for r in runs), f"s from the run's start (its first "
                                             f"evaluation included) to the last step's end, {n} (per seed {_per_seed(runs, 'steps_wall_s')})")
    if "sync" in results and "async" in results:
        figs.update(_paired_figures(results["async"], results["sync"], "async - sync",
                                    (("eval_final", "eval_success"), ("reward_late", "reward_late"),
                                     ("steps_wall_s", "steps_wall_s"))))
        diffs = paired(results["async"], results["sync"], "eval_final")
        if diffs is not None:
            mean, sd = statistics.fmean(diffs), spread(diffs)
            ok = mean >= 0 or (not math.isnan(sd) and mean >= -sd)
            noise = "one seed, no spread" if math.isnan(sd) else f"seed SD {sd:.3f}"
            figs["async_no_worse"] = figure(ok, f"async's eval success is {mean:+.3f} against sync's ({noise}): "
                                            + ("no worse beyond noise" if ok else "worse beyond noise"))
    figs["run_wall_s"] = figure(_mean(r["wall_s"] for r in results[next(iter(results))]), "s per training run")
    figs["benchmark_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figs


def figures(results: dict[str, list[dict]], seeds: list[int], steps: int) -> dict:
    figs: dict[str, dict] = {}
    every = [r for runs in results.values() for r in runs]
    figs["runs_complete"] = runs_complete(every, steps)
    lags = [r["policy_lag"] for r in every]
    figs["off_policy"] = figure(min((x for x in lags if x is not None), default=float("nan")),
                                f"versions, the smallest run's mean policy lag (max_staleness {MAX_STALENESS})",
                                f">= {MIN_LAG:g} in every run", all(x is not None and x >= MIN_LAG for x in lags))
    for arm, runs in results.items():
        n = f"mean of {len(runs)} seeds {seeds}"
        figs[f"{arm}_eval_success"] = figure(_mean(r["eval_final"] for r in runs),
                                             f"greedy success at step {steps}, {n} (per seed {_per_seed(runs, 'eval_final')}; "
                                             f"at step 0 {_per_seed(runs, 'eval_start')})")
        figs[f"{arm}_mismatch_kl"] = figure(_milli(_mean(r["mismatch_kl"] for r in runs)),
                                            f"x 1e-3: k3 KL(server || trainer) per trained token, mean over steps, {n} "
                                            f"(per seed {[_sig(r['mismatch_kl']) for r in runs]})")
        figs[f"{arm}_policy_lag"] = figure(_mean(r["policy_lag"] for r in runs), f"versions, {n} (per seed {_per_seed(runs, 'policy_lag')})")
        figs[f"{arm}_clip_fraction"] = figure(_mean(r["clip_fraction"] for r in runs), f"tokens clipped, {n}")
        figs[f"{arm}_reward_late"] = figure(_mean(r["reward_late"] for r in runs),
                                            f"mean training reward over the last half of the steps, {n} (per seed "
                                            f"{_per_seed(runs, 'reward_late')})")
        figs[f"{arm}_train_s_per_step"] = figure(_mean(r["train_s"] for r in runs), f"s, {n}")
        figs[f"{arm}_dropped_stale"] = figure(_mean(r["dropped_stale"] for r in runs), f"episodes dropped as stale per run, {n}")
        if arm != "none":
            figs[f"{arm}_is_weights"] = figure({k: None if _mean(r[k] for r in runs) is None else round(_mean(r[k] for r in runs), 4)
                                                for k in IS_KEYS}, f"rho = pi_old/pi_rollout diagnostics, {n} (is_weight_max: "
                                                "mean of each run's largest)")
    base = results.get("none")
    for arm, runs in results.items():
        if arm == "none" or base is None:
            continue
        for key, name in (("eval_final", "eval_success"), ("mismatch_kl", "mismatch_kl"), ("reward_late", "reward_late")):
            diffs = paired(runs, base, key)
            if diffs is None:
                figs[f"{arm}_minus_none_{name}"] = figure("n/a", "a run lacks the figure")
                continue
            scale, unit = (1e3, "x 1e-3: ") if key == "mismatch_kl" else (1.0, "")
            figs[f"{arm}_minus_none_{name}"] = figure(statistics.fmean(diffs) * scale, f"{unit}{arm} - none, paired by seed, "
                                                      f"mean (per seed {[_sig(d * scale) for d in diffs]}, "
                                                      f"SD {_fmt(spread(diffs) * scale)})")
    choice, why = recommend(results)
    figs["recommended_correction"] = figure(choice, why)
    figs["run_wall_s"] = figure(_mean(r["wall_s"] for r in every), "s per training run (start-up, 2 evaluations, the steps)")
    figs["benchmark_wall_s"] = figure(time.perf_counter() - T0, "s")
    return figs


def main() -> int:
    from agentrl_cli.learner.corrections import MODES

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="trainer steps per run")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds; every arm runs once per seed")
    p.add_argument("--arms", default="none,tis", help=f"comma-separated training.correction values ({', '.join(MODES)})")
    p.add_argument("--eval-per-family", type=int, default=12, help="eval-split tasks of every terminal_like family")
    p.add_argument("--delay-s", type=float, default=2.0, help="seconds slept in every step of a delayed episode")
    p.add_argument("--delayed-fraction", type=float, default=0.25, help="share of the training tasks delayed")
    p.add_argument("--min-chars", type=int, default=140, help="credit arms: the middle turn is good from this many characters")
    p.add_argument("--model", default="", help="model directory (default: the built-in model when cached)")
    p.add_argument("--worker", help=__import__("argparse").SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        print(f"--seeds takes comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    arms = list(dict.fromkeys(a for a in args.arms.split(",") if a))
    credit = bool(arms) and all(a in CREDIT_ARMS for a in arms)
    speed = bool(arms) and all(a in SPEED_ARMS for a in arms)
    unknown = [a for a in arms if a not in (CREDIT_ARMS if credit else SPEED_ARMS if speed else MODES)]
    problem = (f"unknown arm(s) {unknown}: --arms takes training.correction values ({', '.join(MODES)}), or the "
               f"training.advantage values {', '.join(CREDIT_ARMS)}, or the rollout modes {', '.join(SPEED_ARMS)} "
               "(one kind at a time)" if unknown
               else "--arms is empty: give at least one training.correction value" if not arms
               else "--seeds is empty: give at least one integer" if not seeds
               else f"--steps must be at least 1, got {args.steps}" if args.steps < 1
               else f"--eval-per-family must be at least 1, got {args.eval_per_family}" if args.eval_per_family < 1 else "")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else default_model()
    work = Path(tempfile.mkdtemp(prefix="agentrl-learner-"))
    say(f"model {model}; {len(arms)} arms x {len(seeds)} seeds x {args.steps} steps; work directory {work}")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in seeds:  # seed-major: each seed's arms run back to back, under the same machine load
        for arm in arms:
            say(f"{arm} seed {seed}")
            results[arm].append(run_arm(arm, seed, args, model, work))
            (work / "results.json").write_text(json.dumps(results, indent=1))  # every run's figures so far
    table = credit_figures if credit else speed_figures if speed else figures
    return report(table(results, seeds, args.steps), args.json)


if __name__ == "__main__":
    sys.exit(main())
