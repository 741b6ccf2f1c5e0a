"""The token-exact check as a rollout counter: every finished episode is compared with a fresh
render of its conversation (`token_exact_episodes`, `token_exact_mismatches` in the controller's
counters), against the real embedded server; a template that rewrites history is counted."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.conftest import needs_bwrap
from tests.integration.test_rollout import make_controller, run_closing
from tests.unit.test_model_chat import REWRITES

pytestmark = [pytest.mark.integration, needs_bwrap]


def _episodes(ctl) -> int:
    async def go():
        await ctl.run(asyncio.Event(), max_groups=2)
    try:
        run_closing(ctl, go())
    finally:
        ctl.close()
    return sum(v for k, v in ctl.counters.items() if k.startswith("termination_"))


def test_every_episode_is_checked_and_a_history_rewriting_template_is_counted(server, random_model_dir, tmp_path):
    ctl, writer = make_controller(server, random_model_dir, tmp_path / "a", harnesses=("tool_api_like",))
    ctl.tokenizer.chat_template = REWRITES
    try:
        episodes = _episodes(ctl)
    finally:
        writer.close()
    assert episodes == 4 and ctl.counters["token_exact_episodes"] == episodes
    multi_turn = ctl.counters["env_calls"] - episodes  # steps taken; more than one per episode rewrites history
    assert multi_turn > episodes and ctl.counters["token_exact_mismatches"] > 0
