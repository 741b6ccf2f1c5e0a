"""Verify layer 3, performance against the stage-0 baseline.

The stage-0 loop (its small, fixed shape) is measured again now (`verify/probe.json`) and compared
with `baseline.json` figure by figure: tokens/s, samples/min, inference busy fraction, sampling
queue length, the time shares of sampling / training / weight sync, environment step latency and
failure rate. Each figure worse than the baseline by more than `verify.baseline_max_drift`
(relative) is its own failing check naming the segment and the direction; a figure that moved the
good way (more throughput, a shorter queue, a smaller share of one segment) passes and says so, and
a share that fell shows up as another share that rose. The training run's own figures are shown as `info`: its
shape (group size, batch, concurrency) differs from the baseline's, so they are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl_cli.runtime.observe import keys
from agentrl_cli.core.report import Check
from agentrl_cli.acceptance.verify.judge import relative_drift


@dataclass(frozen=True)
class Figure:
    name: str
    path: tuple[str, ...]  # where it sits in baseline.json
    floor: float  # relative drift is taken against max(baseline, floor)
    up: str  # what a rise means
    down: str  # what a fall means
    worse: int  # +1: a rise is a regression; -1: a fall is
    fmt: str = "{:.3g}"


FIGURES = (
    Figure("tokens/s (generation throughput)", ("tokens_per_s",), 1.0,
           "generation is faster than at the baseline", "generation is the bottleneck: fewer tokens per second", -1),
    Figure("samples/min", ("samples_per_min",), 0.1,
           "more trajectories per minute", "fewer trajectories per minute: sampling or training slowed down", -1),
    Figure("inference busy fraction", ("server_busy_fraction",), 0.05,
           "the inference server is busier", "the inference server idles: the rollout does not feed it", -1),
    Figure("sampling queue length", ("inference_queue_len_mean",), 1.0,
           "requests queue at the inference server: generation is the bottleneck", "shorter queue", +1),
    Figure("sampling share", ("time_shares", "sampling"), 0.05,
           "sampling (generation and environment) is the bottleneck", "sampling takes a smaller share", +1),
    Figure("training share", ("time_shares", "training"), 0.05,
           "the trainer is the bottleneck", "training takes a smaller share", +1),
    Figure("weight-sync share", ("time_shares", "sync"), 0.05,
           "weight sync is the bottleneck", "weight sync takes a smaller share", +1),
    Figure("environment step latency", ("env_step_latency_s",), 0.001,
           "environment steps are slower: the environment is the bottleneck", "environment steps are faster", +1, "{:.4g} s"),
    Figure("environment failure rate", ("env_failure_rate",), 0.1,
           "more episodes end in environment errors or timeouts", "fewer environment failures", +1),
)
HINT = ("attribute the deviation before adding hardware: `agentrl troubleshoot --run RUN` ranks the causes; "
        "the baseline is `agentrl stage run 0` on the same machine")


def get(d: dict | None, path: tuple[str, ...]):
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d if isinstance(d, (int, float)) else None


def compare(probe: dict, baseline: dict, max_drift: float) -> list[Check]:
    out = []
    for f in FIGURES:
        now, base = get(probe, f.path), get(baseline, f.path)
        name = f"{f.name} vs baseline"
        if base is None and now is None:  # never measured here: the servers do not expose it
            out.append(Check.skipped(name, f"neither the baseline nor this measurement has {f.name}: the inference "
                                           "servers do not report it (vLLM's report no time spent in batches)"))
            continue
        if base is None or now is None:
            missing = "the baseline" if base is None else "this measurement"
            out.append(Check.skipped(name, f"{missing} has no {f.name} (an older stage 0 wrote it): rerun `agentrl stage run 0`"))
            continue
        drift = relative_drift(now, base, f.floor)
        ok = drift * f.worse <= max_drift
        direction = f.up if drift > 0 else f.down
        detail = f"{f.name} {f.fmt.format(now)} vs baseline {f.fmt.format(base)} ({drift:+.0%})"
        if not ok:
            detail += f": {direction}"
        elif abs(drift) > max_drift:  # better than the baseline by a wide margin
            detail += f": {direction}; a baseline this far behind catches fewer regressions, rerun `agentrl stage run 0`"
        worse = "below" if f.worse < 0 else "above"
        out.append(Check.judge(name, ok, {"now": round(now, 4), "baseline": round(base, 4), "drift": round(drift, 3)},
                               f"at most {max_drift:.0%} {worse} the baseline", f"{detail}. {HINT}", detail=detail))
    return out


def run_figures(rec) -> list[Check]:
    """The training run's own throughput and time shares, reported for reading, not judged."""
    rows = rec.rows
    if not rows:
        return []
    sampling = sum(r.get(keys.TIME_SAMPLING_WAIT_S) or 0 for r in rows)
    training = sum(r.get(keys.TIME_TRAIN_S) or 0 for r in rows)
    sync = sum(r.get(keys.TIME_SYNC_S) or 0 for r in rows)
    total = sampling + training + sync or 1.0
    elapsed = rows[-1].get("elapsed_s") or 0
    tokens = rows[-1].get(keys.ROLLOUT_TOKENS_GENERATED) or 0
    samples = sum(r.get(keys.TRAIN_SAMPLES) or 0 for r in rows)
    return [Check.info(f"training run ({rec.training_source}): throughput and time shares",
                       {"tokens_per_s": round(tokens / elapsed, 2) if elapsed else None,
                        "samples_per_min": round(samples / elapsed * 60, 2) if elapsed else None,
                        "shares": {"sampling": round(sampling / total, 3), "training": round(training / total, 3),
                                   "sync": round(sync / total, 3)}},
                       "its shape differs from the baseline loop's, so it is shown, not judged")]


def checks(ctx) -> list[Check]:
    rec, cfg = ctx.record, ctx.config
    if rec.baseline is None:
        return [Check.skipped("performance vs baseline", "no stage-0 baseline: run `agentrl stage run 0` on this machine first")] + run_figures(rec)
    if rec.probe is None:
        return [Check.skipped("performance vs baseline", "the baseline loop has not been measured beside this baseline yet "
                                      "(verify measured the baseline itself this time, or judged records only)")] + run_figures(rec)
    where = Check.info("baseline compared", {"baseline": str(rec.baseline_path), "probe": str(rec.run.path / "verify" / "probe.json")},
                       "the stage-0 loop measured again now, beside the recorded baseline")
    return [where] + compare(rec.probe, rec.baseline, cfg.verify.baseline_max_drift) + run_figures(rec)
