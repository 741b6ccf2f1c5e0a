"""Detectors: one function per kind named in the knowledge base's `detectors`, each looking at a
run's records for one known problem.

A detector gets the run's data and its thresholds from the knowledge base and returns None (not
seen) or a Hit: `strength` (1 at the threshold, more the further past it; a failing check that names
the component is 2) and the figures that triggered it, under the signal names of `signals.py`.
"""

from __future__ import annotations

import math
import re
import shutil
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from agentrl_cli.runtime.observe import keys
from agentrl_cli.acceptance.alerts import ALERTS
from agentrl_cli.acceptance.run_record import RunRecord
from agentrl_cli.core.outcomes import Outcome, RewardStatus
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.acceptance.verify.convergence import learning_progress
from agentrl_cli.acceptance.verify.judge import achievable_max_reward, entropy_trend, gap_widening, grad_norm_stable
from agentrl_cli.acceptance.verify.performance import get


@dataclass
class Hit:
    strength: float
    evidence: dict
    summary: str


@dataclass
class DiagnosedRun:
    """A run's records and the config it ran with, as every detector reads them."""

    record: RunRecord
    config: object  # PlatformConfig the run ran with

    @property
    def rows(self) -> list[dict]:
        return self.record.rows

    def trajectories(self) -> list:
        """Every stored trajectory of the run (empty when the store cannot be read)."""
        return self.record.trajectories(self.config.data)

    def training_trajectories(self) -> list:
        """The stored trajectories of the judged loop."""
        return self.record.training_trajectories(self.config.data)

    def episodes(self) -> int:
        return int(sum((r.get(keys.TRAIN_SAMPLES) or 0) + (r.get(keys.REWARD_MASKED) or 0) for r in self.rows))

    def shares(self) -> dict[str, float]:
        s = {phase: sum(r.get(key) or 0 for r in self.rows) for phase, key in keys.PHASE_TIMES.items()}
        total = sum(s.values()) or 1.0
        return {phase: seconds / total for phase, seconds in s.items()}


def _r(x, d: int = 4):
    return round(x, d) if isinstance(x, float) and math.isfinite(x) else x


def reward_masked(d: DiagnosedRun, t: dict) -> Hit | None:
    masked = sum(r.get(keys.REWARD_MASKED) or 0 for r in d.rows)
    unreachable = sum("reward_service_unreachable" in t_.flags for t_ in d.trajectories())
    episodes = d.episodes()
    frac = masked / episodes if episodes else 0.0
    if frac < t["min_fraction"]:
        return None
    return Hit(frac / t["min_fraction"], {"reward/masked": masked, "masked_fraction": _r(frac), "flag_reward_service_unreachable": unreachable},
               f"{masked} of {episodes} episodes were not scored (masked, infra_error); {unreachable} flagged reward_service_unreachable")


def failed_check(d: DiagnosedRun, t: dict) -> Hit | None:
    found = [(where, c) for where, c in _failed_checks(d) if t["match"] in c.get("name", "")]
    if not found:
        return None
    where, c = found[0]
    first = (c.get("detail") or "").splitlines()[0] if c.get("detail") else ""
    return Hit(2.0, {"failed_check": f"{where}: {c['name']}", "measured": c.get("measured"), "detail": first[:200]},
               f"{where} check failed: {c['name']} ({first[:160]})")


def reward_at_max(d: DiagnosedRun, t: dict) -> Hit | None:
    top = achievable_max_reward(d.config.reward.weights)
    rewards = [x.reward for x in d.training_trajectories() if x.reward_status != RewardStatus.INFRA_ERROR]
    source = "trajectories"
    if not rewards:
        rewards, source = d.record.column(keys.REWARD_MEAN), "step means"
    if not rewards or top <= 0:
        return None
    frac = sum(r >= 0.999 * top for r in rewards) / len(rewards)
    if frac < t["max_fraction"]:
        return None
    return Hit(1.5 * frac / t["max_fraction"], {"reward/max_fraction": _r(frac), "achievable_max": _r(top),
                                                "reward/mean": _r(statistics.fmean(rewards)), "from": f"{len(rewards)} {source}"},
               f"{frac:.0%} of {len(rewards)} {source} at the achievable maximum {top:g} (from reward.weights)")


def canary_positive(d: DiagnosedRun, t: dict) -> Hit | None:
    positive = [c for c in d.record.extra.get("canaries", []) if (c.get("outcome_score") or 0) > 0]
    if not positive:
        return None
    return Hit(2.0, {"canary/positive": len(positive), "first": positive[:3]},
               f"{len(positive)} canary task(s) with no correct answer scored positive: {positive[0]['task']}")


def _perf(d: DiagnosedRun):
    rec = d.record
    return (rec.probe, rec.baseline) if rec.probe and rec.baseline else (None, None)


def env_latency_vs_baseline(d: DiagnosedRun, t: dict) -> Hit | None:
    probe, base = _perf(d)
    now, then = get(probe, ("env_step_latency_s",)), get(base, ("env_step_latency_s",))
    if not now or not then or now / then < t["max_ratio"]:
        return None
    ratio = now / then
    return Hit(ratio / t["max_ratio"], {"perf/env_step_latency_s": {"now": _r(now), "baseline": _r(then), "ratio": _r(ratio, 2)},
                                        "perf/time_share_sampling": {"now": _r(get(probe, ("time_shares", "sampling"))),
                                                                     "baseline": _r(get(base, ("time_shares", "sampling")))}},
               f"environment step latency {now:.3g} s vs baseline {then:.3g} s ({ratio:.1f}x)")


def share_drift(d: DiagnosedRun, t: dict) -> Hit | None:
    probe, base = _perf(d)
    if probe is None:
        return None
    worst = None
    for seg in ("sampling", "training", "sync"):
        now, then = get(probe, ("time_shares", seg)), get(base, ("time_shares", seg))
        if now is None or then is None:
            continue
        drift = (now - then) / max(then, 0.05)
        if worst is None or drift > worst[1]:
            worst = (seg, drift, now, then)
    if worst is None or worst[1] <= t["max_drift"]:
        return None
    seg, drift, now, then = worst
    return Hit(drift / t["max_drift"], {f"perf/time_share_{seg}": {"now": _r(now), "baseline": _r(then)}},
               f"{seg} share {now:.2f} vs baseline {then:.2f}: {seg} is the bottleneck")


def sync_share(d: DiagnosedRun, t: dict) -> Hit | None:
    if not d.rows:
        return None
    share = d.shares()["sync"]
    if share < t["max_share"]:
        return None
    return Hit(share / t["max_share"], {"perf/time_share_sync": _r(share)}, f"weight sync takes {share:.0%} of each step")


def reward_flat(d: DiagnosedRun, t: dict) -> Hit | None:
    rewards = d.record.column(keys.REWARD_MEAN)
    if len(rewards) < t["min_steps"]:
        return None
    ok, name, measured, _ = learning_progress(d.record, [h.name for h in d.config.harnesses if not h.held_out])
    if ok:
        return None
    lrs = d.record.column(keys.TRAIN_LR)
    lr = statistics.median(lrs) if lrs else None
    strength = 1.0 + (0.5 if (measured.get("upper_95") or 0) <= 0.001 else 0.0) + (1.0 if lr is not None and lr <= 1e-9 else 0.0)
    trajs = d.training_trajectories()
    truncated = sum(t_.outcome == Outcome.TRUNCATED for t_ in trajs) / len(trajs) if trajs else None
    if "slope_per_step" in measured:
        summary = (f"reward slope {measured['slope_per_step']} per step (95% bounds {measured['lower_95']}..{measured['upper_95']}) "
                   f"over {len(rewards)} steps; learning rate {lr}")
        figures = {"reward/mean": measured}
    else:
        curve = " -> ".join(f"{e['success_rate']}" for e in measured["evaluations"])
        summary = (f"evaluation success {curve} (slope per 100 steps {measured['slope_per_100_steps']}, 95% lower bound "
                   f"{measured['lower_95']}); learning rate {lr}")
        figures = {"eval/<harness>/success_rate": measured}
    return Hit(strength, {**figures, "train/lr": lr, "train/kl_ref": _r(d.rows[-1].get(keys.TRAIN_KL_REF)),
                          "traj/truncated_fraction": _r(truncated)}, summary)


def held_out_drop(d: DiagnosedRun, t: dict) -> Hit | None:
    rates = d.record.eval_rates()
    held = [h.name for h in d.config.harnesses if h.held_out and h.name in rates]
    train = [h.name for h in d.config.harnesses if not h.held_out and h.name in rates]
    if not held or not train:
        return None
    pairs = [(rates[n][0][1], rates[n][-1][1]) for n in train]
    gaps = {n: gap_widening(pairs, (rates[n][0][1], rates[n][-1][1])) for n in held}
    held = [n for n in held if gaps[n]["measurable"]]  # never solved: nothing to say about transfer
    if not held:
        return None
    worst = max(held, key=lambda n: gaps[n]["drop"])
    g = gaps[worst]
    if g["drop"] <= t["max_drop"]:
        return None
    stored = [x for x in d.trajectories() if x.harness == worst and x.turns]
    invalid = sum(x.invalid_actions for x in stored) / sum(x.turns for x in stored) if stored else None
    return Hit(g["drop"] / t["max_drop"], {"eval/<harness>/success_rate": {n: [_r(v) for _, v in rates[n]] for n in train + held},
                                           "drop": g["drop"], "traj/invalid_action_rate": _r(invalid)},
               f"held-out {worst} {g['held_out_before']:.2f} -> {g['held_out_after']:.2f} vs training harnesses "
               f"{g['training_before']:.2f} -> {g['training_after']:.2f} (fell behind by {g['drop']:.2f})")


def server_idle_queue(d: DiagnosedRun, t: dict) -> Hit | None:
    figures = d.record.probe or d.record.baseline or {}
    busy, queue = get(figures, ("server_busy_fraction",)), get(figures, ("inference_queue_len_mean",))
    if busy is None or queue is None or busy >= t["max_busy"] or queue < t["min_queue"]:
        return None
    return Hit(t["max_busy"] / max(busy, 0.01) * 0.5 + queue / t["min_queue"] * 0.5,
               {"perf/server_busy_fraction": _r(busy), "perf/inference_queue_len": _r(queue)},
               f"requests queue ({queue:.1f} waiting on average) while the server is busy only {busy:.0%} of the time")


def long_tail_idle_trainer(d: DiagnosedRun, t: dict) -> Hit | None:
    turns = sorted(x.turns for x in d.training_trajectories())
    if len(turns) < 10 or not d.rows:
        return None
    med = max(statistics.median(turns), 1)
    p99 = turns[min(len(turns) - 1, int(0.99 * len(turns)))]
    share = d.shares()["sampling"]
    if p99 / med < t["min_tail_ratio"] or share < t["min_sampling_share"]:
        return None
    return Hit(0.5 * p99 / med / t["min_tail_ratio"] + 0.5 * share / t["min_sampling_share"],
               {"traj/turns_p99_over_median": _r(p99 / med, 2), "perf/time_share_sampling": _r(share)},
               f"p99 episode length {p99} turns vs median {med:g}; the trainer waits {share:.0%} of each step")


TOOL_KEY = re.compile(keys.ENV_TOOL_PATTERN)
CREATE_KEY = re.compile(keys.ENV_CREATE_FAILURES_PATTERN)


def _counts(row: dict, pattern: re.Pattern) -> Counter:
    return Counter({m.groups(): v for k, v in row.items() if (m := pattern.match(k)) and isinstance(v, (int, float))})


def tool_failures(d: DiagnosedRun, t: dict) -> Hit | None:
    """Tool calls by tool and status: from the run's rows (`env/<harness>/tool/<tool>/<status>`,
    cumulative), else from the stored trajectories."""
    if d.rows and _counts(d.rows[-1], TOOL_KEY):
        mid = d.rows[len(d.rows) // 2]
        last, half = _counts(d.rows[-1], TOOL_KEY), _counts(mid, TOOL_KEY)
        calls = [(("rows", 0 if n <= half.get(key, 0) else 1), key) for key, total in last.items() for n in range(1, int(total) + 1)]
        statuses = [(part, f"{key[1]}:{key[2]}", key[2]) for part, key in calls]
    else:
        traj = sorted(d.training_trajectories(), key=lambda x: x.started_at)
        statuses = [(("traj", i * 2 // max(1, len(traj))), f"{c.name}:{c.status}", c.status)
                    for i, x in enumerate(traj) for s_ in x.steps for c in s_.tool_calls]
    if len(statuses) < 10:
        return None
    failed = [(p, name) for p, name, status in statuses if status != "ok"]
    rate = len(failed) / len(statuses)
    if rate < t["max_rate"]:
        return None
    halves = [[st for p, _, st in statuses if p[1] == h] for h in (0, 1)]
    first, second = (sum(st != "ok" for st in part) / max(1, len(part)) for part in halves)
    by = Counter(name for _, name in failed).most_common(5)
    return Hit(rate / t["max_rate"] * (1.2 if second > first else 1.0),
               {"tool/failure_rate": _r(rate), "tool/failures_by_status": dict(by), "first_half": _r(first), "second_half": _r(second),
                "env/<harness>/tool/<tool>/<status>": "from the run's rows" if statuses[0][0][0] == "rows" else None},
               f"{rate:.0%} of {len(statuses)} tool calls failed ({'rising' if second > first else 'not rising'}); most: {by[0][0]}")


def reset_mismatch(d: DiagnosedRun, t: dict) -> Hit | None:
    seen: dict[str, set] = {}
    for x in d.trajectories():
        seen.setdefault(x.task_id, set()).add(x.initial_observation)
    repeated = {k: v for k, v in seen.items() if len(v) > 0}
    leaky = {k: len(v) for k, v in repeated.items() if len(v) > t["max_variants"]}
    if not leaky:
        return None
    frac = len(leaky) / len(repeated)
    return Hit(1.0 + 2 * frac, {"env/initial_observation_variants": dict(list(leaky.items())[:5]), "tasks_affected": len(leaky)},
               f"{len(leaky)} task(s) started from different initial observations (e.g. {next(iter(leaky))})")


def eval_below_training(d: DiagnosedRun, t: dict) -> Hit | None:
    """Evaluation falling behind training: the gap between the training success rate (first and last
    few steps) and the evaluation of the same harnesses (first and last) widened by more than
    `max_gap`. A gap present from the start is the sampling difference (curriculum-drawn tasks at
    temperature 1 vs every evaluation task greedily), not a mismatch."""
    rates = d.record.eval_rates()
    train = [h.name for h in d.config.harnesses if not h.held_out and h.name in rates]
    success = d.record.column(keys.REWARD_SUCCESS_RATE)
    if not train or len(success) < 10:
        return None
    window = max(3, len(success) // 10)
    train_first, train_last = statistics.fmean(success[:window]), statistics.fmean(success[-window:])
    eval_first = statistics.fmean(rates[n][0][1] for n in train)
    eval_last = statistics.fmean(rates[n][-1][1] for n in train)
    widened = (train_last - eval_last) - (train_first - eval_first)
    if widened < t["max_gap"]:
        return None
    return Hit(widened / t["max_gap"], {"reward/success_rate": [_r(train_first), _r(train_last)],
                                        "eval/<harness>/success_rate": [_r(eval_first), _r(eval_last)], "gap_widened": _r(widened)},
               f"training success {train_first:.2f} -> {train_last:.2f} vs evaluation {eval_first:.2f} -> {eval_last:.2f} "
               f"on the same harnesses (gap widened by {widened:.2f})")


def mismatch_kl(d: DiagnosedRun, t: dict) -> Hit | None:
    kl = d.record.column(keys.TRAIN_MISMATCH_KL)
    if not kl or statistics.median(kl) < t["max_median"]:
        return None
    med = statistics.median(kl)
    return Hit(med / t["max_median"], {"train/mismatch_kl": {"median": _r(med, 6), "max": _r(max(kl), 6)}},
               f"median mismatch_kl {med:.3g}: the server samples from other weights than the trainer's")


def episode_errors(d: DiagnosedRun, t: dict) -> Hit | None:
    """Episodes that failed to start or run, with environment creation failures by error
    (`env/<harness>/create_failures/<error>` in the run's rows)."""
    errors = max((r.get(keys.ROLLOUT_EPISODE_ERRORS) or 0 for r in d.rows), default=0)
    kinds = _counts(d.rows[-1], CREATE_KEY) if d.rows else Counter()
    created_failed = int(sum(kinds.values()))
    episodes = d.episodes() + errors
    failures = max(errors, created_failed)
    if not episodes or failures / episodes < t["max_rate"]:
        return None
    by = {f"{h}: {e}": n for (h, e), n in kinds.most_common(3)}
    return Hit(failures / episodes / t["max_rate"], {"rollout/episode_errors": errors, "env/creation_errors": by},
               f"{failures} of {episodes} episodes failed to create or run an environment" + (f"; most: {next(iter(by))}" if by else ""))


HARNESS_ERRORS_KEY = re.compile(keys.ENV_HARNESS_ERRORS_PATTERN)
HARNESS_STOPPED = re.compile(r"harness '[^']+': \w+\(\) raised")


def harness_errors(d: DiagnosedRun, t: dict) -> Hit | None:
    """Episodes a harness's own code failed (`env/<harness>/harness_errors/<method>`, counted over the
    run), and a run stopped for it (a failing check naming the harness and method). A stopped run
    outranks every other finding: nothing after it says anything about training."""
    counts: Counter = Counter()
    for r in d.rows:
        for (h, method), n in _counts(r, HARNESS_ERRORS_KEY).items():
            counts[(h, method)] = max(counts[(h, method)], n)
    stopped = [(where, c) for where, c in _failed_checks(d) if HARNESS_STOPPED.search(c.get("detail") or "")]
    total = int(sum(counts.values()))
    if not stopped and total < t["min_episodes"]:
        return None
    by = {f"{h}.{m}()": int(n) for (h, m), n in counts.most_common(3)}
    evidence = {"env/harness_errors": by or None}
    if stopped:
        where, c = stopped[0]
        line = next(x for x in (c.get("detail") or "").splitlines() if HARNESS_STOPPED.search(x))
        evidence["failed_check"] = f"{where}: {c['name']}"
        return Hit(10.0, evidence, f"the run stopped: {line.strip()[:220]}")
    return Hit(1.0 + total / max(1, d.episodes()), evidence,
               f"{total} episodes masked because harness code raised; most: {next(iter(by))}")


MALFORMED_KEY = re.compile(keys.GATEWAY_MALFORMED_PATTERN)
MALFORMED_HINT = "the model writes tool calls the agent cannot parse: check the tool-call parser for this model family"


def malformed_tool_calls(d: DiagnosedRun, t: dict) -> Hit | None:
    """Tool calls the model wrote through the run's gateway that the parser refused (not JSON, a tool
    not offered, never closed): `gateway/malformed_tool_calls` of the calls served, `gateway/calls`
    (both cumulative), by harness from `gateway/<harness>/malformed_tool_calls`."""
    malformed = max((r.get(keys.GATEWAY_MALFORMED_TOOL_CALLS) or 0 for r in d.rows), default=0)
    calls = max((r.get(keys.gateway("calls")) or 0 for r in d.rows), default=0)
    if malformed < t["min_calls"] or malformed / max(calls, malformed) < t["min_fraction"]:
        return None
    by: Counter = Counter()
    for r in d.rows:
        for (h,), n in _counts(r, MALFORMED_KEY).items():
            by[h] = max(by[h], int(n))
    rate = malformed / max(calls, malformed)
    most = f"; most in harness {by.most_common(1)[0][0]}" if by else ""
    return Hit(min(3.0, max(1.0, rate / t["min_fraction"])) if t["min_fraction"] > 0 else 1.0,
               {"gateway/malformed_tool_calls": int(malformed), "gateway/calls": int(calls),
                "gateway/<harness>/malformed_tool_calls": dict(by.most_common(5)) or None},
               f"{int(malformed)} tool calls in {int(calls)} gateway calls were refused by the parser{most}: {MALFORMED_HINT}")


def _failed_checks(d: DiagnosedRun) -> list[tuple[str, dict]]:
    """(where, check as a dict) of every failing check in the run's stage and verify reports."""
    rec = d.record
    found = []
    for layer, checks in ((rec.verify_report or {}).get("layers") or {}).items():
        found += [(f"verify {layer}", c) for c in checks if c.get("status") == CheckStatus.FAIL]
    for stage, report in rec.reports.items():
        found += [(f"stage {stage}", c.__dict__) for c in report.checks if c.status == CheckStatus.FAIL]
    return found


def store_growth(d: DiagnosedRun, t: dict) -> Hit | None:
    from agentrl_cli.runtime.data.stores import open_store

    if d.config.data.store != "local" or not d.rows:
        return None
    created = d.record.run.meta().get("created_at")
    try:
        start = datetime.fromisoformat(created) if created else None
        objects = open_store(d.config.data).list()
    except Exception:  # noqa: BLE001 - an unreadable store says nothing about growth
        return None
    if start is None:
        return None
    written = sum(o.size for o in objects if o.modified >= start)
    hours = max((datetime.now(timezone.utc) - start).total_seconds(), 60.0) / 3600
    hours = min(hours, max(d.rows[-1].get(keys.ELAPSED_S) or 60.0, 60.0) / 3600)
    rate = written / hours
    free = shutil.disk_usage(Path(d.config.data.root)).free
    to_full = free / rate if rate else math.inf
    if to_full >= t["min_hours_to_full"]:
        return None
    return Hit(t["min_hours_to_full"] / max(to_full, 0.1),
               {"data/store_bytes": written, "data/store_growth_mb_per_hour": _r(rate / 1e6, 2), "data/hours_to_disk_full": _r(to_full, 1)},
               f"the store grew {rate / 1e6:.1f} MB/h: the disk is full in {to_full:.1f} h")


def loss_not_finite(d: DiagnosedRun, t: dict) -> Hit | None:
    losses = [r.get(keys.TRAIN_LOSS) for r in d.rows]
    bad = [(r[keys.STEP], r.get(keys.TRAIN_LOSS)) for r in d.rows
           if not isinstance(r.get(keys.TRAIN_LOSS), (int, float)) or not math.isfinite(r[keys.TRAIN_LOSS]) or abs(r[keys.TRAIN_LOSS]) > t["max_abs"]]
    if not losses or not bad:
        return None
    return Hit(3.0, {"train/loss": bad[:5], "train/grad_norm": [_r(r.get(keys.TRAIN_GRAD_NORM)) for r in d.rows if r[keys.STEP] == bad[0][0]]},
               f"loss {bad[0][1]} at step {bad[0][0]} ({len(bad)} bad steps)")


def entropy_check(d: DiagnosedRun, t: dict) -> Hit | None:
    entropy = d.record.column(keys.TRAIN_ENTROPY)
    if len(entropy) < 10:
        return None
    ok, measured = entropy_trend(entropy)
    return None if ok else Hit(1.5, {"train/entropy": measured}, f"entropy median went from {measured['first']} to {measured['last']}")


def grad_norm(d: DiagnosedRun, t: dict) -> Hit | None:
    norms = d.record.column(keys.TRAIN_GRAD_NORM)
    if len(norms) < 5:
        return None
    ok, measured = grad_norm_stable(norms)
    return None if ok else Hit(1.5, {"train/grad_norm": measured}, f"gradient norm max {measured['max']} vs median {measured['median']}")


def env_failure_rate(d: DiagnosedRun, t: dict) -> Hit | None:
    failures = max((r.get(keys.ROLLOUT_ENV_FAILURES) or 0 for r in d.rows), default=0)
    episodes = d.episodes()
    if not episodes or failures / episodes < t["max_rate"]:
        return None
    return Hit(failures / episodes / t["max_rate"], {"rollout/env_failures": failures, "episodes": episodes},
               f"{failures} of {episodes} episodes ended in environment errors or timeouts")


def repeat_variance(d: DiagnosedRun, t: dict) -> Hit | None:
    repeats = d.record.extra.get("repeats") or []
    if not repeats:
        return None
    var = max(statistics.pvariance(r["rewards"]) for r in repeats)
    if var <= t["max_variance"]:
        return None
    return Hit(min(5.0, var / max(t["max_variance"], 1e-9)), {"verify/repeat_reward_variance": _r(var, 6)},
               f"the same task with the same seed scored with variance {var:.3g}")


def alert_rule(alert: str) -> Callable[[DiagnosedRun, dict], Hit | None]:
    """The detector of the alert rule `alert` of acceptance/alerts.py (the one `agentrl observe alerts`
    renders), with the run's own `observe.alert_*` thresholds, evaluated on its metrics rows as they
    stand at the end. Its kind in the knowledge base is `alert:<alert>`."""
    def detect(d: DiagnosedRun, t: dict) -> Hit | None:
        from agentrl_cli.acceptance.alerts import rules, window_s

        rule = next(r for r in rules(d.config.observe, achievable_max_reward(d.config.reward.weights)) if r.alert == alert)
        window = window_s(d.config.observe)
        fired = rule.evaluate(d.rows, window)
        if not fired:
            return None
        first = rule.conditions[0]
        labels, value = max(fired.items(), key=lambda kv: kv[1])
        ratio = value / first.threshold if first.threshold > 0 else 2.0
        where = ", ".join(f"{k}={v}" for k, v in labels) or "the run"
        return Hit(min(5.0, max(1.0, ratio)),
                   {"alert/firing": {"rule": rule.alert, "expr": rule.promql(window), "value": _r(value),
                                     "threshold": first.threshold, "labels": dict(labels), "series": len(fired)}},
                   f"{rule.alert} fires for {where}: {_r(value, 3)} {first.op} {first.threshold:g} ({rule.summary})")
    return detect


DETECTORS: dict[str, Callable[[DiagnosedRun, dict], Hit | None]] = {
    "reward_masked": reward_masked, "failed_check": failed_check, "reward_at_max": reward_at_max,
    "canary_positive": canary_positive, "env_latency_vs_baseline": env_latency_vs_baseline, "share_drift": share_drift,
    "sync_share": sync_share, "reward_flat": reward_flat, "held_out_drop": held_out_drop,
    "server_idle_queue": server_idle_queue, "long_tail_idle_trainer": long_tail_idle_trainer, "tool_failures": tool_failures,
    "reset_mismatch": reset_mismatch, "eval_below_training": eval_below_training, "mismatch_kl": mismatch_kl,
    "episode_errors": episode_errors, "store_growth": store_growth, "loss_not_finite": loss_not_finite,
    "entropy_trend": entropy_check, "grad_norm": grad_norm, "env_failure_rate": env_failure_rate,
    "repeat_variance": repeat_variance, "harness_errors": harness_errors, "malformed_tool_calls": malformed_tool_calls,
    **{f"alert:{name}": alert_rule(name) for name in ALERTS},
}
