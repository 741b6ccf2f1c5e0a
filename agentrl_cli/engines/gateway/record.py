"""What a gateway session records, and the bridge to training: every chat call's exact ids, stitched
into token-exact segments, each segment one training sample.

Per call: the ids it was generated from (`splice.Plan.sent`), and per choice the generated ids,
their log-probs and the weight version, as the inference servers returned them; never a
re-tokenization of text. A call whose ids extend a segment's ids + the generated ids of one of its
last call's choices continues that segment: the new ids between are appended with loss mask 0 (the
closing of the assistant turn, tool results, the next generation prompt), then the call's own
generated ids with loss mask 1 and their log-probs. Any other call starts a new segment and, unless
it is the session's first, is counted as `non_prefix_calls` (the agent rewrote its history). A tool
call the model wrote that the parser refused (`ChatCall.rejected`: not JSON, not an offered tool,
never closed) is counted as `malformed_tool_calls` and named on its step.

A call with n > 1 choices forks: the choice the next call continues stays in the segment, every
other choice is a segment of its own (the shared prefix with loss mask 0), and a segment whose last
call was never continued keeps its first choice.

`SessionRecord` is what the rollout needs from a finished session: per segment the token ids, loss
mask, log-probs (0.0 off the generated ids, as `runtime/rollout/turns.py` writes them), the weight
version of each call, the calls as steps (each call one step: the assistant's text and tool calls as the
action, the tool/user messages the next call added as the observation), and the rewards posted.

Not here: choosing the ids (`splice.py`), sessions and keys (`sessions.py`), HTTP (`app.py`).
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from agentrl_cli.core.episode import Action, ToolCall
from agentrl_cli.engines.gateway.splice import LastCall, Plan, context_key, norm_message
from agentrl_cli.engines.openai_api.parse import UNCLOSED

# aborted_calls: streamed calls whose client went away mid-stream (generation aborted, nothing recorded);
# malformed_tool_calls: tool calls the model wrote that the parser refused
COUNTERS = ("calls", "non_prefix_calls", "spliced_calls", "rerender_exact_calls", "rerender_mismatch_calls", "forks",
            "aborted_calls", "malformed_tool_calls")


@dataclass
class Step:
    """One chat call (one choice of it) as a step of the stored trajectory."""

    call_id: str  # the id the call was served under (chatcmpl-..., a Responses resp_...)
    index: int  # the call's position in its session, from 0
    choice: int  # the choice's index in the response
    action_text: str  # the assistant's content as returned
    tool_calls: list[dict]  # [{"id", "name", "arguments"}] as returned (arguments: the JSON string)
    observation: list[dict]  # the messages the next call of this segment added after this turn; [] for the last
    prompt_tokens: int
    completion_tokens: int
    weight_version: str
    finish_reason: str
    spliced: bool  # the prompt spliced the earlier generated ids in (splice.py), not the template's re-render
    reward: float | None = None  # a per-call reward posted for this call
    malformed_tool_calls: list[str] = field(default_factory=list)  # why each tool call the model wrote was refused

    def action(self) -> Action:
        """The step's action in the episode vocabulary (arguments that are not a JSON object are kept
        as {"_raw": text})."""
        calls = []
        for c in self.tool_calls:
            try:
                arguments = json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
            except ValueError:
                arguments = None
            calls.append(ToolCall(name=c["name"], arguments=arguments if isinstance(arguments, dict)
                                  else {"_raw": c["arguments"]}, id=c.get("id", "")))
        return Action(text=self.action_text, tool_calls=calls)

    def observation_text(self) -> str:
        """The next observation as text: the content of the messages that followed, one per line."""
        return "\n".join(str(m.get("content") or "") for m in self.observation if isinstance(m, dict))


@dataclass
class Segment:
    """One token-exact training sample: the ids the model was given and generated, in order."""

    token_ids: list[int]
    loss_mask: list[int]  # 1 on generated ids only
    logprobs: list[float]  # the sampled log-probs on generated ids, 0.0 elsewhere
    weight_versions: list[str]  # per call
    calls: list[Step]  # per call, in order: each one step of the stored trajectory
    messages: list[dict]  # the first call's messages (the initial observation)
    tools: list[dict] | None


@dataclass
class Rewards:
    episode: float | None = None  # POST /sessions/{id}/reward {"reward": x}
    calls: dict[str, float] = field(default_factory=dict)  # {"call_id": ..., "reward": x}, by call id


@dataclass
class SessionRecord:
    """A session as the rollout takes it (`Recorder.snapshot`)."""

    session_id: str
    segments: list[Segment]
    rewards: Rewards
    counters: dict[str, int]  # COUNTERS for this session
    meta: dict = field(default_factory=dict)  # what POST /sessions was given as "meta" (e.g. the task id)

    def to_dict(self) -> dict:
        """JSON-ready (non-finite log-probs become None); `from_dict` reads it back."""
        data = asdict(self)
        for seg in data["segments"]:
            seg["logprobs"] = [v if math.isfinite(v) else None for v in seg["logprobs"]]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "SessionRecord":
        """A record from `to_dict`'s JSON (GET or DELETE /sessions/{id} of a gateway in another process)."""
        segments = [Segment(**{**seg, "logprobs": [float("nan") if v is None else float(v) for v in seg["logprobs"]],
                               "calls": [Step(**c) for c in seg["calls"]]}) for seg in data["segments"]]
        rewards = Rewards(**data.get("rewards") or {})
        return cls(data["session_id"], segments, rewards, dict(data.get("counters") or {}), dict(data.get("meta") or {}))


@dataclass
class _Open:
    """A segment still growing: its ids up to its last call's prompt, and that call's open choices."""

    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    steps: list[Step]
    versions: list[str]
    messages: list[dict]
    tools: list[dict] | None
    last: LastCall
    pending: list[Step]  # the Step of each open choice (parallel to last.choices)
    last_messages: list[dict]  # the last call's messages as sent (a fork's initial observation)


def malformed(call, choice: int, finish_reason: str) -> list[str]:
    """Why each tool call the model wrote in `choice` was refused by the parser (openai_api/parse.py);
    a block cut off by the length limit is the limit's doing, not a malformed call."""
    rejected = call.rejected[choice] if choice < len(getattr(call, "rejected", None) or ()) else []
    return [r for r in rejected if not (r == UNCLOSED and finish_reason == "length")]


def _step(call, index: int, choice: int, completion, prompt_tokens: int, spliced: bool) -> Step:
    message = (call.response.get("choices") or [{}] * (choice + 1))[choice].get("message") or {}
    calls = [{"id": c.get("id", ""), "name": (c.get("function") or {}).get("name", ""),
              "arguments": (c.get("function") or {}).get("arguments", "")} for c in message.get("tool_calls") or []]
    finish = str(completion.finish_reason)
    return Step(call_id=str(call.response.get("id", "")), index=index, choice=choice,
                action_text=message.get("content") or "", tool_calls=calls, observation=[],
                prompt_tokens=prompt_tokens, completion_tokens=len(completion.output_ids),
                weight_version=str(completion.weight_version), finish_reason=finish, spliced=spliced,
                malformed_tool_calls=malformed(call, choice, finish))


class Recorder:
    """One session's calls, stitched. Not thread-safe: used from the gateway's event loop."""

    def __init__(self) -> None:
        self.opens: list[_Open] = []
        self.counters: Counter = Counter({k: 0 for k in COUNTERS})
        self.rewards = Rewards()

    def tips(self) -> list[_Open]:
        """The open segments, newest first (what `splice.plan_call` matches a call against)."""
        return list(reversed(self.opens))

    def call_ids(self) -> set[str]:
        return {s.call_id for o in self.opens for s in o.steps + o.pending}

    def record(self, call, sent: list[int], rendered: list[int], plan: Plan) -> None:
        """Add a finished call: `sent` the ids it was generated from, `rendered` the template's render
        of its messages, `plan` what it continues. Its choices come from `call.choices`."""
        index = self.counters["calls"]
        self.counters["calls"] += 1
        self.counters["spliced_calls"] += plan.spliced
        if plan.rerender_exact is not None:
            self.counters["rerender_exact_calls" if plan.rerender_exact else "rerender_mismatch_calls"] += 1
        body = call.request
        last = LastCall(messages=[norm_message(m) for m in body.get("messages") or []], context=context_key(body),
                        rendered=list(rendered), replies=[norm_message((c.get("message") or {}))
                                                          for c in call.response.get("choices") or []],
                        choices=list(call.choices), indices=list(range(len(call.choices))))
        pending = [_step(call, index, i, c, len(sent), plan.spliced) for i, c in enumerate(call.choices)]
        self.counters["malformed_tool_calls"] += sum(len(s.malformed_tool_calls) for s in pending)
        messages = copy.deepcopy(list(body.get("messages") or []))
        seg, pos = self._continued(sent, plan)
        if seg is None:
            if self.opens:
                self.counters["non_prefix_calls"] += 1
            self.opens.append(_Open(list(sent), [0] * len(sent), [0.0] * len(sent), [], [], messages,
                                    body.get("tools") or None, last, pending, messages))
            return
        self._commit(seg, pos, observation=plan.observation if seg is plan.tip else messages[len(seg.last.messages) + 1:])
        seg.ids += sent[len(seg.ids):]
        grown = len(sent) - len(seg.mask)
        seg.mask += [0] * grown
        seg.logprobs += [0.0] * grown
        seg.last, seg.pending, seg.last_messages = last, pending, messages

    def _continued(self, sent: list[int], plan: Plan) -> tuple[_Open | None, int]:
        """The open segment and choice position whose ids + generated ids `sent` extends."""
        candidates = ([(plan.tip, plan.choice)] if plan.tip is not None else []) + \
                     [(o, p) for o in self.tips() for p in range(len(o.last.choices))]
        for seg, pos in candidates:
            if seg not in self.opens:
                continue
            history = seg.ids + list(seg.last.choices[pos].output_ids)
            if len(sent) > len(history) and sent[:len(history)] == history:
                return seg, pos
        return None, 0

    def _commit(self, seg: _Open, pos: int, observation: list[dict]) -> None:
        """Append the last call's choice at `pos` to `seg`; every other open choice forks."""
        for other in range(len(seg.last.choices)):
            if other != pos:
                self.opens.append(self._fork(seg, other))
                self.counters["forks"] += 1
        completion, step = seg.last.choices[pos], seg.pending[pos]
        step.observation = copy.deepcopy(observation)
        _append(seg, completion, step)

    @staticmethod
    def _fork(seg: _Open, pos: int) -> _Open:
        """A segment of the choice at `pos` alone: `seg`'s ids with loss mask 0, then that choice."""
        last = LastCall(seg.last.messages, seg.last.context, seg.last.rendered, [seg.last.replies[pos]],
                        [seg.last.choices[pos]], [seg.last.indices[pos]])
        return _Open(list(seg.ids), [0] * len(seg.ids), [0.0] * len(seg.ids), [], [], copy.deepcopy(seg.last_messages),
                     seg.tools, last, [seg.pending[pos]], seg.last_messages)

    def snapshot(self, session_id: str, meta: dict | None = None) -> SessionRecord:
        """The session so far as training takes it; a segment's open last call contributes its first
        choice, each other choice is a segment of its own. Nothing is changed."""
        segments = []
        for seg in self.opens:
            for pos in range(len(seg.last.choices)):
                view = copy.deepcopy(seg) if pos == 0 else self._fork(copy.deepcopy(seg), pos)
                _append(view, view.last.choices[0], view.pending[0])  # a fork holds its one choice first
                for step in view.steps:
                    step.reward = self.rewards.calls.get(step.call_id)
                segments.append(Segment(token_ids=view.ids, loss_mask=view.mask, logprobs=view.logprobs,
                                        weight_versions=view.versions, calls=view.steps, messages=view.messages,
                                        tools=view.tools))
        return SessionRecord(session_id, segments, copy.deepcopy(self.rewards), dict(self.counters), dict(meta or {}))


def _append(seg: _Open, completion, step: Step) -> None:
    out = list(completion.output_ids)
    seg.ids += out
    seg.mask += [1] * len(out)
    seg.logprobs += [float(v) for v in completion.output_logprobs]
    seg.versions.append(str(completion.weight_version))
    seg.steps.append(step)
