"""Stage 5 - sandbox and harnesses.

Checks: bubblewrap isolation available (fail closed), seccomp filter loaded, cgroup or rlimit
limits in force; create/exec/reclaim of a warm pool under concurrency with zero leaked processes,
fds or directories; a timeout ends the command with a `timeout` result; limits hold (memory,
processes, CPU time, file size, output size); egress denied (a listener this stage opens on the
host's loopback is unreachable, only `lo` exists). Then, for every configured harness (with the
contract's defaults applied, `harnesses.defaults`): its version and the contract it was checked
against, clean reset (initial observations equal after destroy-and-rebuild), a scripted episode per
task family earning full reward (where it ships scripted solutions), invalid actions answered
without a crash; and one episode of each played through the training path (`agentrl_cli.acceptance.harness_probe`:
the inference server with the configured model, the rollout episode, the configured reward source,
the stored record read back), so stage 5 cannot pass while training fails. A harness that plays
itself through the run's gateway (the `agent` harness) is also checked token-exact: every call of
its probe episode stored exactly as the inference servers were sent and answered it (0
mismatches), with its reward attached. A multi-agent harness (`harnesses.multi_agent`) reports its
roles' seats when it loads and is also checked role by role: every role moves and scores 1.0 in the
scripted play of each task family. A harness whose environment holds a limited number of sessions
(its optional `capacity(want)`, e.g. an OpenEnv server) reports that capacity and the concurrency
the run will play it at. Every harness is then played at that concurrency (`rollout.concurrency`, at
most its `max_concurrency`, the sandbox pool's limit and its environment's capacity) through the
run's per-harness warm pools (`agentrl_cli.acceptance.harness_concurrency`): episodes/s, failures and
refusals at capacity (backpressure, not failures) reported; it passes only when every episode ended
cleanly and no process, sandbox, work directory or fd outlived them. A harness with an image
(`harnesses[].image`) reports its digest and its os-release (read inside a sandbox of it), and a
file present only on the host must be absent inside.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.acceptance.image_checks import image_checks
from agentrl_cli.core.outcomes import RewardStatus
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.envs.sandbox import Sandbox, SandboxPool, SandboxSettings, SandboxUnavailable
from agentrl_cli.envs.sandbox.bwrap import check_bwrap
from agentrl_cli.envs.sandbox.cgroups import cgroup_support
from agentrl_cli.envs.sandbox.provider import DirectProvider
from agentrl_cli.envs.sandbox.seccomp import bpf_program
from harnesses.base import CONTRACT_VERSION
from harnesses.contract import invalid_actions_handled, play, reset_clean, scripted_policy
from harnesses.defaults import WithDefaults, defaults_applied
from harnesses.multi_agent import ROLES_EXPECTED, ROLES_HINT, is_multi_agent, roles_check, seats
from harnesses.registry import create, resolve, reward_source, uses_sandboxes
from harnesses.sandboxed import SandboxHarness
from harnesses.task_sources import task_set
from harnesses.tasks import HARNESS_FAMILIES, load_tasks


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config.sandbox
    settings = SandboxSettings.from_config(cfg)
    root = Path(tempfile.mkdtemp(prefix="agentrl-stage5-"))
    try:
        return _run(ctx, replace(settings, root_dir=root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(ctx: StageContext, settings: SandboxSettings) -> StageReport:
    cfg = ctx.config.sandbox
    checks = [ctx.check("isolation (bubblewrap namespaces)", lambda: _isolation(cfg))]
    if checks[0].status != CheckStatus.PASS:
        return ctx.report(checks + [Check.skipped("sandbox checks", "isolation is not available; see the check above")])
    checks.append(ctx.check("seccomp filter", lambda: _seccomp(cfg)))
    checks.append(ctx.check("create/exec/reclaim under concurrency", lambda: _churn(settings, ctx.config.stages.sandbox_concurrency)))
    with Sandbox(settings) as sb:
        checks.append(ctx.check("timeout ends the command", lambda: _timeout(sb)))
    checks += _limits(ctx, settings)
    checks.append(ctx.check("egress denied", lambda: _egress(settings)))
    for h in ctx.config.harnesses:
        checks += _harness_checks(ctx, h.name, settings)
    checks += _training_path(ctx)
    return ctx.report(checks, environment={"sandbox_backend": cfg.backend, "cgroups": cgroup_support(),
                                           "seccomp": bpf_program()[1]})


def _isolation(cfg) -> Check:
    name = "isolation (bubblewrap namespaces)"
    if cfg.backend == "process":
        return Check(name, CheckStatus.FAIL, "process backend", "bwrap",
                     "sandbox.backend is 'process': agent commands run WITHOUT isolation",
                     "install bubblewrap (`apt-get install bubblewrap`) and set sandbox.backend: bwrap")
    try:
        path = check_bwrap(cfg.bwrap)
    except SandboxUnavailable as exc:
        return Check(name, CheckStatus.FAIL, None, "bubblewrap creates user/pid/ipc/net/uts/cgroup namespaces", exc.message, exc.hint)
    return Check(name, CheckStatus.PASS, path, "bubblewrap creates user/pid/ipc/net/uts/cgroup namespaces")


def _seccomp(cfg) -> Check:
    if not cfg.seccomp:
        return Check.skipped("seccomp filter", "disabled by sandbox.seccomp: false", "loaded")
    program, status = bpf_program()
    return Check.judge("seccomp filter", program is not None, status, "loaded",
                       "pip install pyseccomp and apt-get install libseccomp2, or set sandbox.seccomp: false (weaker)")


def _churn(settings: SandboxSettings, concurrency: int) -> Check:
    episodes = concurrency * 4
    failures: list[str] = []
    t0 = time.perf_counter()
    pool = SandboxPool(settings, size=min(8, concurrency), max_concurrency=concurrency)

    def episode(i: int) -> None:
        try:
            with pool.lease(timeout=120) as sb:
                r = sb.exec(f"echo {i}; sleep 0 &")
                if r.stdout.strip() != str(i):
                    failures.append(f"episode {i}: {r.status} {r.output[:80]!r}")
        except Exception as exc:  # noqa: BLE001 - counted as a failure
            failures.append(f"episode {i}: {exc}")

    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(episode, range(episodes)))
    final = pool.close()
    elapsed = time.perf_counter() - t0
    leaks = {"processes": final["leaked_processes"], "fds": max(0, final["open_fds_delta"]), "dirs": final["sandbox_dirs"]}
    ok = not failures and not any(leaks.values())
    return Check.judge("create/exec/reclaim under concurrency", ok,
                       {"episodes": episodes, "concurrency": concurrency, "failures": len(failures), "leaks": leaks,
                        "episodes_per_s": round(episodes / elapsed, 1)},
                       "0 failures, 0 leaked processes/fds/dirs",
                       "see the detail; check sandbox.max_concurrency against the host's limits and run `agentrl sandbox check`",
                       "; ".join(failures[:5]))


def _timeout(sb: Sandbox) -> Check:
    r = sb.exec("sleep 60", timeout=1)
    left = {p for p in sb.processes()} - {sb.proc.pid}
    ok = r.status == "timeout" and (sb.cgroup is None or len(left) <= 2)  # only bubblewrap's init and the supervisor
    return Check.judge("timeout ends the command", ok, {"status": r.status, "seconds": round(r.duration_s, 2)},
                       "status timeout, the command's processes gone", "the sandbox failed to kill a timed-out command; report a bug")


# 64 forks that each sleep: a fork refused at the process limit ends it at once (bash's `cmd &` would retry
# a refused fork for seconds, and the wall timeout end it)
FORK_BOMB = """import os, sys, time
kids = []
try:
    for _ in range(64):
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        kids.append(pid)
except OSError as exc:
    print(f"fork failed after {len(kids)} children: {exc}", file=sys.stderr)
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


def _limits(ctx: StageContext, settings: SandboxSettings) -> list[Check]:
    lim = settings.limits
    probes = [
        ("memory limit", dict(memory_mb=lim.memory_mb), ["python3", "-c", "x = []\nwhile True: x.append(bytearray(8 << 20))"],
         lambda r: r.killed_reason == "memory" or (r.exit_code not in (0, None) and "MemoryError" in r.stderr)),
        ("process limit", dict(max_processes=16, wall_timeout_s=3), ["python3", "-c", FORK_BOMB],
         lambda r: bool(r.limits_hit.get("processes")) or "fork" in r.stderr),
        ("CPU-time limit", dict(cpu_time_s=1, wall_timeout_s=20), "while :; do :; done", lambda r: r.killed_reason == "cpu_time"),
        ("file-size limit", dict(max_file_size_mb=1), "head -c 4000000 /dev/zero > big",
         lambda r: r.exit_code != 0 and "File too large" in r.stderr),
        ("output limit", dict(output_limit_bytes=64 * 1024), "yes", lambda r: r.truncated and len(r.output) <= 64 * 1024),
    ]
    checks = []
    for name, limits, command, holds in probes:
        def probe(name=name, limits=limits, command=command, holds=holds) -> Check:
            s = replace(settings, limits=lim.with_(**limits))
            with Sandbox(s) as sb:
                r = sb.exec(command)
            return Check.judge(name, holds(r), {"limit": limits, "status": r.status, "stopped_by": r.killed_reason,
                                                "limits_hit": r.limits_hit}, "the command is stopped at the limit",
                               "the limit did not hold: check `agentrl sandbox check` (cgroups) and the sandbox.* limits",
                               (r.stderr or r.stdout)[-300:])
        checks.append(ctx.check(name, probe))
    return checks


def _egress(settings: SandboxSettings) -> Check:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (f"import socket\ns=socket.socket(); s.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port})); print('REACHED')\n"
            "except OSError:\n    print('blocked')\nprint(sorted(n for _, n in socket.if_nameindex()))")
    try:
        with Sandbox(settings) as sb:
            out = sb.exec(["python3", "-c", code]).stdout
        try:
            conn, _ = listener.accept()
            conn.close()
            reached = True
        except OSError:
            reached = False
    finally:
        listener.close()
    ok = not reached and "REACHED" not in out and "['lo']" in out
    return Check.judge("egress denied", ok, {"host_listener_reached": reached, "interfaces": out.strip().splitlines()[-1:]},
                       "host loopback listener unreachable; only lo", "bubblewrap must be given --unshare-net; check sandbox.backend")


def _harness_checks(ctx: StageContext, name: str, settings: SandboxSettings) -> list[Check]:
    """Contract checks of one configured harness, built by the registry as the run builds it: the
    configured options, and sandboxes with the configured limits and image (or the sandbox service).
    An image that cannot be found, verified or unpacked fails its check and skips the rest."""
    image: list[Check] = []
    hc = next((c for c in ctx.config.harnesses if c.name == name), None)
    if hc is not None and hc.image:
        image, settings = ctx.produce(f"harness {name}: image", lambda: _image(ctx, name, hc, settings))
        if settings is None:
            return image
    sandboxes = None if ctx.config.sandbox.service_url else DirectProvider(settings)
    loaded, h = ctx.produce(f"harness {name}: loads", lambda: _build(ctx, name, sandboxes, settings))
    if h is None:
        return image + loaded
    try:
        checks = image + loaded + _episode_checks(ctx, name, h)
        capacity = None
        if getattr(h.inner, "capacity", None) is not None:
            found, capacity = ctx.produce(f"harness {name}: capacity", lambda: _capacity(ctx, name, h.inner))
            checks += found
    finally:
        h.close()
    return checks + [ctx.check(f"harness {name}: concurrency", lambda: _concurrency(ctx, name, capacity, settings.root_dir))]


def _image(ctx: StageContext, name: str, hc, settings: SandboxSettings) -> tuple[list[Check], SandboxSettings]:
    """The harness's image found, verified and unpacked here, or held by the sandbox service
    (sandbox.service_url); ImageError, naming the image and why, fails the check. Here, also its
    os-release and a host-only file absent inside (`image_checks`)."""
    if ctx.config.sandbox.service_url:
        from agentrl_cli.envs.sandbox.provider import service_provider

        remote = service_provider(ctx.config.sandbox, hc)
        remote.close()
        return Check(f"harness {name}: image", CheckStatus.PASS, {"image": hc.image, "digest": remote.image_digest,
                                                                  "service": ctx.config.sandbox.service_url},
                     "the sandbox service holds it and has its warm pool"), settings
    rooted = settings.with_image(hc.image, hc.image_digest)
    unused = "" if uses_sandboxes(name) else (f"{name} acts through no sandbox: its episodes do not run in this image "
                                             "(their records and meta.json carry no digest for it)")
    found = Check(f"harness {name}: image", CheckStatus.PASS, {"image": hc.image, "digest": rooted.image_digest},
                  "found, every digest verified, unpacked", unused)
    return [found, *image_checks(name, rooted)], rooted


def _capacity(ctx: StageContext, name: str, h) -> tuple[Check, int | None]:
    """The sessions the harness's environment holds at once (the harness's optional `capacity(want)`:
    what its server reports, or learnt by opening up to the run's concurrency) and the concurrency
    the run will play it at: the lower of the two. Returns the check and the capacity (None: no limit found)."""
    want = _wanted(ctx, name)
    capacity = h.capacity(want)
    run = want if capacity is None else min(want, capacity)
    probed = min(want, getattr(h, "PROBE_SESSIONS", want))
    measured = {"capacity": capacity if capacity is not None else f">= {probed}", "concurrency": run}
    detail = (f"the environment holds {capacity} session(s) at once: the run plays at most {run} episode(s) of {name} at once, "
              "its refusals past that waited out as backpressure (env/{name}/backpressure), not errors"
              if capacity is not None and capacity < want else
              f"the environment accepted the {probed} sessions opened at once; a refusal past that is waited out as backpressure")
    return Check.info(f"harness {name}: capacity", measured, detail.replace("{name}", name),
                      "reported: the environment's sessions at once and the run's concurrency for it"), capacity


def _wanted(ctx: StageContext, name: str) -> int:
    """The episodes of `name` the run plays at once before its environment's capacity is known:
    `rollout.concurrency`, at most the harness's `max_concurrency`, and for a harness acting through
    local sandboxes at most `sandbox.max_concurrency` (its pool's limit; the sandbox service has its own)."""
    from harnesses.registry import uses_sandboxes

    cfg = ctx.config
    hc = next(c for c in cfg.harnesses if c.name == name)
    limits = [cfg.rollout.concurrency, hc.max_concurrency or cfg.rollout.concurrency]
    if uses_sandboxes(name) and not cfg.sandbox.service_url:
        limits.append(cfg.sandbox.max_concurrency)
    return min(limits)


def _concurrency(ctx: StageContext, name: str, capacity: int | None, root: Path) -> Check:
    """The harness's episodes played at the run's concurrency for it (`_wanted`, at most its
    environment's capacity), twice as many as play at once, through the run's per-harness warm
    pools (`harness_concurrency.play_at`): every episode ends cleanly and nothing outlives them."""
    from agentrl_cli.acceptance.harness_concurrency import play_at

    check = f"harness {name}: concurrency"
    if getattr(resolve(name), "plays_itself", False):
        return Check.skipped(check, "the harness plays itself through the run's gateway: its episodes need the policy; "
                                    "one is played through the training path below")
    concurrency = _wanted(ctx, name) if capacity is None else max(1, min(_wanted(ctx, name), capacity))
    tasks = _tasks(ctx, name)
    if not tasks:
        return Check.skipped(check, "the harness has no tasks (see its tasks check)")
    # a full wave at once, then up to 8 more on instances and sandboxes the first wave gave back
    played = play_at(ctx.config, name, tasks, concurrency, concurrency + min(concurrency, 8), root / "concurrency")
    measured = {"concurrency": concurrency, "episodes": played.episodes, "episodes_per_s": played.per_s,
                "failures": len(played.failures), "backpressure": played.backpressure, "given_up": played.given_up,
                "leaks": played.leaks, **({"capped_at": played.capped_at} if played.capped_at else {})}
    if ctx.config.sandbox.service_url:
        measured["sandbox_leaks"] = "counted by the sandbox service (its /metrics), not measurable here"
    return Check.judge(check, played.clean, measured,
                       "every episode ends cleanly at the run's concurrency; no process, sandbox, directory or fd outlives them",
                       "the harness fails or leaks only when several of its episodes run at once: look for state its "
                       "instances share (class attributes, module globals) and processes it starts and never ends; "
                       f"harnesses[].max_concurrency caps how many episodes of {name} the run plays at once",
                       _concurrency_detail(played))


def _concurrency_detail(played) -> str:
    """What went wrong at concurrency, or what was played."""
    wrong = played.failures[:3]
    if played.given_up:
        wrong.append(f"{played.given_up} episode(s) refused at capacity past rollout.env_busy_timeout_s")
    if played.leftovers:
        wrong.append(f"{len(played.leftovers)} process(es) started during the episodes outlived them (ended now): "
                     + "; ".join(f"pid {pid} `{cmd[:80]}`" for pid, cmd in list(played.leftovers.items())[:3]))
    leaks = played.leaks
    wrong += [f"{leaks[key]} {what}" for key, what in (
        ("sandbox_processes", "process(es) left in destroyed sandboxes' cgroups"),
        ("sandboxes_held", "sandbox(es) still leased after every instance closed"),
        ("dirs", "sandbox work directory(ies) left"), ("fds", "file descriptor(s) more open in this process")) if leaks.get(key)]
    return "; ".join(wrong) or f"{played.episodes} episodes, {played.concurrency} at once: all ended cleanly, nothing left behind"


def _build(ctx: StageContext, name: str, sandboxes, settings: SandboxSettings):
    h = WithDefaults(lambda: create(name, ctx.config, sandboxes=sandboxes))
    lim = settings.limits
    hc = next(c for c in ctx.config.harnesses if c.name == name)
    measured = {"version": h.version, "contract": CONTRACT_VERSION, "reward": reward_source(hc),
                "defaults_applied": sorted(m for m, applied in defaults_applied(type(h.inner)).items() if applied)}
    if is_multi_agent(h):  # who plays each role (harnesses[].roles), refused here when misconfigured
        measured["roles"] = seats(type(h.inner), hc.roles, name)
    if isinstance(h.inner, SandboxHarness):
        measured["sandbox"] = ({"service_url": ctx.config.sandbox.service_url} if sandboxes is None else
                               {"memory_mb": lim.memory_mb, "max_processes": lim.max_processes, "cpu_time_s": lim.cpu_time_s,
                                "wall_timeout_s": lim.wall_timeout_s})
    return Check(f"harness {name}: loads", CheckStatus.PASS, measured, "registered and constructed from the config"), h


def _episode_checks(ctx: StageContext, name: str, h) -> list[Check]:
    """Clean reset and invalid actions on every harness, on a task of each family of its task set;
    scripted episodes only where the harness ships scripted solutions (the built-in ones)."""
    policy = scripted_policy(h.inner)
    tasks = _tasks(ctx, name)
    if not tasks:
        return [Check("harness " + name + ": tasks", CheckStatus.FAIL, 0, "at least one task",
                      f"harness {name} has no tasks", "set harnesses[].tasks or give the harness a task_set()")]

    def reset_check() -> Check:
        results = [reset_clean(h, t) for t in tasks]
        bad = [d for ok, d in results if not ok]
        return Check.judge(f"harness {name}: clean reset", not bad, f"{len(results) - len(bad)}/{len(results)} tasks",
                           "initial observation equal after destroy-and-rebuild", "the harness keeps state across reset; fix its reset()",
                           "; ".join(bad))

    def scripted() -> Check:
        solvable = [t for t in tasks if policy(t, 0) is not None]  # a task without a scripted solution is left out
        if not solvable:
            return Check.skipped(f"harness {name}: scripted episodes", "no task of this harness has a scripted solution")
        rewards = [h.compute_reward(play(h, t, policy=policy)[0]) for t in solvable]
        return Check.judge(f"harness {name}: scripted episodes", bool(rewards) and min(rewards) == 1.0,
                           {"families": len(tasks), "mean_reward": round(sum(rewards) / max(1, len(rewards)), 3)},
                           "reward 1.0 for the scripted solution of every family",
                           "the harness or its verifier is broken for the families below 1.0")

    def invalid() -> Check:
        ok, detail = invalid_actions_handled(h, tasks[0])
        return Check.judge(f"harness {name}: invalid actions", ok, detail, "invalid_action, no crash",
                           "step() must answer malformed actions with an invalid_action observation", detail)

    if policy is not None and h.has_reward():
        episodes = ctx.check(f"harness {name}: scripted episodes", scripted)
    else:
        episodes = Check.skipped(f"harness {name}: scripted episodes", (
            "the harness ships no scripted solutions (scripted_action)" if policy is None else
            "the harness defines no compute_reward to score its scripted solutions with")
            + "; its reset and invalid actions are checked on its own tasks, and one episode runs through the training path")
    checks = [ctx.check(f"harness {name}: clean reset", reset_check), episodes,
              ctx.check(f"harness {name}: invalid actions", invalid)]
    if is_multi_agent(h):
        def roles() -> Check:
            ok, measured, detail = roles_check(h, tasks)
            return Check.judge(f"harness {name}: every role plays and is scored", ok, measured, ROLES_EXPECTED, ROLES_HINT, detail)
        checks.append(ctx.check(f"harness {name}: every role plays and is scored", roles))
    return checks


def _tasks(ctx: StageContext, name: str) -> list:
    """A task of each family of the harness's task set (the built-in families' eval tasks; else up to
    four families of its own eval tasks, or of all its tasks)."""
    families = HARNESS_FAMILIES.get(name, ())
    if families:
        return [load_tasks(name, "eval", f)[0] for f in families]
    hc = next(c for c in ctx.config.harnesses if c.name == name)
    own = task_set(hc, ctx.config.data).select("eval") or task_set(hc, ctx.config.data).select()
    return list({t.meta.get("family", t.task_id): t for t in own}.values())[:4]


def _training_path(ctx: StageContext) -> list[Check]:
    """One episode per configured harness through the training run's own parts (see the docstring)."""
    from agentrl_cli.acceptance.harness_probe import probe_harnesses

    names = [f"harness {h.name}: one episode through the training path" for h in ctx.config.harnesses]
    try:
        played = probe_harnesses(ctx.config, ctx.run.path / "stage5", ctx.run.run_id, ctx.progress)
    except Exception as exc:  # noqa: BLE001 - the whole probe failed (server, model): each harness's check says so
        return [Check.crashed(n, exc) for n in names]
    checks = []
    for name, h in zip(names, ctx.config.harnesses):
        p = played[h.name]
        measured = {"task": p.task_id, "termination": p.termination, "reward_source": p.reward_source, "verifier": p.verifier,
                    "reward": None if p.reward is None else round(p.reward, 4), "reward_status": p.reward_status,
                    "stored": p.stored, **({"flags": p.flags} if p.flags else {})}
        checks.append(Check.judge(name, p.ok, measured, "played, scored by the configured reward source, stored and read back",
                                  p.hint, p.error))
        if getattr(resolve(h.name), "plays_itself", False):
            checks.append(_token_exact(h.name, p))
    return checks


def _token_exact(name: str, p) -> Check:
    """An agent harness's probe episode through the gateway: its stored ids are the served ids, and
    it was scored."""
    c = p.counters
    scored = p.reward_status in (RewardStatus.OK, RewardStatus.FAIL) and p.reward is not None and p.stored
    ok = p.ok and c.get("token_exact_episodes", 0) >= 1 and c.get("token_exact_mismatches", 0) == 0 and scored
    measured = {"calls": c.get("agent_calls", 0), "segments": c.get("agent_segments", 0),
                "non_prefix_calls": c.get("agent_non_prefix_calls", 0), "checked": c.get("token_exact_episodes", 0),
                "mismatches": c.get("token_exact_mismatches", 0), "reward": None if p.reward is None else round(p.reward, 4),
                "reward_status": p.reward_status, "reward_source": p.reward_source}
    return Check.judge(f"harness {name}: token-exact through the gateway", ok, measured,
                       "every call stored as served (0 mismatches), the episode scored and stored",
                       "see the gateway's counters in the run's metrics (gateway/…) and the probe's error; an agent "
                       "that makes no call, or whose session expired (gateway.session_ttl_s), is not checked", p.error)
