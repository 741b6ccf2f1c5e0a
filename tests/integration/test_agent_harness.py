"""The `agent` harness: agents written with the openai SDK, the OpenAI Agents SDK (Responses API) and
the anthropic SDK (Messages API) (tests/agents/, never importing agentrl) trained as they are through
the run's recording gateway. Stage 8 smoke passes with one (the other two alone, stage 5 and stage 8,
under the `long` marker: CI plays them together in test_agent_catalogue.py); stage 5
checks a sandboxed command agent (reaching the gateway through the allowlist and nothing else) and
an agent that posts its own reward, token-exact; a history-rewriting agent trains one sample per
segment; the gateway admits no more sessions than the run's staleness limit allows; an agent that
raises, or makes no call, is masked and counted.

The tasks are the shipped `brief` set: "at most 43 characters", checked by the `regex` verifier on
the final answer's length, which a random tiny model's 16-token replies meet about half the time,
so rewards vary within groups honestly (as tests/integration/test_third_party_harness.py's)."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest

from agentrl_cli.config import load_config
from harnesses.agent import AgentHarness
from agentrl_cli.runtime.data.writer import find_trajectory, read_records
from agentrl_cli.runtime.observe.step_metrics import read_rows
from agentrl_cli.run.training_run import TrainingRun
from tests.conftest import free_port
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration]
AGENTS = Path(__file__).resolve().parents[1] / "agents"
HERE = "tests.integration.test_agent_harness"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
           {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_the_agents_are_plain_sdk_clients_that_never_import_agentrl():
    for name in ("openai_agent.py", "rewriting_agent.py", "posting_agent.py", "command_agent.py", "agents_sdk_agent.py",
                 "anthropic_agent.py"):
        mods = imported_modules(AGENTS / name)
        assert not {"agentrl_cli", "harnesses", "tests"} & mods, (name, mods)
    assert "openai" in imported_modules(AGENTS / "openai_agent.py")
    assert "agents" in imported_modules(AGENTS / "agents_sdk_agent.py")
    assert "anthropic" in imported_modules(AGENTS / "anthropic_agent.py")


def test_an_openai_sdk_agent_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n  - name: agent\n    options: {entry: 'tests.agents.openai_agent:run', tasks: brief}\n")
    # two groups of four a step: with about half the replies short enough, every group of a step
    # all-equal by chance (a degenerate smoke) is about 1 in 4,000 instead of 1 in 8 with one pair
    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",
            "--set", "training.gradient_accumulation_steps=2"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *quick_sets, *wide)
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 4  # 2 smoke steps, then 2 more after the resume
    last = rows[-1]
    assert last["gateway/calls"] >= 2 * last["gateway/closed_sessions"] > 0  # two calls an episode, all recorded
    assert last["rollout/token_exact_mismatches"] == 0 and last["rollout/token_exact_episodes"] > 0
    assert last["gateway/non_prefix_calls"] == 0 and last["gateway/unauthorized"] == 0
    assert last["gateway/agent/malformed_tool_calls"] <= last["gateway/malformed_tool_calls"]  # counted per harness
    records = [r for r in read_records(_store()) if r.harness == "agent"]
    assert records and all(r.reward_status in ("ok", "fail") for r in records)
    split = [(r.segment_starts, [(s.action[:120], [(c.name, c.arguments) for c in s.tool_calls], s.observation[:80], s.observation_status) for s in r.steps])
             for r in records if r.segment_starts]
    assert {len(r.steps) for r in records} == {2} and not split, split
    assert len({r.reward for r in records}) > 1  # the final answer's length decides: rewards vary


@pytest.mark.long  # in CI, test_agent_catalogue.py plays it beside the other catalogued agents in one run
def test_the_openai_agents_sdk_agent_passes_stage_5_token_exact_over_the_responses_api(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n  - name: agent\n    options: {entry: 'tests.agents.agents_sdk_agent:run', tasks: brief}\n")
    result, data = cli.json("stage", "run", "5", *quick_sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:300]) for n, c in checks.items() if c["status"] == "fail"]
    for check in ("loads", "one episode through the training path", "token-exact through the gateway"):
        assert checks[f"harness agent: {check}"]["status"] == "pass", check
    exact = checks["harness agent: token-exact through the gateway"]["measured"]
    assert exact["calls"] >= 1 and exact["mismatches"] == 0
    (record,) = [r for r in read_records(_store()) if r.harness == "agent"][:1]
    assert record.steps and record.steps[0].action  # the streamed text (cut at max_tokens) is the step's action


@pytest.mark.long
def test_the_openai_agents_sdk_agent_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    write_yaml("harnesses:\n  - name: agent\n    options: {entry: 'tests.agents.agents_sdk_agent:run', tasks: brief}\n")
    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",
            "--set", "training.gradient_accumulation_steps=2"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *quick_sets, *wide)
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    last = rows[-1]
    assert last["gateway/calls"] >= last["gateway/closed_sessions"] > 0
    assert last["rollout/token_exact_mismatches"] == 0 and last["rollout/token_exact_episodes"] > 0
    assert last["gateway/non_prefix_calls"] == 0 and last["gateway/unauthorized"] == 0
    records = [r for r in read_records(_store()) if r.harness == "agent"]
    assert len({r.reward for r in records}) > 1  # the streamed answer's length decides: rewards vary


ANTHROPIC_AGENT = "harnesses:\n  - name: agent\n    options: {entry: 'tests.agents.anthropic_agent:run', tasks: brief}\n"


@pytest.mark.long  # in CI, test_agent_catalogue.py plays it beside the other catalogued agents in one run
def test_stage_5_checks_an_anthropic_sdk_agent_token_exact(cli, write_yaml, quick_sets):
    """The Messages API agent (tests/agents/anthropic_agent.py): its two calls recorded token-exact
    through the gateway, its episode through the training path."""
    write_yaml(ANTHROPIC_AGENT)
    result, data = cli.json("stage", "run", "5", *quick_sets)
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:200]) for n, c in checks.items() if c["status"] == "fail"]
    for check in ("loads", "one episode through the training path", "token-exact through the gateway"):
        assert checks[f"harness agent: {check}"]["status"] == "pass", check
    exact = checks["harness agent: token-exact through the gateway"]["measured"]
    assert exact["calls"] == 2 and exact["mismatches"] == 0


@pytest.mark.long  # about 40 s: CI's budget has no room for a second agent's smoke training
def test_an_anthropic_sdk_agent_trains_through_stage_8_smoke(cli, write_yaml, quick_sets):
    write_yaml(ANTHROPIC_AGENT)
    wide = ["--set", "rollout.group_size=4", "--set", "training.micro_batch_size=4",  # rewards vary: as above
            "--set", "training.gradient_accumulation_steps=2"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *quick_sets, *wide)
    report = data["reports"][-1]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    rows = [r for r in read_rows(Path("runs") / report["run_id"] / "stage8" / "metrics.jsonl") if "train/loss" in r]
    last = rows[-1]
    assert last["gateway/calls"] >= 2 * last["gateway/closed_sessions"] > 0
    assert last["rollout/token_exact_mismatches"] == 0 and last["rollout/token_exact_episodes"] > 0
    assert last["gateway/non_prefix_calls"] == 0 and last["gateway/unauthorized"] == 0
    records = [r for r in read_records(_store()) if r.harness == "agent"]
    assert records and {len(r.steps) for r in records} == {2} and all(r.segment_starts == [] for r in records)


def _store():
    from agentrl_cli.config.models import DataConfig
    from agentrl_cli.runtime.data.stores import open_store

    return open_store(DataConfig())  # data.root's default, under the test's working directory


@needs_bwrap
def test_stage_5_checks_a_sandboxed_command_agent_and_a_reward_posting_agent_token_exact(cli, write_yaml, quick_sets):
    inference_port = next(s.split("=", 1)[1] for s in quick_sets if s.startswith("inference.port="))
    write_yaml(f"""harnesses:
  - name: agent
    options:
      command: python3 command_agent.py {inference_port}
      files: ['{AGENTS / "command_agent.py"}']
      collect: [reach.txt]
      tasks: brief
  - name: 'harnesses.agent:AgentHarness'
    reward: harness
    options: {{entry: 'tests.agents.posting_agent:run', tasks: brief}}
""")
    result, data = cli.json("stage", "run", "5", *quick_sets, "--set", "stages.sandbox_concurrency=2")
    checks = {c["name"]: c for c in data["reports"][0]["checks"]}
    assert result.exit_code == 0, [(n, c["detail"][:200]) for n, c in checks.items() if c["status"] == "fail"]
    for name in ("agent", "harnesses.agent:AgentHarness"):
        for check in ("loads", "clean reset", "invalid actions", "one episode through the training path",
                      "token-exact through the gateway"):
            assert checks[f"harness {name}: {check}"]["status"] == "pass", (name, check)
        exact = checks[f"harness {name}: token-exact through the gateway"]["measured"]
        assert exact["calls"] >= 1 and exact["mismatches"] == 0
    assert checks["harness agent: token-exact through the gateway"]["measured"]["calls"] == 2
    posted = checks["harness harnesses.agent:AgentHarness: one episode through the training path"]["measured"]
    assert posted["reward_source"] == "harness" and posted["verifier"] == "harness"

    stored = {r.harness: r for r in read_records(_store())}
    scored = stored["harnesses.agent:AgentHarness"]  # the agent's own judgement of its answer is the outcome
    assert scored.reward_components["outcome"] == (0.75 if 0 < len(scored.final_answer or "") <= 43 else 0.25)
    command = stored["agent"]
    reach = {a.path: a.content for a in command.artifacts}["reach.txt"]
    assert reach.split() == [inference_port, "unreachable"]  # the gateway, through the allowlist, and nothing else
    assert len(command.steps) == 2 and command.steps[0].action


def _config(tmp_path, model_dir, harnesses: list[dict], **sets) -> object:
    base = {"inference.port": free_port(), "inference.max_new_tokens": 16, "rollout.concurrency": 4, "rollout.group_size": 2,
            "rollout.mode": "sync", "training.micro_batch_size": 4, "training.checkpoint_interval_steps": 100,
            "data.root": str(tmp_path / "store"), "model.path": str(model_dir), **sets}
    return load_config(None, [f"{k}={v}" for k, v in base.items()] + [f"harnesses={json.dumps(harnesses)}"], env={}).config


def test_a_history_rewriting_agent_trains_one_sample_per_segment(tmp_path, random_model_dir):
    cfg = _config(tmp_path, random_model_dir, [{"name": "agent", "options": {"entry": "tests.agents.rewriting_agent:run",
                                                                              "tasks": "brief"}}])

    async def go():
        run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="rewrite")
        try:
            await run.start()
            return await run.run(1), run.writer.store
        finally:
            await run.close()
    summary, store = asyncio.run(go())
    row = summary.metrics[-1]
    assert row["rollout/episodes_trained"] == 4 and row["rollout/samples_built"] == 8 == row["train/samples"]
    assert row["gateway/non_prefix_calls"] == 4 and row["rollout/token_exact_mismatches"] == 0  # the streamed calls too
    [record] = [r for r in read_records(store)][:1]
    again = find_trajectory(store, record.trajectory_id)  # as a resumed run reads it back
    assert len(again.segment_starts) == 2 and again.segment_starts[0] == 0
    first, second = again.segment_starts[1], len(again.token_ids)
    assert 0 < first < second and sum(again.loss_mask[:first]) > 0 and sum(again.loss_mask[first:]) > 0
    from agentrl_cli.run.loop.samples import episode_samples

    samples = episode_samples(again, 0.5)
    assert [len(s.token_ids) for s in samples] == [first, second - first]
    assert all(s.advantage == 0.5 for s in samples)


def raising_agent(task, base_url, api_key):
    raise ConnectionError("the agent's own tool service is down")


async def silent_agent(task, base_url, api_key):
    return "I answer without asking the model"


def leaving_agent(task, base_url, api_key):
    """Reads the first content event of a long streamed call, then goes away (closes the connection)."""
    from tests.integration.streaming import first_content_then_leave

    body = {"model": "policy", "messages": [{"role": "user", "content": task["prompt"]}], "max_tokens": 256,
            "ignore_eos": True, "stream": True}
    first_content_then_leave(f"{base_url}/chat/completions", body, {"Authorization": f"Bearer {api_key}"})
    return "I left"


class LeavingHarness(AgentHarness):
    """The agent harness under a third name, for `leaving_agent`."""


def test_an_agent_that_raises_makes_no_call_or_leaves_a_stream_is_masked_and_counted(tmp_path, random_model_dir):
    cfg = _config(tmp_path, random_model_dir, [{"name": "agent", "options": {"entry": f"{HERE}:raising_agent", "tasks": "brief"}},
                                                {"name": "harnesses.agent:AgentHarness",
                                                 "options": {"entry": f"{HERE}:silent_agent", "tasks": "brief"}},
                                                {"name": f"{HERE}:LeavingHarness",
                                                 "options": {"entry": f"{HERE}:leaving_agent", "tasks": "brief"}}],
                  **{"inference.max_new_tokens": 256})

    async def go():
        from agentrl_cli.runtime.rollout.sampler import Draw
        from harnesses.task_sources import task_set

        with_run = TrainingRun(cfg, tmp_path / "run", random_model_dir, run_id="fail", trainer=False)
        try:
            await with_run.start()
            out = {}
            for h in cfg.harnesses:
                task = task_set(h, cfg.data).select("train")[0]
                out[h.name] = await with_run.controller.play(Draw(task, f"g-{len(out)}", 0, 0))
            return out, dict(with_run.controller.counters)
        finally:
            await with_run.close()
    played, counters = asyncio.run(go())
    (raised, raised_score, _), (silent, silent_score, _) = played["agent"], played["harnesses.agent:AgentHarness"]
    assert raised.termination == "infra_error" and raised.harness_error[0] == "agent"
    assert "ConnectionError: the agent's own tool service is down" in raised.error and raised_score.masked
    assert counters["env/agent/harness_errors/agent"] == 1
    assert silent.termination == "infra_error" and silent.harness_error is None and silent_score.masked
    assert "agent_made_no_call" in silent_score.flags and "made no call" in silent.error
    left, left_score, _ = played[f"{HERE}:LeavingHarness"]  # its call aborted, never recorded half: masked
    assert left.termination == "infra_error" and "stream_aborted" in left_score.flags and left_score.masked
    assert left.harness_error is None and not left.trajectory.actions and "mid-stream" in left.error


def test_the_gateway_admits_no_more_sessions_than_the_staleness_limit_allows(tmp_path, random_model_dir):
    from transformers import AutoTokenizer

    from agentrl_cli.engines.gateway.backend import ClientBackend
    from agentrl_cli.engines.gateway.service import Backpressure, Gateway
    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.runtime.rollout.buffer import Episode, TrajectoryBuffer
    from agentrl_cli.runtime.rollout.controller import RolloutController

    cfg = _config(tmp_path, random_model_dir, [{"name": "agent"}], **{"rollout.buffer_size": 8})
    buffer = TrajectoryBuffer(cfg.rollout.buffer_size, cfg.rollout.max_staleness, cfg.rollout.group_size)
    controller = RolloutController(cfg, None, None, None, None, buffer, run_id="limit")
    backend = ClientBackend(InferenceClient(["http://127.0.0.1:9"]), AutoTokenizer.from_pretrained(str(random_model_dir)))
    gateway = Gateway(backend, limit=controller.agent_allowance)
    try:
        controller.lead_limit = lambda: 3  # the trainer can take 3 more episodes before they pass max_staleness
        opened = [gateway.open_session() for _ in range(3)]
        with pytest.raises(Backpressure):
            gateway.open_session()

        async def fill():  # two of them finished and are buffered, still trainable (their group is complete)
            for i in range(2):
                await buffer.put(Episode("g0", None, 0, 1.0))
        asyncio.run(fill())
        gateway.close_session(opened[0].id)
        assert controller.agent_allowance() == 1 and gateway.open_sessions() == 2
        with pytest.raises(Backpressure):
            gateway.open_session()
        controller.side_playing = 1  # an evaluation episode playing beside the loop gets its own room
        gateway.close_session(opened[1].id)
        gateway.open_session()
        assert gateway.stats()["gateway/refused_sessions"] == 2
    finally:
        controller.close()
