"""Stage 6 - reward.

Starts the reward service on loopback (or uses `reward.service_url` when set) and checks: it is
healthy; scripted episodes of every configured harness score `success`; the same input scored
twice (by the service and by a fresh in-process scorer) gives the identical result; the
idempotency key returns the cached result; malformed requests get explicit errors naming the
field and never a score; failure classes stay apart (wrong answer = fail, timed-out episode ≤ 0,
verifier infrastructure failure = infra_error, masked); tampering with the visible tests is
flagged; every task family passes its null/gold check; throughput of a batch in scores/s.
"""

from __future__ import annotations

import time
import uuid

import httpx

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.core.outcomes import Outcome, RewardStatus, Termination
from agentrl_cli.core.report import Check, CheckStatus, StageReport
from agentrl_cli.runtime.reward.client import HttpRewardClient
from agentrl_cli.runtime.reward.request_from_episode import request_from_episode
from agentrl_cli.runtime.reward.gold import check_task
from agentrl_cli.runtime.reward.models import FileIn, ScoreRequest, StepIn, TaskIn
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.runtime.reward.service import create_app
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.core.serving import ServerThread
from harnesses.base import Action, Trajectory
from harnesses.contract import play
from harnesses.registry import create
from agentrl_cli.envs.sandbox.provider import DirectProvider, provider_from_config
from harnesses.tasks import HARNESS_FAMILIES, load_tasks

THROUGHPUT_BATCH = 200
MALFORMED = {
    "missing task": ({"trajectory_id": "x", "steps": []}, "task"),
    "wrong type": ({"task": {"task_id": "a", "harness": "h", "prompt": "p", "difficulty": "hard"}, "trajectory_id": "x",
                    "steps": []}, "task.difficulty"),
    "unknown field": ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [],
                       "reward": 1.0}, "reward"),
    "bad file encoding": ({"task": {"task_id": "a", "harness": "h", "prompt": "p"}, "trajectory_id": "x", "steps": [],
                           "files": [{"path": "solution.py", "content_b64": "%%%"}]}, "files.0.content_b64"),
}


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config
    provider = provider_from_config(cfg.sandbox)
    scorer = Scorer.from_config(cfg, provider)
    server = None
    url = cfg.reward.service_url
    notes: list[str] = []
    try:
        if not url:
            server = ServerThread(create_app(scorer), name="reward service").start()
            url = server.url
            notes.append(f"reward service started on {url} (reward.service_url is not set)")
        client = HttpRewardClient(url, timeout_s=cfg.reward.timeout_s + 5.0, max_retries=cfg.reward.max_retries)
        health = ctx.check("service healthy", lambda: _health(url))
        if health.status != CheckStatus.PASS:
            return ctx.report([health, Check.skipped("reward checks", "the reward service is not reachable; see above")], notes)
        scripted, episodes = ctx.produce("scripted episodes score success", lambda: _scripted(cfg, provider, client))
        checks = [health, *scripted]
        sample = next(iter((episodes or {}).values()), None)
        if sample is None:
            return ctx.report(checks + [Check.skipped("reward checks", "no scripted episode could be scored; see above")], notes)
        checks += [
            ctx.check("same input twice, same result", lambda: _deterministic(cfg, provider, client, list(episodes.values()))),
            ctx.check("idempotency key returns the cached result", lambda: _idempotent(client, sample)),
            ctx.check("bad input: explicit error, never a score", lambda: _malformed(url)),
            ctx.check("failure classes kept apart", lambda: _failure_classes(client)),
        ]
        if any(h.name == "code_sandbox_like" for h in cfg.harnesses):
            checks.append(ctx.check("tampering with the visible tests is flagged", lambda: _tamper(provider, client)))
        checks.append(ctx.check("null/gold check of every task family", lambda: _null_gold(cfg, scorer)))
        checks.append(ctx.check("throughput", lambda: _throughput(client, list(episodes.values()),
                                                                  cfg.stages.reward_min_scores_per_s)))
        client.close()
        return ctx.report(checks, notes, environment={"verifier_versions": scorer.versions(), "weights": scorer.weights,
                                                      "normalization": cfg.reward.normalization})
    finally:
        if server is not None:
            server.stop()
        scorer.close()


def _health(url: str) -> Check:
    hint = "start it with `agentrl serve reward` or unset reward.service_url to use the embedded one"
    try:
        r = httpx.get(url + "/health", timeout=5.0)
    except httpx.TransportError as exc:
        return Check("service healthy", CheckStatus.FAIL, None, "200 from /health", f"{url}: {type(exc).__name__}: {exc}", hint)
    return Check.judge("service healthy", r.status_code == 200, r.status_code, "200 from /health", hint)


def _scripted(cfg, provider, client) -> tuple[Check, dict[str, ScoreRequest]]:
    """Every task family's scripted episode scored by the service; the requests, by task id, are
    what the later checks score again."""
    bad, n, out = [], 0, {}
    for hc in cfg.harnesses:
        h = create(hc.name, cfg, sandboxes=provider)
        try:
            for family in HARNESS_FAMILIES.get(hc.name, ()):
                task = load_tasks(hc.name, "eval", family)[0]
                traj, _ = play(h, task)
                req = request_from_episode(traj, h.evidence(traj), trajectory_id=f"stage6-{uuid.uuid4().hex[:8]}")
                result = client.score(req)
                n += 1
                if result.outcome != Outcome.SUCCESS:
                    bad.append(f"{task.task_id}: {result.status}/{result.outcome} {result.detail}")
                out[task.task_id] = req
        finally:
            h.close()
    return Check.judge("scripted episodes score success", n > 0 and not bad, f"{n - len(bad)}/{n} success",
                       "every scripted episode scores success", "a verifier disagrees with the harness; see detail",
                       "; ".join(bad)), out


def _deterministic(cfg, provider, client, reqs: list[ScoreRequest]) -> Check:
    fresh = Scorer.from_config(cfg, provider)
    try:
        diffs = []
        for req in reqs:
            a, b = client.score(req), fresh.score(req)
            if a.model_dump(exclude={"cached"}) != b.model_dump(exclude={"cached"}):
                diffs.append(f"{req.task.task_id}: {a.reward} vs {b.reward}")
    finally:
        fresh.close()
    return Check.judge("same input twice, same result", not diffs, f"{len(reqs) - len(diffs)}/{len(reqs)} identical",
                       "service result == fresh in-process scorer result", "a verifier is not deterministic; see detail",
                       "; ".join(diffs))


def _idempotent(client, req: ScoreRequest) -> Check:
    first = client.score(req)
    again = client.score(req.model_copy(update={"idempotency_key": first.idempotency_key}))
    ok = again.cached and again.model_dump(exclude={"cached"}) == first.model_dump(exclude={"cached"})
    return Check.judge("idempotency key returns the cached result", ok, {"cached": again.cached, "key": first.idempotency_key[:16]},
                       "cached and identical", "the service's cache is off (reward.cache_size) or keys are unstable")


def _malformed(url: str) -> Check:
    problems = []
    for what, (body, field) in MALFORMED.items():
        r = httpx.post(url + "/score", json=body, timeout=10.0)
        payload = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        named = field in [f.get("field") for f in payload.get("fields", [])]
        if not (400 <= r.status_code < 500) or "reward" in payload or not named:
            problems.append(f"{what}: HTTP {r.status_code} {str(payload)[:120]}")
    n = len(MALFORMED)
    return Check.judge("bad input: explicit error, never a score", not problems, f"{n - len(problems)}/{n} rejected naming the field",
                       "4xx naming the field, no reward", "the service accepted malformed input; see detail", "; ".join(problems))


def _failure_classes(client) -> Check:
    task = load_tasks("terminal_like", "eval", "arith")[0]
    base = ScoreRequest(task=TaskIn(task_id=task.task_id, harness=task.harness, prompt=task.prompt, answer=task.answer,
                                    difficulty=task.difficulty, meta=task.meta),
                        trajectory_id="stage6-wrong", steps=[StepIn(action="ANSWER: -1")], final_answer="-1")
    timed_out = base.model_copy(update={"termination": Termination.TIMEOUT.value, "final_answer": str(task.answer), "trajectory_id": "stage6-timeout"})
    code = base.model_copy(update={"task": base.task.model_copy(update={"meta": {"verify": "tests", "tests": [
        {"id": "t", "args": [], "expected": 1}]}}), "files": [FileIn(path="solution.py", content_b64="eA==")],
        "trajectory_id": "stage6-infra"})
    broken = Scorer(provider=DirectProvider(SandboxSettings(bwrap="/nonexistent/bwrap")), max_retries=1, backoff_s=0.01)
    try:
        infra = broken.score(code)
    finally:
        broken.close()
    r_wrong, r_timeout = client.score(base), client.score(timed_out)
    measured = {"wrong answer": [r_wrong.status, r_wrong.components.get("outcome")],
                "timed-out episode": [r_timeout.status, r_timeout.reward],
                "sandbox down": [infra.status, infra.reward, infra.attempts]}
    ok = (r_wrong.status == RewardStatus.FAIL and r_wrong.components.get("outcome") == 0.0 and r_timeout.status == RewardStatus.TIMEOUT
          and r_timeout.reward <= 0.0 and infra.status == RewardStatus.INFRA_ERROR and infra.reward == 0.0 and infra.masked
          and infra.attempts == 2)
    return Check.judge("failure classes kept apart", ok, measured,
                       "fail / timeout (reward <= 0) / infra_error (retried, masked, reward 0)",
                       "the scorer conflates failure classes; run tests/integration/test_reward.py")


def _tamper(provider, client) -> Check:
    h = create("code_sandbox_like", sandboxes=provider)
    try:
        task = load_tasks("code_sandbox_like", "eval", "arith")[0]
        good = f"def solve():\n    return {task.answer}\n"
        attacks = {"edit test": "```python\nopen('test_solution.py', 'w').write('')\n```",
                   "exit 0 early": f"```python\nopen('solution.py', 'w').write({('import os; os._exit(0)' + chr(10) + good)!r})\n```"}
        caught = {}
        for what, attack in attacks.items():
            traj = Trajectory(task=task)
            traj.observations.append(h.reset(task))
            for text in (f"```python\nopen('solution.py', 'w').write({good!r})\n```", attack, "SUBMIT"):
                traj.actions.append(Action(text=text))
                traj.observations.append(h.step(traj.actions[-1]))
            r = client.score(request_from_episode(traj, h.evidence(traj), trajectory_id=f"stage6-{uuid.uuid4().hex[:8]}"))
            caught[what] = r.reward <= 0.0 and "tamper" in r.flags
    finally:
        h.close()
    return Check.judge("tampering with the visible tests is flagged", all(caught.values()), caught,
                       "reward 0 and a tamper flag for each attack", "the hidden-test verifier misses tampering")


def _null_gold(cfg, scorer) -> Check:
    bad, n = [], 0
    for hc in cfg.harnesses:
        for family in HARNESS_FAMILIES.get(hc.name, ()):
            for task in load_tasks(hc.name, "train", family)[:2]:
                ok, why = check_task(task, scorer)
                n += 1
                if not ok:
                    bad.append(f"{task.task_id}: {why}")
    return Check.judge("null/gold check of every task family", not bad, f"{n - len(bad)}/{n} tasks",
                       "unchanged work fails, the reference passes", "quarantine or fix these tasks (see detail)", "; ".join(bad))


def _throughput(client, reqs: list[ScoreRequest], minimum: float) -> Check:
    batch = [reqs[i % len(reqs)].model_copy(update={"trajectory_id": f"stage6-tp-{i}"}) for i in range(THROUGHPUT_BATCH)]
    t0 = time.perf_counter()
    results = client.score_batch(batch)
    rate = len(results) / (time.perf_counter() - t0)
    errors = sum(r.status == RewardStatus.INFRA_ERROR for r in results)
    return Check.judge("throughput", rate >= minimum and errors == 0, {"scores_per_s": round(rate, 1), "batch": len(batch),
                                                                       "infra_errors": errors},
                       f">= {minimum:g} scores/s, no infra errors", "see the reward service log; raise reward.timeout_s or "
                       "sandbox capacity, or lower stages.reward_min_scores_per_s on a small machine")
