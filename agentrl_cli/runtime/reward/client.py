"""Reward clients behind one interface: `LocalRewardClient` (a Scorer in this process) and
`HttpRewardClient` (the reward service). Both have `score`, `score_batch` and async `ascore`.

The HTTP client retries connection errors and 5xx with exponential backoff, bounded; when the
service stays down it returns an `infra_error` result (docs/security.md row 24) so the run continues and
the trajectory is masked, never scored as the agent's zero. A 4xx is a bug in the request and is
raised (`RewardRequestError`), never turned into a score. Every attempt has a deadline (`timeout_s`:
the run's `reward.timeout_s` plus the trip), so a service that accepts and never answers ends in
that masked result, naming the deadline, not in a wait; `outages` records each stretch the service
could not be reached (first failure, first answer after it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol

import httpx

from agentrl_cli.core.httpclient import http_client
from agentrl_cli.core.outcomes import Outcome, RewardStatus
from agentrl_cli.runtime.reward.models import RewardResult, ScoreRequest
from agentrl_cli.runtime.reward.scorer import Scorer
from agentrl_cli.core.security.keys import client_key


class RewardRequestError(ValueError):
    """The service rejected the request (4xx): the message names the fields."""


class RewardClient(Protocol):
    def score(self, req: ScoreRequest) -> RewardResult: ...
    def score_batch(self, reqs: list[ScoreRequest]) -> list[RewardResult]: ...
    async def ascore(self, req: ScoreRequest) -> RewardResult: ...
    def close(self) -> None: ...


class LocalRewardClient:
    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    def score(self, req: ScoreRequest) -> RewardResult:
        return self.scorer.score(req)

    def score_batch(self, reqs: list[ScoreRequest]) -> list[RewardResult]:
        return self.scorer.score_batch(reqs)

    async def ascore(self, req: ScoreRequest) -> RewardResult:
        return await asyncio.to_thread(self.scorer.score, req)

    def close(self) -> None:
        self.scorer.close()


def _unreachable(req: ScoreRequest, why: str, attempts: int) -> RewardResult:
    return RewardResult(trajectory_id=req.trajectory_id, reward=0.0, components={}, status=RewardStatus.INFRA_ERROR, outcome=Outcome.ERROR,
                        verifier="service", verifier_versions={}, flags=["infra_error", "reward_service_unreachable"],
                        detail=why, attempts=attempts)


class HttpRewardClient:
    """`api_key`: the bearer key the service requires (`reward.api_key`'s current key), or None."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_retries: int = 2, backoff_s: float = 0.1,
                 api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self._client = http_client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
        self.counters = {"retries": 0, "unreachable": 0}
        self.outages: list[dict] = []  # {"start", "end" (time.monotonic(); None while it lasts), "failures"}
        self._lock = threading.Lock()  # calls come from several threads (ascore)

    def _outage(self, failed: bool) -> None:
        with self._lock:
            ongoing = bool(self.outages) and self.outages[-1]["end"] is None
            if failed:
                if not ongoing:
                    self.outages.append({"start": time.monotonic(), "end": None, "failures": 0})
                self.outages[-1]["failures"] += 1
            elif ongoing:
                self.outages[-1]["end"] = time.monotonic()

    def _rejected(self, r: httpx.Response) -> RewardRequestError:
        if r.status_code == 401:
            return RewardRequestError(f"reward service {self.url} refused this client's key (401): set reward.api_key "
                                      "(AGENTRL_REWARD__API_KEY_FILE or AGENTRL_REWARD__API_KEY) to a key the service holds")
        try:
            body = r.json()
            fields = "; ".join(f"{f['field']}: {f['problem']}" for f in body.get("fields", []))
            return RewardRequestError(f"reward service rejected the request ({r.status_code}): {fields or body}")
        except ValueError:
            return RewardRequestError(f"reward service rejected the request ({r.status_code}): {r.text[:200]}")

    def _post(self, path: str, payload: dict):
        """(response json, None) or (None, why) after bounded retries."""
        why = ""
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client.post(self.url + path, json=payload)
            except httpx.TimeoutException as exc:
                why = f"no answer within {self.timeout_s:g} s (reward.timeout_s + 5 s for the trip): {type(exc).__name__}"
                self._outage(failed=True)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
                self._outage(failed=True)
            else:
                self._outage(failed=r.status_code >= 500)
                if r.status_code < 400:
                    return r.json(), None
                if r.status_code < 500:
                    raise self._rejected(r)
                why = f"HTTP {r.status_code}: {r.text[:200]}"
            if attempt < self.max_retries:
                self.counters["retries"] += 1
                time.sleep(self.backoff_s * 2 ** attempt)
        self.counters["unreachable"] += 1
        return None, f"reward service {self.url} failed after {self.max_retries + 1} attempts: {why}"

    def score(self, req: ScoreRequest) -> RewardResult:
        body, why = self._post("/score", req.model_dump(mode="json"))
        return RewardResult.model_validate(body) if body is not None else _unreachable(req, why, self.max_retries + 1)

    def score_batch(self, reqs: list[ScoreRequest]) -> list[RewardResult]:
        body, why = self._post("/score_batch", {"items": [r.model_dump(mode="json") for r in reqs]})
        if body is None:
            return [_unreachable(r, why, self.max_retries + 1) for r in reqs]
        return [RewardResult.model_validate(x) for x in body["results"]]

    async def ascore(self, req: ScoreRequest) -> RewardResult:
        return await asyncio.to_thread(self.score, req)

    def close(self) -> None:
        self._client.close()


def reward_client(config, provider=None) -> RewardClient:
    """The HTTP client when reward.service_url is set, else a scorer in this process."""
    r = config.reward
    if r.service_url:
        return HttpRewardClient(r.service_url, timeout_s=r.timeout_s + 5.0, max_retries=r.max_retries,
                                api_key=client_key(r.api_key))
    return LocalRewardClient(Scorer.from_config(config, provider))
