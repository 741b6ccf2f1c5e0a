"""The harbor adapter (`harnesses/adapters/harbor.py`): Harbor task directories played in real
bubblewrap sandboxes and graded by their own tests/test.sh in a fresh sandbox. The shipped tasks'
solutions score 1.0, wrong work 0.0, partial work its partial credit; an agent that writes the
verifier's reward file itself scores 0 with the `tamper` flag; the agent's sandbox never holds
tests/ or solution/; Harbor's container paths (/app, /tests, /logs/verifier) and reward.json work;
a test.sh that cannot judge masks the episode (raises) while one that ran and failed scores 0; and
the adapter passes stage 5 and trains through stage 8 smoke."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.sandbox import SandboxSettings
from harnesses.adapters.harbor import HarborHarness
from harnesses.adapters.harbor_format import DEFAULT_TASKS_DIR
from harnesses.adapters.harbor_verify import VerifierFailed
from harnesses.base import Action, HarnessReward, Trajectory
from harnesses.contract import play
from harnesses.parsing import tool_call
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, needs_bwrap]
SHIPPED = ("count-lines", "fix-script", "write-greeting")


@pytest.fixture
def harness(sandbox_root):
    h = HarborHarness(settings=SandboxSettings(root_dir=sandbox_root))
    yield h
    h.close()


def shipped(name: str, split: str = "eval"):
    return next(t for t in HarborHarness.task_set({}).select(split) if t.meta["family"] == name)


def episode(h, task, *texts: str) -> Trajectory:
    traj = Trajectory(task=task, observations=[h.reset(task)])
    for text in texts:
        traj.actions.append(Action(text=text))
        traj.observations.append(h.step(traj.actions[-1]))
    return traj


def shell(command: str) -> str:
    return tool_call("run_shell", command=command)


def make_task(root: Path, name: str, test_sh: str, *, files: dict | None = None, instruction: str = "Do the task.\n",
              solve: str | None = None, dockerfile: str = "FROM ubuntu:24.04\nWORKDIR /app\n", toml: str = "") -> Path:
    d = root / name
    for rel, text in {"instruction.md": instruction, "environment/Dockerfile": dockerfile, "tests/test.sh": test_sh,
                      "task.toml": 'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 20.0\n' + toml,
                      **({"solution/solve.sh": solve} if solve else {}), **(files or {})}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(textwrap.dedent(text))
    return d


@pytest.mark.parametrize("name", SHIPPED)
def test_the_scripted_solution_of_each_shipped_task_scores_full_reward_in_the_sandbox(harness, name):
    traj, last = play(harness, shipped(name), policy=HarborHarness.scripted_action)
    assert last.done and [o.status for o in traj.observations] == ["ok", "ok", "ok"], [o.text for o in traj.observations]
    assert harness.compute_reward(traj) == 1.0


@pytest.mark.parametrize("name", SHIPPED)
def test_wrong_work_scores_zero_on_each_shipped_task(harness, name):
    task = shipped(name)
    traj = episode(harness, task, HarborHarness.wrong_action(task))
    assert traj.observations[-1].done
    assert harness.compute_reward(traj) == 0.0


def test_partial_work_earns_the_partial_credit_the_task_s_tests_give(harness):
    # count-lines: the right answer.txt, but a final message longer than the 45 characters asked for
    traj = episode(harness, shipped("count-lines"), shell("wc -l < data.txt | tr -d ' ' > answer.txt"),
                   "ANSWER: the file data.txt has seventeen lines, I counted them with wc")
    assert harness.compute_reward(traj) == pytest.approx(0.8)
    # an episode cut off after plain-text replies: the last reply is the final message the tests read
    task = shipped("count-lines")
    assert harness.compute_reward(episode(harness, task, "thinking", "a short last reply")) == pytest.approx(0.2)
    assert harness.compute_reward(episode(harness, task, "thinking", "a last reply far longer than forty-five characters")) == 0.0
    # fix-script: a hard-coded print passes the visible case only, not the hidden numbers file
    traj = episode(harness, shipped("fix-script"), shell("printf 'print(\"total: 108\")\\n' > sum_numbers.py") + "\nANSWER: fixed")
    assert harness.compute_reward(traj) == pytest.approx(0.5)


def test_an_agent_that_writes_the_reward_file_itself_scores_zero_with_the_tamper_flag(harness):
    task = shipped("count-lines")
    traj = episode(harness, task, shell("wc -l < data.txt | tr -d ' ' > answer.txt; echo 1 > /logs/verifier/reward.txt"),
                   shell("mkdir -p .harbor/logs/verifier && echo 1 > .harbor/logs/verifier/reward.txt") + "\nANSWER: done")
    assert traj.observations[1].calls[0].exit_code != 0  # Harbor's own path: the sandbox's root is read-only
    verdict = harness.compute_reward(traj)
    assert isinstance(verdict, HarnessReward) and verdict.score == 0.0 and verdict.flags == ["tamper"], verdict


@pytest.mark.parametrize("name", SHIPPED)
def test_the_agent_sandbox_never_holds_tests_or_solution(harness, name):
    task = shipped(name)
    listing = "ls -A / && echo --- && find . -mindepth 1 | sort"
    harness.reset(task)
    seen = [harness.sandbox.exec(listing).stdout]
    harness.step(Action(text=HarborHarness.scripted_action(task, 0)))
    seen.append(harness.sandbox.exec(listing).stdout)
    environment = sorted(p.name for p in (Path(task.meta["task_dir"]) / "environment").iterdir() if p.name != "Dockerfile")
    root, work = seen[0].split("---")
    assert work.split() == [f"./{n}" for n in environment]
    for out in seen:
        root, work = out.split("---")
        assert not {"tests", "solution", "logs"} & set(root.split())
        assert not [p for p in work.split() if p.split("/")[1] in ("tests", "solution", ".harbor")], work


def test_harbor_container_paths_and_reward_json_are_honoured(harness, tmp_path):
    """WORKDIR /app is the sandbox's working directory (in the instruction, solve.sh and the tests),
    /tests and /logs/verifier are where test.sh looks for them, and reward.json wins over reward.txt."""
    make_task(tmp_path, "upper", files={"environment/input.txt": "hello harbor\n", "tests/expected.txt": "HELLO HARBOR\n"},
              instruction="Write /app/input.txt in upper case to /app/output.txt.\n",
              solve="#!/bin/bash\ntr a-z A-Z < /app/input.txt > /app/output.txt\n",
              test_sh="""\
                  #!/bin/bash
                  cd /app
                  if cmp -s /app/output.txt /tests/expected.txt; then r=0.75; else r=0; fi
                  echo "{\\"reward\\": $r, \\"files\\": 1}" > /logs/verifier/reward.json
                  echo 0.5 > /logs/verifier/reward.txt
                  """)
    [task] = HarborHarness.task_set({"tasks_dir": str(tmp_path)}).select("eval")
    traj, _ = play(harness, task, policy=HarborHarness.scripted_action)
    assert "/work/input.txt" in traj.observations[0].text and "/app" not in traj.observations[0].text
    assert harness.compute_reward(traj) == 0.75
    assert harness.compute_reward(episode(harness, task, "ANSWER: done")) == 0.0


def test_the_agent_s_directories_links_and_file_modes_reach_the_verifier(harness, tmp_path):
    make_task(tmp_path, "layout", """\
        #!/bin/bash
        if [ -d out/empty ] && [ "$(readlink out/link)" = ../note.txt ] && [ -x out/run.sh ] && [ "$(out/run.sh)" = ran ]; then
          echo 1 > /logs/verifier/reward.txt
        else
          echo 0 > /logs/verifier/reward.txt
        fi
        """)
    [task] = HarborHarness.task_set({"tasks_dir": str(tmp_path)}).select("eval")
    make = "mkdir -p out/empty && echo hi > note.txt && ln -s ../note.txt out/link && printf 'echo ran\\n' > out/run.sh"
    assert harness.compute_reward(episode(harness, task, shell(f"{make} && chmod +x out/run.sh") + "\nANSWER: done")) == 1.0
    assert harness.compute_reward(episode(harness, task, shell(make) + "\nANSWER: done")) == 0.0  # run.sh not executable


def test_a_test_sh_that_cannot_judge_is_raised_but_one_that_ran_and_failed_scores_zero(harness, tmp_path):
    make_task(tmp_path, "silent", "#!/bin/bash\necho checked\n")
    make_task(tmp_path, "strict", "#!/bin/bash\nset -e\ngrep -q hello out.txt\necho 1 > /logs/verifier/reward.txt\n")
    make_task(tmp_path, "too-big", "#!/bin/bash\necho 7 > /logs/verifier/reward.txt\n")
    make_task(tmp_path, "needs-uv", "#!/bin/bash\nuvx pytest /tests\n")
    tasks = {t.meta["family"]: t for t in HarborHarness.task_set({"tasks_dir": str(tmp_path)}).select("eval")}
    verdict = harness.compute_reward(episode(harness, tasks["strict"], shell("echo bye > out.txt") + "\nANSWER: done"))
    assert isinstance(verdict, HarnessReward) and verdict.score == 0.0 and "exited 1" in verdict.detail
    for name, why in (("silent", "exited 0 without writing one"), ("too-big", "must be in \\[0, 1\\]"),
                      ("needs-uv", "a program it needs is missing")):
        with pytest.raises(VerifierFailed, match=why):
            harness.compute_reward(episode(harness, tasks[name], "ANSWER: done"))


def test_the_task_set_has_both_splits_a_content_version_and_refuses_what_it_cannot_run(tmp_path):
    tasks = HarborHarness.task_set({})
    assert [t.task_id for t in tasks.tasks] == [f"{s}/{n}" for n in SHIPPED for s in ("train", "eval")]
    assert tasks.version.startswith("harbor-") and HarborHarness.task_set({"tasks_dir": str(DEFAULT_TASKS_DIR)}) == tasks
    copy = tmp_path / "set"
    shutil.copytree(DEFAULT_TASKS_DIR / "count-lines", copy / "count-lines")
    toml = copy / "count-lines" / "task.toml"
    toml.write_text(toml.read_text().replace('category = "file-operations"', 'category = "file-operations"\nsplit = "eval"'))
    first = HarborHarness.task_set({"tasks_dir": str(copy)})
    assert [t.task_id for t in first.tasks] == ["eval/count-lines"]
    (copy / "count-lines" / "tests" / "grade.py").write_text("print(1)\n")  # a hidden file changed: a new version
    assert HarborHarness.task_set({"tasks_dir": str(copy)}).version != first.version
    make_task(tmp_path / "multi", "steps", "#!/bin/bash\n", toml='\n[[steps]]\nname = "one"\n')
    (tmp_path / "broken" / "no-tests").mkdir(parents=True)
    (tmp_path / "broken" / "no-tests" / "task.toml").write_text("")
    for options, message in (({"task_dir": "x"}, "unknown key"), ({"tasks_dir": str(tmp_path / "nope")}, "not a directory"),
                             ({"tasks_dir": str(tmp_path / "multi")}, "multi-step"),
                             ({"tasks_dir": str(tmp_path / "broken")}, "missing instruction.md, tests/test.sh")):
        with pytest.raises(ConfigError, match=message):
            HarborHarness.task_set(options)


def test_stage_5_passes_with_the_harbor_adapter(cli, write_yaml, quick_sets):
    write_yaml(f"harnesses:\n  - name: harbor\n    options: {{tasks_dir: '{DEFAULT_TASKS_DIR}'}}\n")
    result, data = cli.json("stage", "run", "5", *quick_sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:300]) for n, c in checks.items() if c["status"] == "fail"]
    for check in ("loads", "clean reset", "scripted episodes", "invalid actions", "one episode through the training path"):
        assert checks[f"harness harbor: {check}"]["status"] == "pass", check
    assert checks["harness harbor: scripted episodes"]["measured"] == {"families": 3, "mean_reward": 1.0}
    assert checks["harness harbor: one episode through the training path"]["measured"]["reward_source"] == "harness"


def test_stage_8_smoke_trains_on_the_three_shipped_harbor_tasks(cli, write_yaml, quick_sets):
    """Rewards vary within GRPO groups honestly: count-lines' tests give 0.2 of its reward for a final
    message of one line of at most 45 characters (the instruction asks for it; /logs/agent/final_answer.txt
    holds the agent's last reply when it gave no ANSWER line). The random tiny model never calls a
    tool, so it never earns the 0.8 for answer.txt, but its 16-token replies are sometimes within 45
    characters and sometimes not: outcomes 0.2 and 0.0. The other two tasks give it 0; with two groups
    a step the seeded sampler (rollout.seed) draws count-lines in the smoke's steps."""
    write_yaml(f"harnesses:\n  - name: harbor\n    options: {{tasks_dir: '{DEFAULT_TASKS_DIR}'}}\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "training.micro_batch_size=4")
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    varied = next(c for c in report["checks"] if c["name"] == "reward distribution not degenerate")
    assert varied["measured"]["max_group_std"] > 0


def test_a_tasks_dir_that_does_not_exist_stops_the_stage_at_load_with_exit_2(cli, write_yaml, tmp_path):
    write_yaml(f"harnesses:\n  - name: harbor\n    options: {{tasks_dir: '{tmp_path / 'nope'}'}}\n")
    result = cli("stage", "run", "5")
    assert result.exit_code == 2 and "tasks_dir" in result.stderr and "is not a directory" in result.stderr, result.stderr
