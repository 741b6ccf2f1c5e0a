"""The stage API: every check runs contained, values pass between checks one way, derived configs
are validated, and statuses are one typed vocabulary that reads and writes as plain strings."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.core.errors import ConfigError
from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.acceptance.run_meta import create_run


@pytest.fixture
def ctx(tmp_path):
    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}"], env={})
    return StageContext(loaded=loaded, run=create_run(loaded, command=["test"]), stage=9, title="test stage")


def boom():
    raise RuntimeError("disk on fire")


def test_a_status_is_its_string_in_both_directions():
    check = Check("a", "pass")
    assert check.status is CheckStatus.PASS and check.status == "pass"
    assert json.loads(json.dumps({"status": check.status})) == {"status": "pass"}


def test_a_probe_of_several_checks_that_raises_is_one_failing_check(ctx):
    two = [Check.judge("a", True, 1, "1", "n/a"), Check.judge("b", True, 1, "1", "n/a")]
    assert ctx.checks("probe", lambda: two) == two
    [crashed] = ctx.checks("probe", boom)
    assert crashed.name == "probe" and crashed.status == CheckStatus.FAIL and "RuntimeError: disk on fire" in crashed.detail


def test_a_produced_value_reaches_later_checks_and_is_none_when_its_check_raised(ctx):
    found, value = ctx.produce("resolves", lambda: (Check.judge("resolves", True, 1, "1", "n/a"), 42))
    assert [c.status for c in found] == ["pass"] and value == 42
    found, value = ctx.produce("resolves", boom)
    assert value is None and found[0].status == CheckStatus.FAIL and "Traceback" in found[0].detail
    found, _ = ctx.produce("resolves", lambda: ("not a check", 1))
    assert found[0].status == CheckStatus.FAIL and "returned no Check" in found[0].detail


def test_async_checks_are_contained_the_same_way(ctx):
    async def ok():
        return Check.judge("served", True, 1, "1", "n/a")

    async def broken():
        raise ValueError("server gone")

    async def producing():
        return [Check.judge("served", True, 1, "1", "n/a")], "model"

    assert asyncio.run(ctx.acheck("served", ok)).status == CheckStatus.PASS
    crashed = asyncio.run(ctx.acheck("served", broken))
    assert crashed.status == CheckStatus.FAIL and "ValueError: server gone" in crashed.detail
    assert asyncio.run(ctx.aproduce("served", producing))[1] == "model"
    assert asyncio.run(ctx.aproduce("served", broken))[1] is None


def test_a_derived_config_is_validated_like_a_set_override(ctx):
    derived = ctx.derive({"rollout.group_size": 2, "training.world_size": 1}, "stage 9 recipe")
    assert derived.rollout.group_size == 2 and derived.training.world_size == 1 and ctx.config.rollout.group_size == 4
    assert ctx.derive({}, "nothing") is ctx.config
    with pytest.raises(ConfigError, match="stage 9 recipe"):
        ctx.derive({"rollout.group_size": -1}, "stage 9 recipe")
    with pytest.raises(ConfigError):
        ctx.derive({"rollout.no_such_key": 1}, "stage 9 recipe")
