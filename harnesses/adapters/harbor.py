"""harbor: Harbor task directories (the format of harbor-framework/harbor, formerly
laude-institute/harbor: instruction.md, task.toml, environment/, tests/test.sh, solution/solve.sh)
as a harness, graded by their own tests. agentrl does not depend on the `harbor` package.

    harnesses:
      - name: harbor
        options: {tasks_dir: path/to/tasks}   # default: the shipped harnesses/adapters/harbor_tasks
        # build each task's environment/Dockerfile (default off), FROM images available here:
        # options: {build: auto, base_images: {"*": env}, fallback_image: ""}

An episode: `reset` takes a sandbox from the pool, writes the task's environment/ files (all but
the Docker files) into its working directory and shows instruction.md. The agent acts with
`run_shell` (terminal_like's persistent shell: the same tool spec and Hermes `<tool_call>`
convention) and ends with a final line `ANSWER: <a short final message>`. `compute_reward` grades
the episode as Harbor's verifier does, in a fresh sandbox (`harbor_verify`: the path mapping, the
tamper rule and when a verifier failure is masked rather than a zero), so `reward_source` is
`harness`. Task sets, splits and versions: `harbor_format`.

Where a task runs (`harbor_image`): with `build: auto` or `required`, its environment/Dockerfile is
built with buildah (no daemon; every FROM mapped to a local OCI layout by `base_images`, by default
agentrl's Debian env image) and the episode's sandboxes, the verifier's included, are rooted in the
built image; the files the image holds in its WORKDIR are copied into the working directory. Else
(`build: off`, the default, or a task that cannot be built under `auto`) it runs in the fallback:
`fallback_image`, by default the host's root, with environment/'s files (all but the Docker files)
copied in. Either way the first observation's info says which (`harbor_environment`: built or
fallback, the image, its digest, and the reason for a fallback), and a task that fell back while a
build was asked for is graded with the flag `environment_fallback` and the reason in the detail.

What differs from Harbor, which runs each task in its Docker container: in the fallback the
Dockerfile's RUN steps and base image do not apply (the host's /usr has python3, bash and
coreutils); `docker_image`, `network_mode`, cpus and memory never apply (no network, the
`sandbox.*` limits); the image's root is read-only, so environment/'s files land in the working
directory, as `COPY . <WORKDIR>` would put them; the container's WORKDIR (e.g. /app) is the
sandbox's working directory (/work), in the instruction shown and in solve.sh as well as in the
tests; `[agent] timeout_sec` is recorded, not enforced (`rollout.step_timeout_seconds` and
`rollout.max_steps_per_trajectory` bound an episode); `[verifier] timeout_sec` bounds test.sh,
capped at `rollout.step_timeout_seconds`. Multi-step tasks, `[environment] env` and Windows tasks
are refused when the task set loads.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.images import ImageError, digest_of
from agentrl_cli.envs.sandbox import SandboxSettings
from agentrl_cli.envs.sandbox.bwrap import WORK
from agentrl_cli.envs.sandbox.provider import DirectProvider
from harnesses.adapters import harbor_format
from harnesses.adapters.harbor_format import MAX_ENVIRONMENT_BYTES, environment_files, map_paths, resolve_env
from harnesses.adapters.harbor_image import IMAGE_OPTIONS, ImagePolicy, TaskImage
from harnesses.adapters.harbor_verify import HARBOR_DIR, collect, grade, root_of
from harnesses.base import Evidence, HarnessReward, Observation, TaskSet, TaskSpec, Trajectory
from harnesses.parsing import parse_answer, tool_call
from harnesses.sandboxed import SandboxHarness, image_digest_of
from harnesses.terminal_like import TerminalLike

SYSTEM_PROMPT = """You solve a task in a Linux shell, in your working directory. Run a command with
<tool_call>
{"name": "run_shell", "arguments": {"command": "ls -l"}}
</tool_call>
When the task is done, reply with one short final line: ANSWER: <your final message>"""
_TOOL_CALLS = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)


class HarborHarness(SandboxHarness):
    name = "harbor"
    version = "1.0"
    reward_source = "harness"  # graded by the task's own tests/test.sh
    reward_sources = ("harness",)  # no agentrl verifier can run its tests

    def __init__(self, tasks_dir: str | None = None, sandboxes=None, settings=None, step_timeout_s: float = 30.0,
                 build: str = "off", base_images: dict | None = None, fallback_image: str = "", build_dir: str = "",
                 build_network: bool = False, **unknown) -> None:
        if unknown:
            raise ConfigError(f"harnesses[harbor].options: unknown key(s) {', '.join(sorted(unknown))}",
                              f"the harbor adapter takes: {', '.join(harbor_format.OPTIONS)}")
        super().__init__(sandboxes, settings, step_timeout_s)
        self.tasks_dir = tasks_dir  # each task carries its own directory (meta.task_dir); kept for the record
        self.images = ImagePolicy(build, base_images, fallback_image, build_dir, build_network)
        self.task_image: TaskImage | None = None  # where the current episode runs
        self._image_providers: dict[str, DirectProvider] = {}  # image reference -> sandboxes rooted in it

    # -- optional hooks (harnesses.base) ------------------------------------------------------------
    @classmethod
    def task_set(cls, options: dict | None = None) -> TaskSet:
        return harbor_format.task_set(dict(options or {}))

    @classmethod
    def task_image_digest(cls, options: dict | None, task_id: str) -> str | None:
        """The digest of the image `task_id`'s episodes run in under these options (its built image,
        built now if it is not cached, or the fallback image), None where that is the harness's own
        sandbox root (`harnesses[].image`, else the host's): what replay checks a trajectory against."""
        opts = dict(options or {})
        policy = ImagePolicy(**{k: opts[k] for k in IMAGE_OPTIONS if k in opts})
        if policy.mode == "off" and not policy.fallback_image:
            return None
        task = next((t for t in cls.task_set(opts).tasks if t.task_id == task_id), None)
        image = policy.for_task(Path(task.meta["task_dir"])) if task is not None else None
        return digest_of(image.image) if image is not None and image.image else None

    @classmethod
    def scripted_action(cls, task: TaskSpec, turn: int) -> str | None:
        """solution/solve.sh as one run_shell call, then the final line."""
        if turn == 0:
            return tool_call("run_shell", command=solution_command(task))
        return "ANSWER: done" if turn == 1 else None

    @classmethod
    def wrong_action(cls, task: TaskSpec) -> str:
        return (tool_call("run_shell", command="echo 'not the answer' > answer.txt")
                + "\nANSWER: I could not finish this task, so I am stopping here without a solution.")

    # -- contract -----------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    tools = TerminalLike.tools  # the same run_shell, parsed and run the same way
    parse = TerminalLike.parse
    no_action_hint = TerminalLike.no_action_hint
    tool_run_shell = TerminalLike.tool_run_shell

    def reset(self, task_spec: TaskSpec) -> Observation:
        self._release()  # never clean in place: the old sandbox is destroyed
        task_dir = Path(task_spec.meta["task_dir"])
        self.task_image = self.images.for_task(task_dir)
        provider = self.episode_provider()
        self.sandbox = provider.acquire()
        self.episode_image_digest = image_digest_of(self.sandbox)  # stored with the trajectory
        self.task = task_spec
        workdir = task_spec.meta["harbor"].get("workdir")
        settings = _settings_of(provider)
        if self.task_image.environment == "built":
            files = image_workdir_files(settings.image_root, workdir)
        else:
            files = environment_files(task_dir)
        for path, (data, mode) in sorted(files.items()):
            self.sandbox.write_file(path, data, mode=mode)
        root = root_of(self.sandbox)
        text = (map_paths(task_spec.prompt, {workdir: root}) if workdir else task_spec.prompt).rstrip()
        text += f"\n\nYour working directory is {root}." + (f" Files in it: {', '.join(sorted(files))}" if files else "")
        record = {**self.task_image.record(), "digest": self.episode_image_digest or None}  # the fallback image's, too
        return Observation(text=text, data={"files": sorted(files)}, status="ok", info={"harbor_environment": record})

    def episode_provider(self):
        """The sandboxes of the current task's image: the harness's own provider for the host's root,
        else local sandboxes with the same settings rooted in the image (started per episode)."""
        image = self.task_image.image if self.task_image is not None else ""
        if not image:
            return self._provider
        if image not in self._image_providers:
            base = _settings_of(self._provider)
            if base is None:
                raise ImageError(image, "harness 'harbor': the sandbox service (sandbox.service_url) does not run images",
                                 "unset sandbox.service_url, or set harnesses[harbor].options.build: off and fallback_image: ''")
            self._image_providers[image] = DirectProvider(base.with_image(image))
        return self._image_providers[image]

    def evidence(self, trajectory: Trajectory) -> Evidence:
        """The final answer; the files are graded by the task's own tests (`compute_reward`)."""
        answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
        return Evidence(final_answer=answers[-1] if answers else None)

    def compute_reward(self, trajectory: Trajectory) -> float | HarnessReward:
        """Harbor's verdict on the episode (`harbor_verify`): the reward as a float, or a HarnessReward
        where there is a flag or a detail to add. The agent's sandbox is released once its files are
        read, before the verifier's is taken, so an episode never holds two."""
        if self.sandbox is None:
            raise RuntimeError("no episode sandbox to grade: compute_reward runs once per episode, after it and before end_episode")
        task = trajectory.task
        name = task.meta["harbor"]["name"]
        try:
            final = collect(self.sandbox, self.step_timeout_s)
        finally:
            self._release()
        if final.tampered:
            return HarnessReward(0.0, ["tamper"], f"{name}: the agent wrote the verifier's reward file itself "
                                 f"({', '.join(final.tampered)}; Harbor's /logs is {HARBOR_DIR}/logs here)")
        if final.too_large:
            return HarnessReward(0.0, detail=f"{name}: the final working directory is too large to grade: {final.too_large}")
        timeout = min(float(task.meta["harbor"]["verifier_timeout_s"]), self.step_timeout_s)
        verdict = grade(self.episode_provider(), task, final, final_message(trajectory), timeout)
        image = self.task_image
        if image is not None and image.environment == "fallback" and self.images.mode != "off":
            verdict = HarnessReward(verdict.score, [*verdict.flags, "environment_fallback"],
                                    "; ".join(filter(None, [verdict.detail, f"{name} ran in the fallback, not its image: {image.reason}"])))
        return verdict if verdict.flags or verdict.detail else verdict.score


def _settings_of(provider) -> SandboxSettings | None:
    """The settings a local provider (a pool, a direct provider, either timed) starts sandboxes with."""
    for p in (provider, getattr(provider, "inner", None)):
        if isinstance(getattr(p, "settings", None), SandboxSettings):
            return p.settings
    return None


def image_workdir_files(root: Path, workdir: str | None) -> dict[str, tuple[bytes, int]]:
    """The regular files a built image holds under its WORKDIR (relative path -> (content, mode)),
    read from its unpacked root without following a symlink anywhere (a link could name a host
    path); at most MAX_ENVIRONMENT_BYTES in all. {} when the image has no such directory."""
    if not workdir or workdir == "/":
        return {}
    d = root
    for part in workdir.strip("/").split("/"):
        d = d / part
        if d.is_symlink() or not d.is_dir():
            return {}
    out, total = {}, 0
    for dirpath, dirnames, filenames in os.walk(d):  # os.walk does not descend into linked directories
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            if total > MAX_ENVIRONMENT_BYTES:
                raise ConfigError(f"the built image holds more than {MAX_ENVIRONMENT_BYTES} bytes under {workdir}",
                                  "every episode copies the WORKDIR into its sandbox: keep it small")
            out[p.relative_to(d).as_posix()] = (p.read_bytes(), 0o755 if st.st_mode & 0o111 else 0o644)
    return out


def final_message(trajectory: Trajectory) -> str | None:
    """The agent's final message: its last `ANSWER:` value, else its last reply without tool calls;
    None when it sent nothing."""
    if not trajectory.actions:
        return None
    answers = [a for a in (parse_answer(x.text) for x in trajectory.actions) if a is not None]
    return answers[-1] if answers else _TOOL_CALLS.sub("", trajectory.actions[-1].text).strip()


def solution_command(task: TaskSpec) -> str:
    """solution/solve.sh as a shell command run from the working directory: `[solution] env`
    exported first, the container's WORKDIR mapped to the sandbox's (/work)."""
    d = Path(task.meta["task_dir"])
    try:
        script = (d / "solution" / "solve.sh").read_text(encoding="utf-8")
    except OSError:
        raise ConfigError(f"Harbor task {d} has no readable solution/solve.sh", "add the oracle solution/solve.sh") from None
    workdir = task.meta["harbor"].get("workdir")
    env = resolve_env(task.meta["harbor"].get("solution_env") or {}, f"{d / 'task.toml'} [solution].env")
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return exports + (map_paths(script, {workdir: WORK}) if workdir else script)
