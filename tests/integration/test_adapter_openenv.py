"""OpenEnv both ways, with the real `openenv` package: its own server code serves the example
environments (`harnesses.adapters.openenv_example`) on loopback and the `openenv` harness plays them
through its own clients (reset, step, per-step reward and done read back; malformed actions answered
`invalid_action` without reaching the environment; MCP tools listed and called); the harness passes
stage 5 against a running server and trains through stage 8 smoke, also on a server started with
`create_app`'s defaults (one session at a time: its refusals are backpressure, waited out and
counted, and stage 5 reports its capacity as 1); and `agentrl serve env
terminal_like` answers the package's own client, a scripted solution earning training's full reward.

Why a random model's rewards vary in stage 8 (honestly): the environment is BriefReplyEnvironment
with `text_field: message`, so each reply (plain text from the random tiny model, 16 tokens) is the
action; the environment rewards a reply of 1 to 40-46 characters (the limit comes from the task's
seed). The tiny tokenizer's tokens run from one to many characters, so some replies of a GRPO group
fit under the limit and others do not.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from openenv.core import GenericEnvClient

from agentrl_cli.core.errors import ConfigError, EnvironmentBusy
from agentrl_cli.runtime.reward.scorer import DEFAULT_WEIGHTS
from harnesses.adapters.openenv import OpenEnvHarness
from harnesses.adapters.openenv_local import wait_healthy
from harnesses.base import Action, Observation, Trajectory
from harnesses.parsing import tool_call
from harnesses.task_sources import builtin_or_own
from harnesses.terminal_like import TerminalLike
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
EXAMPLE = "harnesses.adapters.openenv_example"
SERVE_GUESS = ("import sys, uvicorn\n"
               "from openenv.core.env_server.http_server import create_app\n"
               f"from {EXAMPLE} import GuessAction, GuessNumberEnvironment, GuessObservation\n"
               "app = create_app(GuessNumberEnvironment, GuessAction, GuessObservation, env_name='guess', max_concurrent_envs=32)\n"
               "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n")


def start(cmd: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, 120)
    except ConnectionError:
        proc.kill()
        raise AssertionError(f"server did not come up: {proc.communicate(timeout=10)[1][-2000:]}") from None
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def guess_url():
    """GuessNumberEnvironment served by the package's own `create_app` and uvicorn, in its own process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start([sys.executable, "-c", SERVE_GUESS, str(port)], url)
    yield url
    stop(proc)


def play(h: OpenEnvHarness, texts) -> tuple[Trajectory, list[Observation]]:
    task = OpenEnvHarness.task_set({"tasks": 2}).tasks[0]
    traj = Trajectory(task=task, observations=[h.reset(task)])
    for text in texts:
        action = Action(text=text if isinstance(text, str) else text(traj.observations[-1]))
        traj.actions.append(action)
        traj.observations.append(h.step(action))
        if traj.observations[-1].done:
            break
    return traj, traj.observations[1:]


def bisect(obs: Observation) -> str:
    return tool_call("step", guess=(obs.data["low"] + obs.data["high"]) // 2)


def test_guessing_by_bisection_reads_back_each_step_reward_and_ends_with_reward_1(guess_url):
    h = OpenEnvHarness(url=guess_url)
    try:
        assert [t["function"]["name"] for t in h.tools()] == ["step"]
        assert h.tools()[0]["function"]["parameters"]["required"] == ["guess"]
        traj, steps = play(h, [bisect] * 7)
        assert steps[-1].done and json.loads(steps[-1].text)["feedback"] == "correct"
        assert [s.info["reward"] for s in steps] == [0.0] * (len(steps) - 1) + [1.0]
        assert [s.data["guesses_left"] for s in steps] == list(range(6, 6 - len(steps), -1))
        assert h.compute_reward(traj) == 1.0
        number = steps[-1].data["low"]
        wrong = number + 1 if number < 100 else number - 1
        traj, steps = play(h, [tool_call("step", guess=wrong)] * 7)  # the same task: the same number
        assert len(steps) == 7 and steps[-1].done and h.compute_reward(traj) == 0.0
    finally:
        h.close()


def test_malformed_actions_are_invalid_and_never_reach_the_environment(guess_url):
    h = OpenEnvHarness(url=guess_url)
    try:
        bad = ["hello", "<tool_call>{oops</tool_call>", tool_call("rm_rf", path="/"), tool_call("step", guess="abc"),
               tool_call("step", guess=3, extra=1)]
        _, steps = play(h, bad + [tool_call("step", guess=50)])
        assert [s.status for s in steps[:-1]] == ["invalid_action"] * len(bad) and not any(s.done for s in steps[:-1])
        assert "VALIDATION_ERROR" in steps[3].text  # the server's schema refused it; the others were never sent
        assert steps[-1].data["guesses_left"] == 6  # the environment saw one guess: the valid one
    finally:
        h.close()


def test_a_text_field_the_action_lacks_is_refused_naming_the_action_fields(guess_url):
    h = OpenEnvHarness(url=guess_url, text_field="message")
    try:
        with pytest.raises(ConfigError, match="not a field of the environment's action \\(guess\\)"):
            h.reset(OpenEnvHarness.task_set({}).tasks[0])
    finally:
        h.close()


def add_the_numbers(obs: Observation) -> str:
    a, b = map(int, re.search(r"(\d+) \+ (\d+)", obs.text).groups())
    return tool_call("add", a=a, b=b)


def test_an_mcp_environment_offers_its_mcp_tools_and_scores_the_submitted_sum():
    h = OpenEnvHarness(env=f"{EXAMPLE}:AdditionToolsEnvironment")  # started by the adapter on loopback
    try:
        assert sorted(t["function"]["name"] for t in h.tools()) == ["add", "submit"]
        traj, steps = play(h, [add_the_numbers, lambda o: tool_call("submit", answer=o.data["result"]["data"])])
        a, b = map(int, re.search(r"(\d+) \+ (\d+)", traj.observations[0].text).groups())
        assert steps[0].calls[0].name == "add" and json.loads(steps[0].text)["result"] == a + b and not steps[0].done
        assert steps[1].done and steps[1].info["reward"] == 1.0 and h.compute_reward(traj) == 1.0
        _, steps = play(h, [tool_call("multiply", a=1, b=2)])
        assert steps[0].status == "invalid_action"
        url = h._service.url
    finally:
        h.close()
    with pytest.raises(ConnectionError):
        wait_healthy(url, 0.5)  # close() stopped the adapter's own server


def test_episode_reward_is_rescaled_from_reward_range_and_refused_outside_it():
    h = OpenEnvHarness(url="http://127.0.0.1:9", reward_range=[-1, 1], episode_reward="sum")  # never connects
    task = OpenEnvHarness.task_set({}).tasks[0]
    traj = Trajectory(task=task, observations=[Observation(text="")] + [
        Observation(text="", info={"openenv_rewards": [r]}) for r in (0.25, None, 0.25)])
    assert h.compute_reward(traj) == 0.75
    traj.observations.append(Observation(text="", info={"openenv_rewards": [2.0]}))
    with pytest.raises(ConfigError, match="outside reward_range"):
        h.compute_reward(traj)
    assert h.compute_reward(Trajectory(task=task)) == 0.0  # no reward reported: nothing earned
    with pytest.raises(ConfigError, match="known options"):
        OpenEnvHarness(urll="http://127.0.0.1:9")


def test_openenv_harness_on_a_running_server_passes_stage_5(cli, write_yaml, quick_sets, guess_url):
    write_yaml(f"harnesses:\n  - name: openenv\n    options: {{url: '{guess_url}', tasks: 4}}\n")
    result, data = cli.json("stage", "run", "5", *quick_sets)
    report = data["reports"][0]
    checks = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0, [(n, str(c["detail"])[:300]) for n, c in checks.items() if c["status"] == "fail"]
    for check in ("loads", "clean reset", "invalid actions"):
        assert checks[f"harness openenv: {check}"]["status"] == "pass", check
    assert checks["harness openenv: loads"]["measured"]["reward"] == "harness"
    episode = checks["harness openenv: one episode through the training path"]
    assert episode["status"] == "pass" and episode["measured"]["verifier"] == "harness"


def test_openenv_harness_trains_through_stage_8_smoke_on_the_random_tiny_model(cli, write_yaml, quick_sets):
    options = {"env": f"{EXAMPLE}:BriefReplyEnvironment", "text_field": "message", "tasks": 8,
               "prompt": "Follow the instruction below; your reply is the message."}
    write_yaml(f"harnesses:\n  - name: openenv\n    options: {json.dumps(options)}\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "rollout.max_steps_per_trajectory=1")
    report = data["reports"][-1]
    failing = [(c["name"], str(c["detail"])[:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    spread = next(c for c in report["checks"] if c["name"] == "reward distribution not degenerate")
    assert spread["measured"]["max_group_std"] > 0


@needs_bwrap
def test_serve_env_answers_the_packages_own_client_and_pays_training_reward_for_a_scripted_solution():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agentrl = [sys.executable, "-m", "agentrl_cli", "serve", "env", "terminal_like", "--port", str(port)]
    proc = start(agentrl, url)
    task = next(t for t in builtin_or_own("terminal_like").select("eval") if t.meta["family"] == "count_matches")
    try:
        client = GenericEnvClient(base_url=url).sync()
        with client:
            first = client.reset(task_id=task.task_id)
            assert first.observation["text"].startswith(task.prompt) and not first.done
            assert [t["function"]["name"] for t in first.observation["tools"]] == ["run_shell"]
            shell = client.step({"text": TerminalLike.scripted_action(task, 0)})
            assert not shell.done and shell.reward == 0.0 and shell.observation["calls"][0]["name"] == "run_shell"
            assert shell.observation["text"].splitlines()[1] == str(task.answer)
            final = client.step({"text": TerminalLike.scripted_action(task, 1)})
            assert final.done and final.metadata["components"]["outcome"] == 1.0 and final.metadata["outcome"] == "success"
            assert final.reward == pytest.approx(sum(DEFAULT_WEIGHTS.values()))  # training's reward: every component 1
            client.reset(task_id=task.task_id)
            wrong = client.step({"text": TerminalLike.wrong_action(task)})
            assert wrong.done and wrong.metadata["components"]["outcome"] == 0.0
            assert wrong.reward == pytest.approx(final.reward - DEFAULT_WEIGHTS["outcome"])
            assert client.step({"text": "ANSWER: 1"}).observation["status"] == "invalid_action"  # no episode open
    finally:
        stop(proc)


SERVE_ONE_SESSION = ("import sys, uvicorn\n"
                     "from openenv.core.env_server.http_server import create_app\n"
                     f"from {EXAMPLE} import ReplyAction, BriefReplyEnvironment, ReplyObservation\n"
                     "app = create_app(BriefReplyEnvironment, ReplyAction, ReplyObservation, env_name='brief')\n"
                     "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n")


@pytest.fixture(scope="module")
def one_session_url():
    """BriefReplyEnvironment served by `create_app` with the package's defaults (one session at a time), in its own process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start([sys.executable, "-c", SERVE_ONE_SESSION, str(port)], url)
    yield url
    stop(proc)


def test_a_one_session_server_trains_through_stage_8_smoke_its_refusals_counted_as_backpressure(
        cli, write_yaml, quick_sets, one_session_url):
    options = {"url": one_session_url, "text_field": "message", "tasks": 8,
               "prompt": "Follow the instruction below; your reply is the message."}
    write_yaml(f"harnesses:\n  - name: openenv\n    options: {json.dumps(options)}\n")
    result, data = cli.json("stage", "run", "8", *quick_sets, "--set", "rollout.max_steps_per_trajectory=1")
    report = data["reports"][-1]
    failing = [(c["name"], str(c["detail"])[:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    backpressure = next(c for c in report["checks"] if c["name"] == "environment backpressure")
    assert backpressure["measured"]["openenv"]["refusals"] >= 1
    assert backpressure["measured"]["openenv"]["capacity"] == 1


def test_a_second_session_on_a_one_session_server_is_refused_as_busy_naming_capacity_1(one_session_url):
    first, second = OpenEnvHarness(url=one_session_url), OpenEnvHarness(url=one_session_url)
    task = OpenEnvHarness.task_set({}).tasks[0]
    try:
        first.reset(task)
        assert first.capacity(8) == 1  # learnt by opening a second session, which the server refused
        with pytest.raises(EnvironmentBusy) as refused:
            second.reset(task)
        assert refused.value.capacity == 1 and second._client is None  # it holds no session while it waits
        first.close()
        assert second.reset(task).text.startswith(task.prompt)  # the session freed: the next try gets it
    finally:
        first.close()
        second.close()


def test_stage_5_reports_a_one_session_servers_capacity_as_1_and_the_runs_concurrency(
        cli, write_yaml, quick_sets, one_session_url):
    write_yaml(f"harnesses:\n  - name: openenv\n    options: {{url: '{one_session_url}', text_field: message, tasks: 4}}\n")
    _, data = cli.json("stage", "run", "5", *quick_sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    capacity = checks["harness openenv: capacity"]
    assert capacity["status"] == "info" and capacity["measured"] == {"capacity": 1, "concurrency": 1}
    played = checks["harness openenv: concurrency"]  # played at that concurrency: one session, nothing refused or left
    assert played["status"] == "pass", played["detail"]
    assert played["measured"]["concurrency"] == 1 and played["measured"]["episodes"] == 2 and played["measured"]["failures"] == 0
