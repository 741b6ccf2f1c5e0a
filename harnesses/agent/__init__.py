"""The `agent` harness: train an agent that already exists and talks to a model through the OpenAI
chat API (the openai SDK, LangGraph, the OpenAI Agents SDK, a CLI agent), unchanged. Each episode
the run opens a session on its recording gateway and hands the agent that session as an OpenAI base
URL and key; every chat call the agent makes is recorded token-exact and becomes the episode's
training data (`agentrl_cli.runtime.rollout.agent_episode`).

    harnesses:
      - name: agent
        options: {entry: "my_agent:run"}              # async def run(task, client_base_url, api_key) -> str | dict
      - name: agent
        options: {command: "python3 agent.py", files: [agent.py]}   # in a sandbox; final answer: stdout's last line
      - name: agent
        options: {entry: "my_agent:run", sandbox: true}  # def run(task, base_url, api_key, sandbox): its tools in a sandbox

Options (`harnesses[].options`, checked at load):
  entry      "module:function", called on a private event loop in the rollout's harness thread
  sandbox    true: the entry also gets the episode's sandbox (from the harness's pool) as `sandbox`,
             to run its tools in (`sandbox.exec(command)`; `harnesses.agent.sandbox_env` adapts it to
             mini-swe-agent's environment); the agent itself runs on the host (entry only)
  command    a command run by bash in a bubblewrap sandbox that reaches the run's gateway and nothing
             else, with OPENAI_BASE_URL, OPENAI_API_KEY, AGENT_TASK (JSON) set and the prompt on stdin
  files      host files or directories copied into the sandbox's work directory (command only)
  collect    work-directory files read back after the command, as evidence for the verifier
  tasks      a shipped task set, `basic` (default) or `brief` (`harnesses.agent.tasks`), or `harbor`:
             the shipped Harbor tasks, worked on in the agent's sandbox (a command's, or a
             `sandbox: true` entry's) and graded by their own tests (`reward: harness`; `harnesses.agent.harbor_tasks`);
             `harnesses[].tasks` (a file) replaces it
  timeout_s  the agent's deadline per episode (default 300)
With neither entry nor command, `harnesses.agent.default_agent` runs (one call, its reply the answer).

The task the agent gets is a plain dict: task_id, prompt, split, difficulty, meta (never the
answer). Reward (`harnesses[].reward`): `verifiers` (default) scores the agent's final answer with
the task's verifier; `harness` takes the reward the agent or its environment posted to
`POST /sessions/{id}/reward` (the task dict then carries `reward_url` and `reward_key`, a command's
environment AGENTRL_REWARD_URL and AGENTRL_REWARD_KEY: the gateway's admin key, given only then).

The harness plays its own episodes (`plays_itself`) and needs the run's gateway (`needs_gateway`);
`reset` and `step` exist for the contract checks: `step` answers every action `invalid_action`.
"""

from __future__ import annotations

from dataclasses import replace

from agentrl_cli.core.episode import Evidence, HarnessReward, Observation, TaskSet, Trajectory
from agentrl_cli.core.errors import ConfigError
from harnesses.agent import harbor_tasks
from harnesses.agent import tasks as shipped
from harnesses.agent.runners import AgentFailed, AgentOutcome, CommandRunner, EntryRunner, task_dict

DEFAULT_ENTRY = "harnesses.agent.default_agent:run"
OPTIONS = ("entry", "command", "files", "collect", "tasks", "timeout_s", "sandbox")
STEP_REFUSAL = ("the agent harness takes no actions from the rollout: its own agent plays each episode through the "
                "run's gateway")


def check_options(options: dict) -> None:
    """ConfigError naming what is wrong with `harnesses[].options` of an agent harness."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"agent harness: unknown option(s) {', '.join(unknown)}; it takes {', '.join(OPTIONS)}",
                          "fix harnesses[].options (see harnesses/agent/__init__.py)")
    if options.get("entry") and options.get("command"):
        raise ConfigError("agent harness: options.entry and options.command are both set",
                          "give one: entry (a Python function) or command (run in a sandbox)")
    if not isinstance(options.get("sandbox", False), bool):
        raise ConfigError(f"agent harness: options.sandbox must be true or false, got {options.get('sandbox')!r}",
                          "set harnesses[].options.sandbox: true to hand an entry agent the episode's sandbox")
    if options.get("sandbox") and options.get("command"):
        raise ConfigError("agent harness: options.sandbox is for an entry agent; a command always runs in a sandbox",
                          "remove options.sandbox, or run the agent as an entry")
    if (options.get("files") or options.get("collect")) and not options.get("command"):
        raise ConfigError("agent harness: options.files and options.collect apply to options.command only",
                          "remove them, or run the agent as a command")
    if options.get("tasks", "basic") not in (*shipped.SETS, harbor_tasks.NAME):
        raise ConfigError(f"agent harness: options.tasks {options.get('tasks')!r} is not a shipped task set",
                          f"use one of {', '.join(shipped.SETS)}, {harbor_tasks.NAME}, or point harnesses[].tasks at a task file")
    if options.get("tasks") == harbor_tasks.NAME and not (options.get("sandbox") or options.get("command")):
        raise ConfigError("agent harness: options.tasks: harbor needs an agent in a sandbox: a command, or an entry "
                          "with options.sandbox: true (the task's files are in its sandbox, where its tests grade them)",
                          "set harnesses[].options.sandbox: true (or run the agent as a command) and "
                          "harnesses[].reward: harness")
    timeout = options.get("timeout_s", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"agent harness: options.timeout_s must be a positive number of seconds, got {timeout!r}",
                          "set harnesses[].options.timeout_s, e.g. 300")


class AgentHarness:
    name = "agent"
    version = "1"
    plays_itself = True  # the rollout plays its episodes (runtime/rollout/agent_episode.py), not run_episode's loop
    needs_gateway = True  # a training run starts its recording gateway for it
    reward_sources = ("verifiers", "harness")
    step_rewards = True  # a reward the agent posts for one call (POST /sessions/{id}/reward with call_id) is that step's

    def __init__(self, entry: str | None = None, command: str | None = None, files=(), collect=(), tasks: str = "basic",
                 timeout_s: float = 300.0, sandbox: bool = False, gateway=None, sandbox_provider=None) -> None:
        """`gateway` (the run's, `rollout.agent_gateway.AgentGateway`) and `sandbox_provider` (the
        harness's sandbox pool, for a command or a sandboxed entry) come from the training run, never the config."""
        check_options({k: v for k, v in {"entry": entry, "command": command, "files": files, "collect": collect,
                                         "tasks": tasks, "timeout_s": timeout_s, "sandbox": sandbox}.items() if v})
        self.runner = CommandRunner(command, files, collect) if command else \
            EntryRunner(entry or DEFAULT_ENTRY, sandbox=sandbox)
        self.timeout_s, self.gateway, self.provider = float(timeout_s), gateway, sandbox_provider
        self.task = None
        self.outcome: AgentOutcome | None = None
        self.posted: float | None = None
        self.final = None  # a Harbor task's final working directory (harbor_verify.FinalFiles), read after the agent

    @property
    def in_sandbox(self) -> bool:
        """Whether an episode needs a sandbox: the command's, or the one a sandboxed entry runs its tools in."""
        return isinstance(self.runner, CommandRunner) or self.runner.sandbox

    @classmethod
    def task_set(cls, options: dict) -> TaskSet:
        """The shipped set `options.tasks`; the options are checked here (at load, before any server)."""
        check_options(options)
        if not options.get("command"):
            EntryRunner(options.get("entry") or DEFAULT_ENTRY, sandbox=bool(options.get("sandbox")))  # a bad path fails at load
        if options.get("tasks") == harbor_tasks.NAME:
            return harbor_tasks.task_set()
        return shipped.task_set(options.get("tasks", "basic"))

    # -- the episode, as the rollout plays it --------------------------------------------------------
    def reset(self, task_spec) -> Observation:
        self.task, self.outcome, self.posted, self.final = task_spec, None, None, None
        if harbor_tasks.is_harbor(task_spec):
            task_spec = replace(task_spec, prompt=harbor_tasks.prompt(task_spec))
            self.task = task_spec
        return Observation(text=task_spec.prompt, data={"task": task_dict(task_spec)})

    def play(self, base_url: str, api_key: str, reward: tuple[str, str] | None = None) -> AgentOutcome:
        """Run the agent on the current task with its gateway session (blocking: the rollout calls it
        in a harness thread). `reward`: (url, key) the agent may post its episode's reward to."""
        if self.task is None:
            raise AgentFailed("no episode is running: reset first")
        task, env = task_dict(self.task), {}
        if reward is not None:
            task["reward_url"], task["reward_key"] = reward
            env = {"AGENTRL_REWARD_URL": reward[0], "AGENTRL_REWARD_KEY": reward[1]}
        if self.in_sandbox and self.provider is None:
            raise AgentFailed("this agent harness has no sandboxes: a command agent, or an entry with options.sandbox, "
                              "runs inside a training run, which gives it its sandbox pool")
        if self.in_sandbox:
            self.outcome = self._in_sandbox(task, base_url, api_key, env)
        else:
            self.outcome = self.runner(task, base_url, api_key, self.timeout_s)
        return self.outcome

    def _in_sandbox(self, task: dict, base_url: str, api_key: str, env: dict) -> AgentOutcome:
        """A command, or a sandboxed entry: the episode's sandbox (a Harbor task's files in it first),
        its final files read back for grading before it is given back."""
        sandbox = self.provider.acquire()
        try:
            harbor = harbor_tasks.is_harbor(self.task)
            if harbor:
                harbor_tasks.prepare(sandbox, self.task)
            if isinstance(self.runner, CommandRunner):
                outcome = self.runner(task, base_url, api_key, self.timeout_s, sandbox, env)
            else:
                outcome = self.runner(task, base_url, api_key, self.timeout_s, sandbox=sandbox)
            if harbor:
                self.final = harbor_tasks.final_files(sandbox, self.task)
            return outcome
        finally:
            self.provider.release(sandbox)

    def take_rewards(self, episode: float | None) -> None:
        """The episode reward posted to the gateway session (None: none was)."""
        self.posted = episode

    def step(self, action) -> Observation:
        return Observation(text=STEP_REFUSAL, status="invalid_action")

    def evidence(self, trajectory: Trajectory) -> Evidence:
        if self.outcome is None:
            return Evidence()
        return Evidence(final_answer=self.outcome.answer, files=dict(self.outcome.files))

    def compute_reward(self, trajectory: Trajectory) -> HarnessReward:
        """`reward: harness`: a Harbor task's verdict from its own tests, else the episode reward the
        agent or its environment posted; 0 when none was."""
        if self.final is not None:
            return harbor_tasks.verdict(self.provider, self.task, self.final, self.outcome.answer if self.outcome else None)
        if self.posted is None:
            return HarnessReward(0.0, detail="no reward was posted to the session (POST /sessions/{id}/reward)")
        return HarnessReward(float(self.posted), detail="posted to the gateway session")

    def full_reset(self) -> None:
        self.task, self.outcome, self.posted, self.final = None, None, None, None

    def close(self) -> None:
        self.full_reset()
