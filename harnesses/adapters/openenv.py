"""The `openenv` harness: any OpenEnv environment (the `openenv` package's reset/step/state
protocol) presented to training through the harness contract.

Config, one of:

    harnesses:
      - name: openenv
        options: {url: "http://127.0.0.1:8000"}          # a running OpenEnv server
      - name: openenv
        options: {env: "my_pkg.server:MyEnvironment",     # started on loopback, in this process,
                  action: "my_pkg.models:MyAction"}       #   with the package's own server code

With neither, the default is `harnesses.adapters.openenv_example:BriefReplyEnvironment`. Every
instance holds one WebSocket session (the package's GenericEnvClient, or its MCPToolClient for an
MCP environment); an `env:` server is the instance's own and stops with `close()`.

Options (OpenEnvOptions below): `url` | `env` (+ `action`, `observation` `module:Class`, inferred
from the class when left out); `text_field` (a plain-text reply becomes that field of the action;
then no plain text is malformed, so stage 5's invalid-action check fails by design);
`tasks` (N), `prompt`, `system`; `episode_reward` (`last`: the last reward the server reported,
the default, as most environments score the outcome at the end; `sum`: the episode's return);
`reward_range` [lo, hi] (the episode reward is mapped to (r - lo) / (hi - lo); one outside the
range is an error, never clipped; an episode the server gave no reward scores 0); `max_sessions`,
`start_timeout_s`, `message_timeout_s`.

Tasks: OpenEnv environments have no task list, so `task_set(options)` makes N train and N eval
tasks (`openenv/train/<seed>`, seeds 0..N-1; eval seeds 10000+i): the prompt is `options.prompt`,
the seed goes to the server's reset (an environment that takes no seed ignores it). The first
observation is the prompt followed by the environment's reset observation (`openenv_actions.render`).
How a model turn becomes an action and how tools are offered: `openenv_actions`.

Capacity: a server holds a limited number of sessions (`create_app`'s default: one). A refusal at
capacity (`CAPACITY_REACHED`; HTTP 429, or 503 with Retry-After) closes this instance's session and
raises `EnvironmentBusy` naming the limit: the run waits and caps its instances at it (backpressure,
never a harness error). `capacity(want)` tells stage 5 the limit before the run.

Reward: the harness scores itself (`reward_source = "harness"`) from the rewards the server sent.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields

from agentrl_cli.core.errors import ConfigError, EnvironmentBusy
from harnesses.adapters import openenv_actions as wire
from harnesses.base import Action, Evidence, Observation, TaskSet, TaskSpec, ToolCall, ToolCallResult, Trajectory
from harnesses.defaults import default_evidence
from harnesses.sandboxed import worst

PROBE_SESSIONS = 16  # capacity(want) opens at most this many sessions to find the server's limit
DEFAULT_ENV = "harnesses.adapters.openenv_example:BriefReplyEnvironment"
DEFAULT_PROMPT = ("Act in the environment until it says the episode is over. Its observations are JSON; "
                  "send each action as a tool call.")
SYSTEM = """You act in an environment. Each turn, send one action with a tool call:
<tool_call>
{{"name": "{tool}", "arguments": {{...}}}}
</tool_call>
or reply with the action's fields as one JSON object.{plain} Each observation comes back as JSON."""


@dataclass
class OpenEnvOptions:
    """`harnesses[].options` of the openenv harness, checked."""

    url: str | None = None
    env: str | None = None
    action: str | None = None
    observation: str | None = None
    text_field: str | None = None
    tasks: int = 8
    prompt: str = DEFAULT_PROMPT
    system: str | None = None
    episode_reward: str = "last"
    reward_range: list = field(default_factory=lambda: [0.0, 1.0])
    max_sessions: int = 8
    start_timeout_s: float = 30.0
    message_timeout_s: float = 60.0

    @classmethod
    def parse(cls, options: dict) -> "OpenEnvOptions":
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"harnesses[openenv].options: unknown {', '.join(unknown)}", f"known options: {', '.join(known)}")
        o = cls(**options)
        if o.url and o.env:
            raise ConfigError("harnesses[openenv].options: both url and env are set",
                              "set url for a running server, or env to start one, not both")
        if not o.url and not o.env:
            o.env = DEFAULT_ENV
        if o.url is not None and not str(o.url).startswith(("http://", "https://", "ws://", "wss://")):
            raise ConfigError(f"harnesses[openenv].options.url must be an http(s) or ws(s) URL, got {o.url!r}",
                              "e.g. url: http://127.0.0.1:8000")
        if o.episode_reward not in ("last", "sum"):
            raise ConfigError(f"harnesses[openenv].options.episode_reward must be last or sum, got {o.episode_reward!r}",
                              "last: the final reward the server reported; sum: the episode's return")
        if not (isinstance(o.tasks, int) and 1 <= o.tasks <= 100_000):
            raise ConfigError(f"harnesses[openenv].options.tasks must be an integer from 1 to 100000, got {o.tasks!r}",
                              "e.g. tasks: 16")
        r = o.reward_range
        if not (isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, (int, float)) for x in r) and r[0] < r[1]):
            raise ConfigError(f"harnesses[openenv].options.reward_range must be [lo, hi] with lo < hi, got {r!r}",
                              "set it to the range the environment's rewards lie in, e.g. [-1, 1]")
        o.reward_range = [float(r[0]), float(r[1])]
        return o


class OpenEnvHarness:
    name = "openenv"
    version = "1"
    reward_source = "harness"
    reward_sources = ("harness",)  # the rewards are the server's; no agentrl verifier knows the environment
    step_rewards = True  # each step's observation carries the server's reward as info["reward"]

    def __init__(self, **options) -> None:
        self.options = OpenEnvOptions.parse(options)
        self._service = None  # openenv_local.LocalServer when this instance started the environment
        self._client = None  # the package's sync client, one WebSocket session
        self._schema: dict | None = None
        self._tools: list[dict] = []
        self._mcp_names: set[str] = set()
        self._episode = False
        self._http = ""  # the server's http(s) base URL, once connected

    # -- the optional hooks ---------------------------------------------------------------------------
    @classmethod
    def task_set(cls, options: dict) -> TaskSet:
        o = OpenEnvOptions.parse(dict(options or {}))
        seeds = [("train", i) for i in range(o.tasks)] + [("eval", 10_000 + i) for i in range(o.tasks)]
        tasks = tuple(TaskSpec(task_id=f"openenv/{split}/{seed}", harness=cls.name, prompt=o.prompt, answer=None,
                               difficulty=1, split=split, meta={"seed": seed, "verify": "harness"}) for split, seed in seeds)
        digest = hashlib.sha256(json.dumps([o.url, o.env, o.prompt, o.tasks]).encode()).hexdigest()[:12]
        return TaskSet(f"openenv-synthetic-1:{digest}", tasks)

    def system_prompt(self) -> str:
        self._connect()
        if self.options.system is not None:
            return self.options.system
        tool = sorted(self._mcp_names)[0] if self._mcp_names else wire.STEP_TOOL
        plain = f" A plain-text reply is sent as the action's `{self.options.text_field}`." if self.options.text_field else ""
        return SYSTEM.format(tool=tool, plain=plain)

    def tools(self) -> list[dict]:
        self._connect()
        return list(self._tools)

    # -- contract ---------------------------------------------------------------------------------
    def reset(self, task_spec: TaskSpec) -> Observation:
        self._connect()
        self._episode = False
        seed = task_spec.meta.get("seed")
        result = self._refused_at_capacity(lambda: self._client.reset(**({"seed": int(seed)} if isinstance(seed, int)
                                                                           and seed >= 0 else {})))
        self._episode = True
        obs = _as_dict(result.observation)
        return Observation(text=f"{task_spec.prompt}\n\n{wire.render(obs)}", data=obs, done=False,
                           info={"openenv_rewards": [], "reset_done": bool(result.done)})

    def step(self, action: Action) -> Observation:
        if not self._episode:
            return Observation(text="no episode is running: reset first", status="invalid_action", done=True)
        calls, errors = wire.planned_calls(action, self.options.text_field)
        if not calls:
            return Observation(text="invalid action: " + "; ".join(errors), status="invalid_action",
                               info={"openenv_rewards": [], "parse_errors": errors})
        results, rewards, last, done = [], [], None, False
        for call in calls:
            outcome, obs, reward, done = self._send(call)
            results.append(outcome)
            if obs is not None:
                last = obs
                rewards.append(reward)
            if done:
                break
        self._episode = not done
        status = worst([r.status for r in results])
        text = "\n".join(r.output for r in results)
        return Observation(text=text, data=last, done=done, status=status, calls=results,
                           info={"openenv_rewards": rewards, "reward": rewards[-1] if rewards else None,
                                 "parse_errors": errors})

    def compute_reward(self, trajectory: Trajectory) -> float:
        """The episode's reward in [0, 1]: `episode_reward` of the rewards the server reported
        (last or sum; none reported: 0), mapped from `reward_range`."""
        reported = [float(r) for o in trajectory.observations[1:] for r in (o.info or {}).get("openenv_rewards", [])
                    if r is not None]
        if not reported:
            return 0.0
        raw = reported[-1] if self.options.episode_reward == "last" else sum(reported)
        lo, hi = self.options.reward_range
        if not lo <= raw <= hi:
            raise ConfigError(f"openenv episode reward {raw:g} ({self.options.episode_reward} of {reported}) lies outside "
                              f"reward_range [{lo:g}, {hi:g}]",
                              "set harnesses[openenv].options.reward_range to the range the environment's "
                              f"{'final rewards' if self.options.episode_reward == 'last' else 'returns'} lie in")
        return (raw - lo) / (hi - lo)

    def evidence(self, trajectory: Trajectory) -> Evidence:
        """agentrl's default (the final answer of the last action, no files): the server holds the state."""
        return default_evidence(trajectory)

    def capacity(self, want: int) -> int | None:
        """The sessions the server holds at once, if fewer than `want`: what its `/health` or
        `/metadata` says (`max_sessions` / `max_concurrent_envs`, where a server reports it; openenv
        0.10 does not), else learnt by opening up to `want` sessions (at most PROBE_SESSIONS: each
        builds an environment on the server) until one is refused (the refusal names the limit).
        None: that many sessions were accepted. Every probe session is closed."""
        self._connect()
        reported = self._reported_capacity()
        want = min(want, PROBE_SESSIONS)
        if reported is not None or want <= 1:
            return reported
        from openenv.core import GenericEnvClient

        url = (self.options.url or self._service.url).rstrip("/")
        opened = []
        try:
            self._client.state()  # this instance's own session counts as the first
            for _ in range(want - 1):
                client = GenericEnvClient(base_url=url, message_timeout_s=self.options.message_timeout_s).sync()
                opened.append(client)
                try:
                    client.connect()
                    client.state()
                except RuntimeError as exc:
                    if wire.server_error_code(exc) != "CAPACITY_REACHED":
                        raise
                    return _capacity_named(str(exc)) or len(opened)
            return None
        finally:
            for client in opened:
                client.close()

    def full_reset(self) -> None:
        """Close the session (the server drops that environment instance); the next reset opens a new one."""
        self._disconnect()
        self._episode = False

    def close(self) -> None:
        self._episode = False
        try:
            self._disconnect()
        finally:
            if self._service is not None:
                service, self._service = self._service, None
                service.stop()

    # -- the connection ---------------------------------------------------------------------------
    def _connect(self) -> None:
        if self._client is not None:
            return
        import httpx
        from openenv.core import GenericEnvClient, MCPToolClient

        from harnesses.adapters import openenv_local

        o = self.options
        if o.url is None and self._service is None:
            self._service = openenv_local.start(o.env, o.action, o.observation, max_sessions=o.max_sessions,
                                                start_timeout_s=o.start_timeout_s)
        url = (o.url or self._service.url).rstrip("/")
        http = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        if o.url is not None:
            openenv_local.wait_healthy(http, o.start_timeout_s)
        self._http = http
        answer = httpx.get(f"{http}/schema", timeout=o.message_timeout_s, trust_env=False)
        _raise_if_busy(answer)
        self._schema = answer.raise_for_status().json()
        action_schema = self._schema.get("action") or {}
        mcp = wire.is_mcp_schema(action_schema)
        fields_ = sorted(set(action_schema.get("properties") or {}) - {"metadata"})
        if o.text_field is not None and (mcp or o.text_field not in fields_):
            raise ConfigError(f"harnesses[openenv].options.text_field {o.text_field!r} is not a field of the environment's "
                              f"action ({'an MCP call' if mcp else ', '.join(fields_) or 'no fields'})",
                              "set text_field to one of the action's string fields, or leave it out")
        client = (MCPToolClient if mcp else GenericEnvClient)(base_url=url, message_timeout_s=o.message_timeout_s).sync()
        try:
            try:
                client.connect()
            except ConnectionError as exc:  # a handshake answered 429, or 503 with Retry-After (a proxy at capacity)
                handshake = getattr(exc.__cause__, "response", None)
                if handshake is not None and hasattr(handshake, "status_code"):
                    _raise_if_busy(handshake)
                raise
            if mcp:
                found = self._refused_at_capacity(lambda: client.list_tools(use_cache=False), client)  # the package's MCP client, over the session's /mcp
                if not found:
                    raise ConnectionError(f"the MCP environment at {url} listed no tools (or listing them failed)")
                self._tools, self._mcp_names = [wire.mcp_tool(t) for t in found], {t.name for t in found}
            else:
                self._tools, self._mcp_names = [wire.step_tool(action_schema)], set()
        except BaseException:
            client.close()
            raise
        self._client = client

    def _refused_at_capacity(self, call, client=None):
        """`call()`; a refusal at capacity (CAPACITY_REACHED) closes this instance's session and
        raises EnvironmentBusy with the limit the server named, so the run waits instead of failing."""
        try:
            return call()
        except RuntimeError as exc:
            if wire.server_error_code(exc) != "CAPACITY_REACHED":
                raise
            if client is not None:
                client.close()
            self._disconnect()
            raise EnvironmentBusy(f"the OpenEnv server refused a session: {exc}", capacity=_capacity_named(str(exc))) from None

    def _reported_capacity(self) -> int | None:
        """`max_sessions` or `max_concurrent_envs` of the server's /health or /metadata, where it reports one."""
        import httpx

        for path in ("health", "metadata"):
            try:
                answer = httpx.get(f"{self._http}/{path}", timeout=self.options.message_timeout_s, trust_env=False).json()
            except (httpx.HTTPError, ValueError):
                continue
            for key in ("max_sessions", "max_concurrent_envs"):
                value = answer.get(key) if isinstance(answer, dict) else None
                if isinstance(value, int) and value >= 1:
                    return value
        return None

    def _disconnect(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    def _send(self, call: ToolCall) -> tuple[ToolCallResult, dict | None, float | None, bool]:
        """One call to the server: (its result, the observation, its reward, done)."""
        from openenv.core.env_server.mcp_types import CallToolAction

        known = self._mcp_names or {wire.STEP_TOOL}
        if call.name not in known:
            return ToolCallResult(name=call.name, arguments=call.arguments, status="invalid_action",
                                  output=f"unknown tool {call.name!r}; tools: {', '.join(sorted(known))}"), None, None, False
        payload = CallToolAction(tool_name=call.name, arguments=call.arguments) if self._mcp_names else call.arguments
        try:
            result = self._client.step(payload)
        except RuntimeError as exc:
            code = wire.server_error_code(exc)
            if code is None:
                raise
            status = "invalid_action" if code in ("VALIDATION_ERROR", "INVALID_JSON", "UNKNOWN_TYPE") else "error"
            return ToolCallResult(name=call.name, arguments=call.arguments, status=status,
                                  output=f"the environment refused the action: {exc}"), None, None, False
        obs = _as_dict(result.observation)
        status = _tool_error_status(obs)
        reward = None if result.reward is None else float(result.reward)
        return (ToolCallResult(name=call.name, arguments=call.arguments, status=status, output=wire.render(obs)),
                obs, reward, bool(result.done))


def _capacity_named(message: str) -> int | None:
    """The limit in OpenEnv's refusal ("Server at capacity: 1/1 sessions active. ..."), if it names one."""
    m = re.search(r"(\d+)/(\d+) sessions active", message)
    return int(m.group(2)) if m else None


def _raise_if_busy(answer) -> None:
    """An HTTP answer of 429, or 503 with Retry-After: the server is at capacity (EnvironmentBusy)."""
    retry = answer.headers.get("retry-after")
    if answer.status_code == 429 or (answer.status_code == 503 and retry is not None):
        try:
            wait = float(retry) if retry is not None else None
        except ValueError:
            wait = None
        raise EnvironmentBusy(f"the environment server answered HTTP {answer.status_code} (retry after {retry or '-'} s)",
                              retry_after_s=wait)


def _as_dict(observation) -> dict:
    if isinstance(observation, dict):
        return dict(observation)
    if hasattr(observation, "model_dump"):
        return observation.model_dump(mode="json", exclude={"reward", "done"})
    return {"value": observation}


def _tool_error_status(obs: dict) -> str:
    """An MCP call's own error (CallToolObservation.error) as a status; ok otherwise."""
    error = obs.get("error")
    if not isinstance(error, dict):
        return "ok"
    kind = error.get("error_type")
    return {"tool_not_found": "invalid_action", "invalid_args": "invalid_action", "timeout": "timeout"}.get(kind, "error")
