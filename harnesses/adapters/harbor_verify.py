"""Grading one Harbor episode as Harbor's verifier does, with bubblewrap sandboxes in place of the
task's container: the agent's final working directory is read from its sandbox (bounded), checked
for tampering, and copied into a FRESH sandbox with the task's tests/, where tests/test.sh runs
from the working directory (its output in /logs/verifier/test-stdout.txt, as Harbor keeps it) and
the reward is read from the reward file it wrote. Directories, symlinks and file modes travel too;
a hard-linked file or a name with a newline does not (named in the reward's detail).

Container paths. A sandbox's root is read-only and nothing can be mounted into it, so Harbor's
container paths live in a reserved directory of the verifier sandbox's working directory `W`:
/tests -> W/.harbor/tests, /logs -> W/.harbor/logs (so /logs/verifier/reward.txt is
W/.harbor/logs/verifier/reward.txt), and the container's WORKDIR (e.g. /app) -> W. The copies of
the test files (never the agent's files) have these paths rewritten where they appear as whole
path components (`harbor_format.map_paths`); test files that build such paths at run time are not
covered. The agent's sandbox never holds tests/, solution/ or .harbor/: a `.harbor/` the agent made
is never copied to the verifier, and a reward file in it (`.harbor/logs/verifier/reward.txt` or
`reward.json`, the mapped location) is tampering: reward 0, flag `tamper`.

Harbor's agent log directory /logs/agent holds `final_answer.txt`, the agent's final message (as
Harbor's computer-use agent writes it): the value of its last `ANSWER:` line, else its last reply
with tool calls removed; absent when it sent nothing.

When test.sh writes no reward (Harbor raises RewardFileNotFoundError): exit 0 -> the task is broken,
raised (the episode is masked infra_error); exit 126/127 -> a program is missing from the sandbox
(agentrl does not build the Dockerfile), raised; any other exit code -> it ran and failed before
writing a reward (typical of `set -e` scripts), reward 0 with the exit code and output in the detail.
A test.sh stopped by a limit, a reward file that is not a number, or a reward outside [0, 1] is raised.

Belongs here: the copy, the run, the reading. Not here: the task format (`harbor_format`), the harness (`harbor`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.core.episode import HarnessReward, TaskSpec
from agentrl_cli.envs.sandbox.bwrap import WORK
from agentrl_cli.envs.sandbox.files import UnsafePath
from harnesses.adapters.harbor_format import map_paths, parse_reward, resolve_env, verifier_files

HARBOR_DIR = ".harbor"
TESTS_DIR, LOGS_DIR = f"{HARBOR_DIR}/tests", f"{HARBOR_DIR}/logs"
VERIFIER_DIR, AGENT_LOGS_DIR = f"{LOGS_DIR}/verifier", f"{LOGS_DIR}/agent"
REWARD_JSON, REWARD_TXT = f"{VERIFIER_DIR}/reward.json", f"{VERIFIER_DIR}/reward.txt"
TEST_STDOUT = f"{VERIFIER_DIR}/test-stdout.txt"
SHELL_STATE = frozenset({".agentrl-shell-cwd", ".agentrl-shell-env"})  # terminal_like's shell state without isolation
MAX_FILES, MAX_BYTES = 2000, 16 << 20  # the final working directory carried to the verifier
LIST = r"find . -mindepth 1 \( -type f -o -type d -o -type l \) -printf '%y %m %s %P\0%l\0'"


class VerifierFailed(RuntimeError):
    """test.sh could not judge the episode (see the module docstring): the episode is masked."""


@dataclass
class FinalFiles:
    """The agent's final working directory, as carried to the verifier."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    dirs: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # path -> link target
    skipped: list[str] = field(default_factory=list)  # files that cannot be read safely (hard links, odd names)
    tampered: list[str] = field(default_factory=list)  # reward files the agent wrote itself
    too_large: str = ""  # why the directory cannot be carried over, or ""


def root_of(sandbox) -> str:
    return WORK if sandbox.isolated else str(sandbox.workdir)


def collect(sandbox, timeout_s: float) -> FinalFiles:
    """Everything under the agent's working directory but .harbor/ and the shell's state files."""
    r = sandbox.exec(LIST, timeout=timeout_s)
    out = FinalFiles()
    if r.killed_reason == "output_limit":
        out.too_large = "its file list outgrew the sandbox's output limit"
        return out
    if r.error or r.killed_reason:
        raise VerifierFailed(f"listing the agent's working directory failed: {r.error or r.killed_reason}")
    fields = r.stdout.split("\0")
    entries = []
    for header, target in zip(fields[0::2], fields[1::2]):
        kind, mode, size, path = (header.split(" ", 3) + ["", "", ""])[:4]
        if path in (REWARD_TXT, REWARD_JSON):
            out.tampered.append(path)
        if not path or path == HARBOR_DIR or path.startswith(HARBOR_DIR + "/") or path in SHELL_STATE:
            continue
        if "\n" in path or "\n" in target:
            out.skipped.append(path.replace("\n", "\\n"))
            continue
        entries.append((kind, mode, int(size) if size.isdigit() else 0, path, target))
    total = sum(size for kind, _, size, _, _ in entries if kind == "f")
    if len(entries) > MAX_FILES or total > MAX_BYTES:
        out.too_large = f"{len(entries)} entries, {total} bytes (at most {MAX_FILES} entries, {MAX_BYTES} bytes)"
        return out
    for kind, mode, _, path, target in entries:
        if kind == "d":
            out.dirs.append(path)
        elif kind == "l":
            out.links[path] = target
        else:
            try:
                out.files[path] = (sandbox.read_file(path, max_bytes=MAX_BYTES), int(mode or "644", 8) & 0o777)
            except (UnsafePath, ValueError):
                out.skipped.append(path)
    return out


def grade(provider, task: TaskSpec, final: FinalFiles, final_message: str | None, timeout_s: float) -> HarnessReward:
    """Run the task's tests/test.sh on `final` in a fresh sandbox from `provider` and read its reward
    (a detail only where the reward alone does not say everything)."""
    d, info = Path(task.meta["task_dir"]), task.meta["harbor"]
    env = resolve_env(info.get("verifier_env") or {}, f"{d / 'task.toml'} [verifier].env")
    sb = provider.acquire()
    try:
        root = root_of(sb)
        table = {"/tests": f"{root}/{TESTS_DIR}", "/logs": f"{root}/{LOGS_DIR}"}
        if info.get("workdir"):
            table[info["workdir"]] = root
        for path, (data, mode) in final.files.items():
            sb.write_file(path, data, mode=mode)
        for rel, (data, mode) in verifier_files(d).items():
            sb.write_file(f"{TESTS_DIR}/{rel}", _mapped(data, table), mode=0o755 if rel == "test.sh" else mode)
        if final_message is not None:
            sb.write_file(f"{AGENT_LOGS_DIR}/final_answer.txt", final_message)
        _setup(sb, final, timeout_s)
        # as Harbor runs it: from the working directory, output to /logs/verifier/test-stdout.txt
        r = sb.exec(f"{shlex.quote(f'{root}/{TESTS_DIR}/test.sh')} > {TEST_STDOUT} 2>&1", timeout=timeout_s, env=env)
        return _judged(sb, task, r, final)
    finally:
        provider.release(sb)


def _setup(sb, final: FinalFiles, timeout_s: float) -> None:
    """The verifier's log directory, and the agent's directories and links (names read from stdin:
    a command line has a length limit, a file list does not)."""
    steps = [(f"mkdir -p -- {VERIFIER_DIR} && xargs -d '\\n' -r mkdir -p --", final.dirs)]
    if final.links:
        steps.append(('while IFS= read -r t && IFS= read -r p; do ln -sfn -- "$t" "$p" || exit 1; done',
                      [x for pair in final.links.items() for x in pair[::-1]]))
    for command, lines in steps:
        r = sb.exec(command, timeout=timeout_s, stdin="".join(f"{x}\n" for x in lines))
        if r.status != "ok":
            raise VerifierFailed(f"preparing the verifier sandbox failed: {r.error or r.killed_reason or r.output[-300:]}")


def _judged(sb, task: TaskSpec, r, final: FinalFiles) -> HarnessReward:
    name = task.meta["harbor"]["name"]
    tail = sb.exec(f"tail -c 600 {TEST_STDOUT}", timeout=10).stdout.strip()
    if r.killed_reason or r.error:
        raise VerifierFailed(f"{name}: tests/test.sh was stopped ({r.error or r.killed_reason}) before a reward was read; "
                             f"output: {tail}")
    found = {}
    for path in (REWARD_JSON, REWARD_TXT):
        try:
            found[path] = sb.read_file(path, max_bytes=1 << 16)
        except UnsafePath:
            found[path] = None
    if found[REWARD_JSON] is None and found[REWARD_TXT] is None:
        if r.exit_code in (0, 126, 127):
            why = ("a program it needs is missing from the sandbox (agentrl does not build the task's Dockerfile)"
                   if r.exit_code else "it exited 0 without writing one: the task's test.sh is broken")
            raise VerifierFailed(f"{name}: tests/test.sh wrote no /logs/verifier/reward.txt or reward.json: {why}; output: {tail}")
        return HarnessReward(0.0, detail=f"{name}: tests/test.sh exited {r.exit_code} without writing a reward; output: {tail}")
    try:
        score, source = parse_reward(found[REWARD_JSON], found[REWARD_TXT])
    except ValueError as exc:
        raise VerifierFailed(f"{name}: {exc}") from None
    if not 0.0 <= score <= 1.0:
        raise VerifierFailed(f"{name}: {source} holds {score:g}; agentrl's harness reward must be in [0, 1] "
                             "(Harbor allows any number): write a reward in [0, 1]")
    if final.skipped:
        return HarnessReward(score, detail=f"{name}: reward {score:g} from {source}; not carried over to the verifier "
                                           f"(unsafe to read): {', '.join(final.skipped[:5])}")
    return HarnessReward(score)


def _mapped(data: bytes, table: dict[str, str]) -> bytes:
    try:
        return map_paths(data.decode("utf-8"), table).encode("utf-8")
    except UnicodeDecodeError:
        return data  # a binary test file is copied as it is

