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

Options (`harnesses[].options`, checked at load):
  entry      "module:function", called on a private event loop in the rollout's harness thread
  command    a command run by bash in a bubblewrap sandbox that reaches the run's gateway and nothing
             else, with OPENAI_BASE_URL, OPENAI_API_KEY, AGENT_TASK (JSON) set and the prompt on stdin
  files      host files or directories copied into the sandbox's work directory (command only)
  collect    work-directory files read back after the command, as evidence for the verifier
  tasks      a shipped task set, `basic` (default) or `brief` (`harnesses.agent.tasks`);
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

from agentrl_cli.core.episode import Evidence, HarnessReward, Observation, TaskSet, Trajectory
from agentrl_cli.core.errors import ConfigError
from harnesses.agent import tasks as shipped
from harnesses.agent.runners import AgentFailed, AgentOutcome, CommandRunner, EntryRunner, task_dict

DEFAULT_ENTRY = "harnesses.agent.default_agent:run"
OPTIONS = ("entry", "command", "files", "collect", "tasks", "timeout_s")
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
    if (options.get("files") or options.get("collect")) and not options.get("command"):
        raise ConfigError("agent harness: options.files and options.collect apply to options.command only",
                          "remove them, or run the agent as a command")
    if options.get("tasks", "basic") not in shipped.SETS:
        raise ConfigError(f"agent harness: options.tasks {options.get('tasks')!r} is not a shipped task set",
                          f"use one of {', '.join(shipped.SETS)}, or point harnesses[].tasks at a task file")
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

    def __init__(self, entry: str | None = None, command: str | None = None, files=(), collect=(), tasks: str = "basic",
                 timeout_s: float = 300.0, gateway=None, sandbox_provider=None) -> None:
        """`gateway` (the run's, `rollout.agent_gateway.AgentGateway`) and `sandbox_provider` (the
        harness's sandbox pool, for a command) come from the training run, never the config."""
        check_options({k: v for k, v in {"entry": entry, "command": command, "files": files, "collect": collect,
                                         "tasks": tasks, "timeout_s": timeout_s}.items() if v})
        self.runner = CommandRunner(command, files, collect) if command else EntryRunner(entry or DEFAULT_ENTRY)
        self.timeout_s, self.gateway, self.provider = float(timeout_s), gateway, sandbox_provider
        self.task = None
        self.outcome: AgentOutcome | None = None
        self.posted: float | None = None

    @property
    def in_sandbox(self) -> bool:
        return isinstance(self.runner, CommandRunner)

    @classmethod
    def task_set(cls, options: dict) -> TaskSet:
        """The shipped set `options.tasks`; the options are checked here (at load, before any server)."""
        check_options(options)
        if not options.get("command"):
            EntryRunner(options.get("entry") or DEFAULT_ENTRY)  # imports the agent: a bad path fails at load
        return shipped.task_set(options.get("tasks", "basic"))

    # -- the episode, as the rollout plays it --------------------------------------------------------
    def reset(self, task_spec) -> Observation:
        self.task, self.outcome, self.posted = task_spec, None, None
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
        if self.in_sandbox:
            if self.provider is None:
                raise AgentFailed("this agent harness has no sandboxes: a command agent runs inside a training run, "
                                  "which gives it its sandbox pool")
            self.outcome = self.runner(task, base_url, api_key, self.timeout_s, self.provider, env)
        else:
            self.outcome = self.runner(task, base_url, api_key, self.timeout_s)
        return self.outcome

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
        """The episode reward the agent or its environment posted (`reward: harness`); 0 when none was."""
        if self.posted is None:
            return HarnessReward(0.0, detail="no reward was posted to the session (POST /sessions/{id}/reward)")
        return HarnessReward(float(self.posted), detail="posted to the gateway session")

    def full_reset(self) -> None:
        self.task, self.outcome, self.posted = None, None, None

    def close(self) -> None:
        self.full_reset()
