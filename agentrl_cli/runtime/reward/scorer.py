"""The scorer: picks the task's verifier, runs it under a deadline with bounded retries, combines
the verdict into one reward, and caches results by an idempotency key (a hash of the task, the
trajectory content and the verifier versions), so the same trajectory always gets the same result.

Failure classes stay apart (docs/security.md row 15): the agent failed → `fail` (reward from the
components, never above zero when tampered); the episode timed out → `timeout` (≤ 0); the verifier
errored, crashed or ran past its deadline → retried, then `infra_error` (reward 0, `masked`, never
cached, counted) so the trainer can leave it out instead of learning a false zero. Tasks that fail
their null/gold check are quarantined: they are not scored (`infra_error`, flag `quarantined_task`).

The outcome comes from the verifier the task names in `meta.verify`: a rule verifier (`verifiers.py`),
a `reward.verifiers` scorer, a registered one or a user `module:function` (`registry.py`, built at
first use). Each `reward.verifiers` scorer (`components`) runs beside the outcome verifier under the
same deadline and retries; its score is the component of its name, its flags join the result's (a
`tamper` flag caps the reward at 0), and its failure makes the whole result `infra_error`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

from agentrl_cli.core.errors import AgentrlError, NotFoundError
from agentrl_cli.core.outcomes import Outcome, RewardStatus
from agentrl_cli.runtime.reward.aggregate import COMPONENTS, combine
from agentrl_cli.runtime.reward.models import RewardResult, ScoreRequest
from agentrl_cli.runtime.reward.registry import build_verifier
from agentrl_cli.runtime.reward.verifiers import Verdict, Verifier, VerifierError, default_verifiers, mixed

DEFAULT_WEIGHTS = {"outcome": 1.0, "format": 0.1, "tool_legality": 0.1}


class IdempotencyMismatch(ValueError):
    """A request's idempotency_key is not the hash of its content."""


def idempotency_key(req: ScoreRequest, verifier_versions: dict[str, str], weights: dict[str, float]) -> str:
    body = req.model_dump(mode="json", exclude={"idempotency_key"})
    blob = json.dumps({"request": body, "verifiers": verifier_versions, "weights": weights},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def with_component(verdict: Verdict, name: str, part: Verdict) -> Verdict:
    """The outcome verdict with a `reward.verifiers` scorer's flags and detail added."""
    flags = [*verdict.flags, *(f for f in part.flags if f not in verdict.flags)]
    detail = f"{verdict.detail}; {name}: {part.detail}" if part.detail else verdict.detail
    return Verdict(verdict.score, flags, detail, harness=verdict.harness)


class Scorer:
    """Thread-safe; one per process (the service holds one, the rollout holds one in-process)."""

    def __init__(self, verifiers: dict[str, Verifier] | None = None, *, weights: dict[str, float] | None = None,
                 timeout_s: float = 30.0, max_retries: int = 2, backoff_s: float = 0.05, cache_size: int = 100_000,
                 provider=None, components: list[Verifier] | None = None, config=None) -> None:
        """`components`: the `reward.verifiers` scorers, each a component under its name; `config`:
        the PlatformConfig registered scorers a task names in `meta.verify` are built from."""
        self.verifiers = dict(verifiers) if verifiers is not None else default_verifiers(provider)
        self.components = {v.name: v for v in components or []}
        self.weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        unknown = sorted(set(self.weights) - set(COMPONENTS) - set(self.components))
        if unknown:
            raise ValueError(f"reward weights name no component: {', '.join(unknown)}; components: "
                             f"{', '.join([*COMPONENTS, *self.components])}")
        self.config = config
        self._built: dict[str, Verifier] = {}  # meta.verify names built at first use (registry.py)
        self.timeout_s, self.max_retries, self.backoff_s, self.cache_size = timeout_s, max_retries, backoff_s, cache_size
        self._cache: OrderedDict[str, RewardResult] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="verifier")
        self._batch_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="score-batch")
        self._parts_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="score-parts")  # waits on _pool
        self.quarantined: dict[str, str] = {}  # task_id -> why
        self.counters: Counter = Counter()
        self._count_lock = threading.Lock()

    @classmethod
    def from_config(cls, config, provider=None) -> "Scorer":
        if provider is None:
            from agentrl_cli.envs.sandbox.provider import provider_from_config

            provider = provider_from_config(config.sandbox)
        r = config.reward
        components = [build_verifier(name, config) for name in r.verifiers]
        return cls(weights=r.weights, timeout_s=r.timeout_s, max_retries=r.max_retries, cache_size=r.cache_size,
                   provider=provider, components=components, config=config)

    def _count(self, key: str) -> None:
        with self._count_lock:
            self.counters[key] += 1

    def versions(self) -> dict[str, str]:
        """The versions of the rule verifiers and the `reward.verifiers` scorers (every cache key holds them)."""
        return {name: v.version for name, v in sorted({**self.verifiers, **self.components}.items())}

    def outcome_verifier(self, kind: str) -> Verifier:
        """The verifier a task's `meta.verify` names; raises NotFoundError when there is none (a
        registered one whose config is wrong raises its ConfigError)."""
        found = self.verifiers.get(kind) or self.components.get(kind) or self._built.get(kind)
        if found is not None:
            return found
        try:
            built = build_verifier(kind, self.config, key="task meta.verify")
        except NotFoundError as exc:
            raise NotFoundError(f"{exc.message}; rule verifiers: {', '.join(sorted(self.verifiers))}", exc.hint) from None
        with self._lock:
            return self._built.setdefault(kind, built)

    def close(self) -> None:
        self._batch_pool.shutdown(wait=False, cancel_futures=True)
        self._parts_pool.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for v in [*self.components.values(), *self._built.values()]:
            close = getattr(v, "close", None)  # a scorer holding a client or a model
            if callable(close):
                close()

    # ---- scoring -----------------------------------------------------------------------------

    def score(self, req: ScoreRequest, verifier: Verifier | None = None) -> RewardResult:
        """Score one trajectory. `verifier` overrides the task's own (e.g. a live harness)."""
        missing = ""
        if verifier is None:
            kind = "harness" if req.reward_source == "harness" else req.task.meta.get("verify", "answer")
            try:
                verifier = self.outcome_verifier(str(kind))
            except AgentrlError as exc:
                missing = f"no verifier {kind!r}: {exc.message}; fix: {exc.hint}"
        versions = {**self.versions(), **({verifier.name: verifier.version} if verifier is not None else {})}
        key = idempotency_key(req, versions, self.weights)
        if req.idempotency_key is not None and req.idempotency_key != key:
            raise IdempotencyMismatch(f"idempotency_key {req.idempotency_key[:16]}… is not the content hash {key[:16]}…; "
                                      "omit it or send the key this service returned for the same content")
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._count("cache_hits")
                return hit.model_copy(update={"cached": True})
        result = self._score_uncached(req, verifier, versions, key, missing)
        self._count(f"status_{result.status}")
        if result.status != RewardStatus.INFRA_ERROR and self.cache_size > 0:
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return result

    def score_batch(self, reqs: list[ScoreRequest]) -> list[RewardResult]:
        """Scores in request order; verifiers run concurrently (hidden tests wait on sandboxes)."""
        return list(self._batch_pool.map(self.score, reqs))

    def _score_uncached(self, req: ScoreRequest, verifier, versions, key, missing: str) -> RewardResult:
        base = dict(trajectory_id=req.trajectory_id, verifier_versions=versions, idempotency_key=key)
        if req.task.task_id in self.quarantined:
            return RewardResult(**base, reward=0.0, components={}, status=RewardStatus.INFRA_ERROR, outcome=Outcome.ERROR,
                                verifier="none", flags=["quarantined_task"],
                                detail=f"task quarantined: {self.quarantined[req.task.task_id]}")
        if verifier is None:
            kind = "harness" if req.reward_source == "harness" else req.task.meta.get("verify", "answer")
            return RewardResult(**base, reward=0.0, components={}, status=RewardStatus.INFRA_ERROR, outcome=Outcome.ERROR,
                                verifier=str(kind), detail=missing)
        (verdict, attempts, error), *parts = self._run_all([verifier, *self.components.values()], req)
        if verdict is not None and req.reward_source == "mix":
            harness_part, _, harness_error = self._run(self.verifiers["harness"], req)
            verdict, error = (None, harness_error) if harness_part is None else (mixed(verdict, harness_part), "")
        extra: dict[str, float] = {}
        for name, (part, tries, part_error) in zip(self.components, parts):
            if verdict is None:
                break
            if part is None:
                verdict, attempts, error = None, tries, part_error
                break
            extra[name] = part.score
            verdict = with_component(verdict, name, part)
        if verdict is None:
            self._count("infra_errors")
            return RewardResult(**base, reward=0.0, components={}, status=RewardStatus.INFRA_ERROR, outcome=Outcome.ERROR,
                                verifier=verifier.name, attempts=attempts, flags=["infra_error"], detail=error)
        reward, components, status, outcome = combine(verdict, req, self.weights, extra)
        return RewardResult(**base, reward=reward, components=components, status=status, outcome=outcome,
                            verifier=verifier.name, attempts=attempts, flags=list(verdict.flags), detail=verdict.detail)

    def _run_all(self, verifiers: list[Verifier], req: ScoreRequest) -> list[tuple[Verdict | None, int, str]]:
        """`_run` of each verifier, side by side: scoring takes the slowest one's time, not their sum."""
        if len(verifiers) == 1:
            return [self._run(verifiers[0], req)]
        return list(self._parts_pool.map(lambda v: self._run(v, req), verifiers))

    def _run(self, verifier: Verifier, req: ScoreRequest) -> tuple[Verdict | None, int, str]:
        error = ""
        for attempt in range(1, self.max_retries + 2):
            future = self._pool.submit(verifier.verify, req)
            try:
                verdict = future.result(timeout=self.timeout_s)
            except FutureTimeout:
                future.cancel()
                error = f"verifier {verifier.name} ran past its {self.timeout_s:g} s deadline"
            except VerifierError as exc:
                error = f"verifier {verifier.name}: {exc}"
            except Exception as exc:  # noqa: BLE001 - a crashing verifier is infrastructure, not a score
                error = f"verifier {verifier.name} crashed: {type(exc).__name__}: {exc}"
            else:
                if not (0.0 <= verdict.score <= 1.0):
                    error = f"verifier {verifier.name} returned {verdict.score}, outside [0, 1]"
                else:
                    return verdict, attempt, ""
            self._count("verifier_retries")
            if attempt <= self.max_retries:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        return None, self.max_retries + 1, f"{error} (after {self.max_retries + 1} attempts)"
