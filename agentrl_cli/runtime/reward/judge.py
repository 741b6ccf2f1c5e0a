"""The `judge` verifier: a model scores trajectories against a rubric through an OpenAI-compatible
`/v1/chat/completions` (the embedded server's, or any provider's; `reward.judge`).

- Prompt: versioned (`judge_prompt.py`): the rubric (`meta.rubric` or the default), the task, its
  reference answer when there is one, and each trajectory's actions and final answer.
- Verdict: the judge's 0-10 score becomes the outcome in [0, 1]; its reason goes into the detail.
  A reply without a usable verdict, HTTP errors, timeouts and a judge that cannot be reached raise
  `VerifierError`: the scorer retries, then marks the trajectory infra_error (masked, never a score).
- Cache: verdicts are kept by (judge model, prompt version, mode, hash of what the judge sees), so
  the same input never costs a second call (errors are never cached).
- Group mode (`verify_group`, or `reward.judge.mode: group` through `verify`): the trajectories of
  one GRPO group are ranked against each other in one call. They are shown in a canonical order (by
  content hash), so a shuffled group gets the same per-trajectory scores.
- Injections: a trajectory whose text addresses the judge is flagged `judge_injection` (and `tamper`,
  so the reward stays at or below zero) without being shown to the judge. Every call also carries a
  secret nonce the verdict must echo and a control candidate that asks for the full score; a judge
  that drops the nonce or obeys the control deviated: candidates that talk about judging are flagged
  `judge_injection`, the rest are judged again without them, and with no such candidate the judge
  itself is unreliable (`VerifierError`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import httpx

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.httpclient import http_client
from agentrl_cli.runtime.reward.judge_prompt import (CONTROL, CONTROL_MAX, MAX_SCORE, Candidate, ReplyError, candidate_of,
                                             injection_hits, mentions_judging, ordered, parse_reply, render, task_key)
from agentrl_cli.runtime.reward.models import ScoreRequest
from agentrl_cli.runtime.reward.verifiers import Verdict, VerifierError

INJECTION_FLAGS = ["judge_injection", "tamper"]
GROUP_ID = re.compile(r"^(.+-g\d+-\d+)-(\d+)$")  # the rollout's trajectory ids: RUN-PHASE-GROUP-INDEX


def judge_base_url(config) -> str:
    """`reward.judge.url`, else the run's own inference server's /v1."""
    judge = config.reward.judge
    if judge is not None and judge.url:
        return judge.url.rstrip("/")
    inf = config.inference
    base = inf.urls[0] if inf.urls else f"http://{inf.host}:{inf.port}"
    return f"{base.rstrip('/')}/v1"


def cache_key(model: str, prompt_version: str, mode: str, task: dict, digests: list[str]) -> str:
    """The judge cache's key: the judge model, the prompt version, the mode and what the judge is
    shown (the task as `judge_prompt.task_key` gives it, the candidates' content hashes as a set)."""
    blob = json.dumps([model, prompt_version, mode, task, sorted(set(digests))], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class _Slot:
    """The members of one GRPO group gathered for a group call (mode: group)."""

    reqs: dict[str, ScoreRequest] = field(default_factory=dict)
    skipped: int = 0  # members the screen flagged: they count towards a full group, never wait
    closed: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    verdicts: dict[str, Verdict | VerifierError] = field(default_factory=dict)
    error: str = ""


class JudgeVerifier:
    name = "judge"

    def __init__(self, config) -> None:
        from agentrl_cli.config.models import JudgeConfig

        r = config.reward
        self.cfg = judge = r.judge or JudgeConfig()
        budget = judge.timeout_s + (judge.group_wait_s if judge.mode == "group" else 0.0)
        if budget > r.timeout_s:
            raise ConfigError(f"reward.judge.timeout_s ({judge.timeout_s:g} s)"
                              + (f" plus reward.judge.group_wait_s ({judge.group_wait_s:g} s)" if judge.mode == "group" else "")
                              + f" exceed reward.timeout_s ({r.timeout_s:g} s), the scorer's deadline for one trajectory",
                              "raise reward.timeout_s or lower the judge's timeouts")
        self.version = f"p{judge.prompt_version}-{judge.mode}-{judge.model or 'served'}"
        self.base_url = judge_base_url(config)
        key = r.judge_api_key if (judge.url or r.judge_api_key is not None) else config.inference.api_key
        headers = {"Authorization": f"Bearer {key.get_secret_value().strip()}"} if key is not None else {}
        self._http = http_client(timeout=judge.timeout_s, headers=headers)
        self.group_size = config.rollout.group_size
        self.cache_size = r.cache_size
        self._cache: OrderedDict[str, dict[str, Verdict]] = OrderedDict()
        self._secret = secrets.token_bytes(32)  # the nonces' key: never leaves this process
        self._model: str | None = judge.model
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: dict[tuple[str, str], _Slot] = {}
        self.calls = 0  # judge HTTP calls made (a cache hit makes none)

    def close(self) -> None:
        self._http.close()

    # ---- the public verifier ---------------------------------------------------------------------

    def verify(self, req: ScoreRequest) -> Verdict:
        if self.cfg.mode == "group" and self.group_size > 1 and GROUP_ID.match(req.trajectory_id):
            return self._gathered(req)
        return self.verify_group([req], mode="single")[0]

    def verify_group(self, reqs: list[ScoreRequest], mode: str = "group") -> list[Verdict]:
        """One verdict per request, in order (the requests must be attempts at one task); raises the
        `VerifierError` of a member that could not be judged (`judge_group` gives them one by one)."""
        out = self.judge_group(reqs, mode)
        for v in out:
            if isinstance(v, VerifierError):
                raise v
        return out

    def judge_group(self, reqs: list[ScoreRequest], mode: str = "group") -> list[Verdict | VerifierError]:
        """Per request: its verdict, or why it could not be judged (e.g. the judge obeyed the control
        after an injected sibling was taken out: the injector is flagged, the rest are not judged)."""
        if not reqs:
            return []
        task = task_key(reqs[0])
        if any(task_key(r) != task for r in reqs[1:]):
            raise VerifierError("a judge group needs attempts at one task; these requests hold different tasks")
        cands = [candidate_of(r) for r in reqs]
        by_digest = self._judge(task, cands, mode)
        return [v if isinstance(v, VerifierError) else _copy(v) for v in (by_digest[c.digest] for c in cands)]

    # ---- judging ---------------------------------------------------------------------------------

    def _judge(self, task: dict, cands: list[Candidate], mode: str, retry: bool = True) -> dict[str, Verdict | VerifierError]:
        unique = list({c.digest: c for c in cands}.values())
        out: dict[str, Verdict | VerifierError] = {}
        clean = []
        for c in unique:
            hits = injection_hits(c)
            if hits:
                out[c.digest] = Verdict(0.0, list(INJECTION_FLAGS), f"instructions aimed at the judge: {hits}; not judged")
            else:
                clean.append(c)
        if not clean:
            return out
        model = self._served_model()
        key = cache_key(model, self.cfg.prompt_version, mode, task, [c.digest for c in clean])
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        if hit is None:
            hit = self._call_and_check(task, clean, mode, model, key, retry)
            if self.cache_size > 0 and not any(isinstance(v, VerifierError) for v in hit.values()):
                with self._lock:
                    self._cache[key] = hit
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return {**out, **hit}

    def _call_and_check(self, task, clean: list[Candidate], mode: str, model: str, key: str,
                        retry: bool) -> dict[str, Verdict | VerifierError]:
        shown = ordered(clean)
        ids = [f"C{i}" for i in range(1, len(shown) + 1)]
        nonce = hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()[:24]
        text = self._complete(render(self.cfg.prompt_version, mode, task, shown, nonce), model)
        try:
            reply = parse_reply(text, nonce, ids)
        except ReplyError as exc:
            raise VerifierError(f"judge {model}: {exc}") from None
        control = reply.scores[ids[shown.index(CONTROL)]]
        deviated = ("its verdict lacks this call's canary" if not reply.canary_ok else
                    f"it gave the control candidate {control * MAX_SCORE:g}/{MAX_SCORE}" if control > CONTROL_MAX else "")
        if not deviated:
            where = f"judge {model} (prompt v{self.cfg.prompt_version}, {mode})"
            return {c.digest: Verdict(reply.scores[i], [], f"{where}: {reply.scores[i] * MAX_SCORE:g}/{MAX_SCORE}: {reply.reasons[i]}")
                    for i, c in zip(ids, shown) if c is not CONTROL}
        suspects = [c for c in clean if mentions_judging(c)]
        if not suspects or not retry:
            raise VerifierError(f"judge {model} deviated from its instructions ({deviated})"
                                + ("" if suspects else " and no candidate mentions judging: the judge is unreliable"))
        out: dict[str, Verdict | VerifierError] = {
            c.digest: Verdict(0.0, list(INJECTION_FLAGS), f"the judge deviated ({deviated}) while shown this candidate, "
                              "which talks about judging") for c in suspects}
        rest = [c for c in clean if c not in suspects]
        if rest:  # judged again without the suspects; deviating again, the judge itself is unreliable
            try:
                out.update(self._judge(task, rest, mode, retry=False))
            except VerifierError as exc:
                out.update({c.digest: exc for c in rest})
        return out

    def _complete(self, messages: list[dict], model: str) -> str:
        url = f"{self.base_url}/chat/completions"
        body = {"model": model, "messages": messages, "max_tokens": self.cfg.max_tokens, "temperature": 0.0}
        with self._lock:
            self.calls += 1
        try:
            resp = self._http.post(url, json=body)
        except httpx.TimeoutException:
            raise VerifierError(f"judge at {url} did not answer within reward.judge.timeout_s="
                                f"{self.cfg.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise VerifierError(f"judge at {url} unreachable: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise VerifierError(f"judge at {url} answered HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise VerifierError(f"judge at {url} sent no chat completion: {resp.text[:200]}") from None
        if not isinstance(content, str):
            raise VerifierError(f"judge at {url} sent no text content (a tool call?)")
        return content

    def _served_model(self) -> str:
        if self._model is None:
            url = f"{self.base_url}/models"
            try:
                resp = self._http.get(url)
            except httpx.HTTPError as exc:
                raise VerifierError(f"judge at {url} unreachable: {type(exc).__name__}: {exc}") from None
            try:
                resp.raise_for_status()
                self._model = str(resp.json()["data"][0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise VerifierError(f"reward.judge.model is unset and {url} names no model "
                                    f"({type(exc).__name__}: {exc}); set reward.judge.model") from None
        return self._model

    # ---- group mode through verify(): siblings gathered by their group id --------------------------

    def _gathered(self, req: ScoreRequest) -> Verdict:
        group = (GROUP_ID.match(req.trajectory_id).group(1), req.task.task_id)
        if injection_hits(candidate_of(req)):  # flagged whatever the group: it never waits, and counts towards a group already waiting
            with self._cond:
                slot = self._pending.get(group)
                if slot is not None:
                    slot.skipped += 1
                    self._cond.notify_all()
            return self.verify_group([req])[0]
        with self._cond:
            slot = self._pending.get(group)
            if slot is None:
                slot = self._pending[group] = _Slot()
            slot.reqs[req.trajectory_id] = req

            def full() -> bool:
                return len(slot.reqs) + slot.skipped >= self.group_size

            if full():
                self._cond.notify_all()
            self._cond.wait_for(lambda: slot.closed or full(), self.cfg.group_wait_s)
            lead = not slot.closed  # the first to see the group full, or its wait end, judges what arrived
            if lead:
                slot.closed = True
                self._pending.pop(group, None)
        if lead:
            members = list(slot.reqs.values())
            try:
                slot.verdicts = dict(zip([r.trajectory_id for r in members], self.judge_group(members)))
            except VerifierError as exc:
                slot.error = str(exc)
            finally:
                slot.done.set()
        elif not slot.done.wait(self.cfg.timeout_s * 2 + 1):
            raise VerifierError(f"the group call for {group[0]} did not finish")
        if slot.error:
            raise VerifierError(slot.error)
        verdict = slot.verdicts[req.trajectory_id]
        if isinstance(verdict, VerifierError):
            raise VerifierError(str(verdict))
        return _copy(verdict)


def _copy(v: Verdict) -> Verdict:
    return Verdict(v.score, list(v.flags), v.detail, v.harness)
