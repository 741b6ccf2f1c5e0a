"""Which measurement answers which criterion, per backend, and the threshold each is judged against.

Measurements are made once and shared: the short loop per backend (criteria 1, 2, 4, 5), the
abort-and-resume of the embedded server (criterion 2; inference side, the same whichever backend
trains), the harness contract checks (criterion 4; harness side), the stress table per backend
(criterion 3), the checkpoint probe over all backends together (criterion 6: each loads the
others' checkpoints), and installed metadata (criteria 7, 8). A measurement that raises makes the
cells that need it failing cells with the traceback (`Check.crashed`), never a crash of the command;
a backend that is not installed makes all its cells `skip` with the reason.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agentrl_cli.core import parts
from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.acceptance.select import checkpoint_probe, loop_probe, packages, stress
from agentrl_cli.acceptance.select.scorecard import BY_KEY, CRITERIA, Scorecard, cell_name

KNOWN_BACKENDS = parts.names(parts.BACKENDS)  # the names `--backends` accepts even when one is not installed here
MIN_TIMED_FRACTION = 0.8  # as stage 0: the timed phases account for most of the loop's wall time


@dataclass
class Options:
    backends: list[str]
    model: Path
    criteria: list[str] = field(default_factory=lambda: [c.key for c in CRITERIA])
    memory_budget_gb: float = 8.0
    stress_ranks: list[int] = field(default_factory=lambda: [1, 2])
    micro_batches: list[int] = field(default_factory=lambda: [1, 2, 4])
    strategies: list[str] | None = None  # the stress table's strategies (zero0..zero3, fsdp); None: every one of each backend
    steps: int = loop_probe.STEPS
    harness: str | None = None  # criterion 4's harness (module:Class); default: the first configured one by its class path

    def as_dict(self) -> dict:
        return {"backends": self.backends, "model": str(self.model), "criteria": self.criteria,
                "memory_budget_gb": self.memory_budget_gb, "stress_ranks": self.stress_ranks,
                "micro_batches": self.micro_batches, "strategies": self.strategies, "steps": self.steps, "harness": self.harness}


def not_installed(name: str) -> str | None:
    """Why backend `name` cannot be probed here, or None."""
    from agentrl_cli.learner.backend import BACKENDS

    if name not in BACKENDS:
        return (f"training.backend {name!r} is not installed: this agentrl's backends are {', '.join(BACKENDS)} "
                "(agentrl_cli/learner/backend.py BACKENDS)")
    module = BACKENDS[name].split(":")[0]
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the reason is the finding
        return f"training.backend {name!r}: {module} does not import here ({type(exc).__name__}: {exc})"
    return None


class MeasurementFailed(Exception):
    """A shared measurement raised; `original` is its exception, traceback as it was raised."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class Measured:
    """A measurement made at most once; its exception kept to fail every cell that needs it."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.done, self.value, self.error = fn, False, None, None

    def get(self):
        if not self.done:
            self.done = True
            try:
                self.value = self.fn()
            except Exception as exc:  # noqa: BLE001 - contained: the cells that need it fail with it
                self.error = exc
        if self.error is not None:
            raise MeasurementFailed(self.error)
        return self.value


def run_probes(cfg, opts: Options, workdir: Path, run_id: str, progress=lambda message: None) -> Scorecard:
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    missing = {b: not_installed(b) for b in opts.backends}
    ready = [b for b in opts.backends if missing[b] is None]
    loops = {b: Measured(lambda b=b: _loop(cfg, opts, b, workdir, run_id, progress)) for b in ready}
    tables: dict[str, list] = {}

    def abort_resume() -> dict:
        progress("the embedded server: abort a generation mid-decode and resume it")
        return loop_probe.abort_resume(opts.model)

    def stress_rows(backend: str) -> list[dict]:
        rows = [{"backend": backend, **r} for r in stress.stress_table(
            cfg, opts.model, backend, opts.stress_ranks, opts.micro_batches, opts.memory_budget_gb, workdir / "stress", progress, opts.strategies)]
        tables.setdefault("parallel", []).extend(rows)
        return rows

    abort = Measured(abort_resume)
    contract = Measured(lambda: _contract(cfg, opts, progress))
    stresses = {b: Measured(lambda b=b: stress_rows(b)) for b in ready}
    checkpoints = Measured(lambda: checkpoint_probe.probe_all(ready, opts.model, workdir / "checkpoint", progress))
    judges = {"throughput": lambda b: throughput_check(b, loops[b].get()),
              "decoupled": lambda b: decoupled_check(b, loops[b].get(), abort.get()),
              "parallel": lambda b: parallel_check(b, stresses[b].get(), opts.memory_budget_gb, opts.stress_ranks),
              "integration": lambda b: integration_check(b, contract.get(), loops[b].get()),
              "weight_sync": lambda b: weight_sync_check(b, loops[b].get(), cfg.observe.alert_sync_share),
              "checkpoint": lambda b: checkpoint_check(b, checkpoints.get()[b]),
              "dependencies": lambda b: dependencies_check(b, packages.dependencies(b, cfg)),
              "maintenance": lambda b: maintenance_check(b, packages.maintenance(b))}
    cells: dict[tuple[str, str], Check] = {}
    for c in opts.criteria:
        for b in opts.backends:
            name = cell_name(c, b)
            if missing[b] is not None:
                cells[(c, b)] = Check.skipped(name, missing[b], hint="install it, or leave it out of --backends")
                continue
            progress(f"{BY_KEY[c].title} [{b}]")
            cells[(c, b)] = _guard(name, lambda c=c, b=b: judges[c](b))
    card = Scorecard(opts.backends, list(opts.criteria), cells, run_id=run_id, options=opts.as_dict(), tables=tables)
    card.duration_s = time.monotonic() - started
    return card


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        check = fn()
    except MeasurementFailed as failed:
        return Check.crashed(name, failed.original)
    except Exception as exc:  # noqa: BLE001 - one probe never stops the others
        return Check.crashed(name, exc)
    check.name = name
    return check


def _loop(cfg, opts: Options, backend: str, workdir: Path, run_id: str, progress) -> dict:
    progress(f"short loop: {opts.steps} async steps with training.backend={backend}")
    return loop_probe.short_run(cfg, backend, opts.model, workdir / f"loop-{backend}", f"{run_id}-{backend}", opts.steps,
                                progress=lambda m: progress(f"short loop [{backend}]: {m}"))


def _contract(cfg, opts: Options, progress) -> dict:
    from harnesses.base import CONTRACT_VERSION
    from harnesses.checkup import check_harness
    from harnesses.registry import registered

    first = cfg.harnesses[0].name if cfg.harnesses else "terminal_like"
    target = opts.harness or registered().get(first) or first
    progress(f"harness contract checks: {target}")
    checks = check_harness(target, cfg)
    return {"target": target, "contract": CONTRACT_VERSION, "by_module_class": ":" in target,
            "checks": {c.name: str(c.status) for c in checks},
            "failed": [f"{c.name}: {c.detail.splitlines()[0] if c.detail else ''}" for c in checks if c.status == CheckStatus.FAIL]}


# --- judging: one function per criterion, each states its threshold and how the value was measured


def _loop_how(backend: str, loop: dict) -> str:
    return (f"a {loop.get('steps')}-step loop (rollout.mode {loop.get('mode')}, max_staleness {loop.get('max_staleness')}, a "
            f"verified weight sync after every step) with training.backend={backend}, the configured harnesses and the "
            "embedded inference server; figures from its per-step metrics (metrics.jsonl)")


def throughput_check(backend: str, loop: dict) -> Check:
    fraction = loop.get("timed_fraction", 0.0)
    ok = bool(loop.get("phases_every_step")) and fraction >= MIN_TIMED_FRACTION
    return Check.judge("throughput", ok, {"seconds": loop.get("seconds"), "timed_fraction": round(fraction, 3),
                                          "tokens_per_s": round(loop.get("tokens_per_s", 0.0), 1)},
                       f"sampling, training and sync seconds recorded every step, covering >= {MIN_TIMED_FRACTION:.0%} "
                       "of the loop's wall time",
                       f"{BY_KEY['throughput'].action}: time outside the timed phases hides where the loop idles; "
                       "see the loop's metrics.jsonl (time/*) against elapsed_s",
                       _loop_how(backend, loop) + ": time/sampling_wait_s, time/train_s, time/sync_s summed over the steps "
                       "against the loop's wall time")


def decoupled_check(backend: str, loop: dict, abort: dict) -> Check:
    lags = [x for x in loop.get("policy_lag_per_step", []) if x is not None]
    overlapped = bool(lags) and max(lags) >= 1 and max(lags) <= loop.get("max_staleness", 0)
    resumed = (abort["abort_sent_mid_decode"] and abort["aborted_generations"] == 1 and abort["resumed_generations"] == 1
               and abort["wasted_tokens"] == 0 and abort["generated_tokens"] == abort["requested_tokens"]
               and abort["token_exact_vs_uninterrupted"])
    return Check.judge("decoupled", overlapped and resumed,
                       {"policy_lag_per_step": loop.get("policy_lag_per_step"), "max_staleness": loop.get("max_staleness"),
                        "abort_resume": {k: abort[k] for k in ("pieces_tokens", "aborted_generations", "resumed_generations",
                                                                "wasted_tokens", "token_exact_vs_uninterrupted")}},
                       "some trained samples were generated while the previous step trained (policy lag >= 1, within "
                       "rollout.max_staleness), and an aborted generation resumes from its partial tokens, token for token "
                       "what the uninterrupted one gives, nothing wasted",
                       f"{BY_KEY['decoupled'].action}; with no lag observed the rollout waited for training: check "
                       "rollout.mode and rollout.max_staleness",
                       _loop_how(backend, loop) + "; train/policy_lag per step; and one greedy generation of "
                       f"{abort['requested_tokens']} tokens on an embedded server aborted mid-decode by /abort_request and "
                       "continued by generate_resumable (inference side: the same for every training backend)")


def parallel_check(backend: str, rows: list[dict], budget_gb: float, rank_counts: list[int]) -> Check:
    if not rows:
        return Check.skipped("parallel", f"--strategies names no strategy of {backend}", hint="add one of its strategies, or all")
    ran = [r for r in rows if r["status"] == "ok"]
    fitting = [f"{r['strategy']}x{r['ranks']}" for r in ran if r["fits_budget_at_smallest"]]
    ok = len(ran) == len(rows) and bool(rows) and bool(fitting)
    value = {f"{r['strategy']}x{r['ranks']}": ({"mbs": r["points"][0]["mbs"], "peak_mib": r["points"][0]["peak_mib"],
                                                 "step_s": r["points"][0]["step_s"], "max_micro_batch": r["max_micro_batch"]}
                                                if r["points"] else r.get("error")) for r in rows}
    errors = "; ".join(f"{r['strategy']}x{r['ranks']}: {r.get('error')} (log {r.get('log')})" for r in rows if r["status"] != "ok")
    return Check.judge("parallel", ok, value,
                       f"every strategy of {backend} trains on {', '.join(map(str, rank_counts))} rank(s), and at least one "
                       f"fits {budget_gb:g} GB per rank at micro-batch 1",
                       f"{BY_KEY['parallel'].action}; a strategy that failed: read its worker log" if errors else
                       f"{BY_KEY['parallel'].action}; none fits the budget: more ranks with a sharding strategy, or a smaller model",
                       f"one process (one torchrun, gloo on CPU) per strategy and rank count, micro-batches in increasing "
                       f"order of {stress.SEQ_LEN}-token samples, {stress.STEPS_PER_SIZE} steps each; peak memory per rank = "
                       "peak RSS (VmHWM of /proc/self/status) above the process's own after the imports (torch.cuda.max_memory_allocated "
                       "on a GPU), the highest over the ranks; step time the faster of the steps, the slowest rank; the largest "
                       "micro-batch is a least-squares fit memory = a + b·mbs over the measured sizes, an extrapolation"
                       + (f"\n\nfailed: {errors}" if errors else ""))


def integration_check(backend: str, contract: dict, loop: dict) -> Check:
    episodes = loop.get("episodes", 0)
    ok = not contract["failed"] and episodes > 0
    return Check.judge("integration", ok, {"contract_version": contract["contract"], "harness": contract["target"],
                                           "checks": contract["checks"], "episodes_trained_with_backend": episodes},
                       "the harness, loaded by module:Class as a third-party one is, passes the contract checks, and the "
                       f"short loop of {backend} trained on the configured harnesses with no harness or reward setting changed",
                       f"{BY_KEY['integration'].action}: `agentrl harness check {contract['target']}` shows what failed",
                       f"harnesses/checkup.py check_harness({contract['target']!r}) (contract {contract['contract']}: members, "
                       f"reward source, tasks, one episode); and the episodes of the short loop with training.backend={backend}"
                       + (f"\n\nfailed: {'; '.join(contract['failed'])}" if contract["failed"] else ""))


def weight_sync_check(backend: str, loop: dict, max_share: float) -> Check:
    share, steps = loop.get("sync_share_of_step"), loop.get("steps", 0)
    ok = share is not None and share <= max_share and loop.get("verified_syncs", 0) == steps
    return Check.judge("weight_sync", ok, {"sync_share": share, "sync_s": loop.get("sync_s"), "step_s": loop.get("step_s"),
                                           "verified_syncs": loop.get("verified_syncs")},
                       f"every step's sync verified, and sync <= {max_share:.0%} of the step (observe.alert_sync_share)",
                       BY_KEY["weight_sync"].action,
                       _loop_how(backend, loop) + ": time/sync_s over time/step_s summed over the steps; syncs verified by "
                       "reading weights back from the server")


def checkpoint_check(backend: str, result: dict) -> Check:
    own, kept, others = result["own_resume"], result["kept_fixtures"], result["other_backends"]
    ok = own["ok"] and all(k["loaded"] for k in kept)
    cross = {o.get("fixture") or o.get("checkpoint"): ("loaded" if o["loaded"] else f"refused: {o.get('why', '')[:160]}")
             for o in others}
    note = ("" if kept else f"no fixture written by an earlier agentrl version with {backend} is kept, so loading across "
            "versions is not verified for it yet (`python -m agentrl_cli.acceptance.verify.old_checkpoint` keeps one); ")
    return Check.judge("checkpoint", ok, {"own_resume": {k: own[k] for k in ("restored_step", "relative_difference")},
                                          "kept_fixtures": {k["fixture"]: k["loaded"] for k in kept}, "other_backends": cross},
                       f"resumes its own checkpoint to the same next loss (relative difference <= {checkpoint_probe.RESUME_RTOL:g}, "
                       "step restored) and loads every kept fixture of its format from earlier agentrl versions",
                       f"{BY_KEY['checkpoint'].action}; across backends move the exported Hugging Face weights "
                       "(`agentrl model export`), not the checkpoint",
                       f"{note}one rank in this process: train, save (checkpoint manager layout), train the next step; a "
                       "fresh backend loads and trains that step; kept fixtures under agentrl_cli/acceptance/verify/fixtures; the other "
                       "backends' checkpoints loaded where the format allows (reported, not judged)")


def dependencies_check(backend: str, deps: dict) -> Check:
    if not deps["roots"]:
        return Check.skipped("dependencies", f"no root package is known for backend {backend!r} (acceptance/select/packages.py BACKEND_ROOTS)")
    ok = not deps["outside_allowed"] and not deps["missing"]
    return Check.judge("dependencies", ok, {"roots": deps["roots"], "packages": deps["packages"],
                                            "beyond_torch": deps["beyond_torch"], "outside_allowed": deps["outside_allowed"]},
                       "every package the backend needs is installed and its licence within image.allowed_licences",
                       f"{BY_KEY['dependencies'].action}: read the named packages' terms, then allow the licence, record it "
                       "(image.licence_overrides) or drop the package",
                       f"the closure of {deps['roots']} over the installed distributions, versions and licences from "
                       f"{deps['source']}; licences: {deps['licences']}")


def maintenance_check(backend: str, info: dict) -> Check:
    if not info:
        return Check.skipped("maintenance", f"no root package is known for backend {backend!r} (acceptance/select/packages.py BACKEND_ROOTS)")
    bad = [f"{n}: not installed" for n, m in info.items() if not m["installed"]]
    for n, m in info.items():
        if m["installed"] and not m["final_release"]:
            bad.append(f"{n} {m['version']} is a pre- or development release")
        level = packages.status_level(m.get("development_status")) if m["installed"] else None
        if level is not None and level < packages.MIN_STATUS:
            bad.append(f"{n} declares Development Status {m['development_status']}")
    value = {n: {k: m.get(k) for k in ("version", "final_release", "development_status", "source_revision", "installed_at",
                                       "release_date")} for n, m in info.items()}
    return Check.judge("maintenance", not bad, value,
                       "a final release, not declared below Beta; its age is not judged (see how it was measured)",
                       f"{BY_KEY['maintenance'].action}: " + ("; ".join(bad) if bad else "follow its issue tracker"),
                       "installed package metadata only, never the network: version, Development Status classifier, "
                       "the source revision the build records, the install date; installed metadata carries no release "
                       "date, so the version's age is unknown here (release_date: null); issue tracker: "
                       + ", ".join(f"{n}: {m.get('issue_tracker') or m.get('source') or 'none stated'}" for n, m in info.items()))
