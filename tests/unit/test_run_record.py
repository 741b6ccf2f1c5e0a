"""The one reader of a run directory: which loop is judged, which trajectories belong to it (the one
phase filter verify, troubleshoot and the report share), and the one console view of checks."""

from __future__ import annotations

import json

from rich.console import Console

from agentrl_cli.config import load_config
from agentrl_cli.acceptance.run_record import load_record
from agentrl_cli.core.outcomes import Phase
from agentrl_cli.cli.render import render_checks
from agentrl_cli.core.report import Check, atomic_write_text
from agentrl_cli.acceptance.run_meta import create_run


def _run(tmp_path, *dirs: str):
    loaded = load_config(None, [f"observe.runs_dir={tmp_path / 'runs'}"], env={})
    run = create_run(loaded, command=["test"])
    for d in dirs:
        rows = [{"step": 0, "eval/terminal_like/success_rate": 0.1},
                *({"step": i, "train/loss": 0.5, "reward/mean": 0.1 * i} for i in range(1, 5)),
                {"step": 4, "eval/terminal_like/success_rate": 0.4}]
        atomic_write_text(run.path / d / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_verify_s_own_run_is_judged_first_and_only_its_trajectories_count(tmp_path):
    record = load_record(_run(tmp_path, "stage8", "verify"))
    assert record.training_dir.name == "verify" and record.has_training and record.column("reward/mean")[-1] == 0.4
    assert record.eval_rates() == {"terminal_like": [(0, 0.1), (4, 0.4)]}
    assert [p for p in Phase if record.judged_phase(p)] == [Phase.VERIFY]
    assert record.shown_log()[0] == "stage8"  # the report draws stage 8's curves


def test_without_verify_s_run_stage_8_is_judged_and_the_other_loops_are_left_out(tmp_path):
    record = load_record(_run(tmp_path, "stage8"))
    assert record.training_dir.name == "stage8"
    judged = {p for p in Phase if record.judged_phase(p)}
    assert judged == {Phase.TRAIN, Phase.EVAL, Phase.SMOKE, Phase.SHORT, Phase.FULL}


def test_a_run_with_nothing_recorded_reads_as_empty(tmp_path):
    record = load_record(_run(tmp_path))
    assert record.training_dir is None and not record.has_training and record.shown_log() == ("", [])


def test_every_command_shows_checks_through_one_view():
    console = Console(record=True, width=200)
    render_checks(console, {"connectivity": [Check.judge("reward service", False, None, "reachable", "agentrl serve reward")],
                            "performance": [Check.skipped("tokens/s", "no baseline")]}, "agentrl verify")
    text = console.export_text()
    assert "layer" in text and "connectivity" in text and "✗ reward service" in text and "what to do: agentrl serve reward" in text
    assert "○ tokens/s: no baseline" in text and text.count("what to do") == 1  # a skip's reason is not repeated as its hint
