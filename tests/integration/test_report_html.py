"""The run report renders in a real browser: headless Chromium loads the self-contained HTML with no
network, takes a screenshot, finds every figure decoded and sees no console error. The run here is
written by the real MetricsLog and HarnessStats with figures for every plot; the report of a live
stage 8 run is rendered the same way in tests/e2e/test_observe_live_run.py."""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from agentrl_cli.runtime.observe.harness_stats import HarnessStats
from agentrl_cli.acceptance.run_report import PLOTS, write_report
from agentrl_cli.runtime.observe.step_metrics import MetricsLog, read_rows, step_row
from agentrl_cli.runtime.observe.watchdog import Watchdog
from agentrl_cli.core.report import Check, StageReport

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (bash .ci/setup --dev installs it)")
WIDTH, HEIGHT = 1400, 4200


def render_in_chromium(html: Path, out_dir: Path) -> dict:
    """Screenshot and rendered DOM of `html` in headless Chromium (no network), with its console messages."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-extensions", "--enable-logging=stderr", "--v=0", f"--user-data-dir={out_dir / 'profile'}",
            "--virtual-time-budget=5000", f"--window-size={WIDTH},{HEIGHT}"]
    shot = out_dir / "report.png"
    taken = subprocess.run([*base, f"--screenshot={shot}", html.resolve().as_uri()], capture_output=True, text=True,
                           timeout=180)
    dumped = subprocess.run([*base, "--dump-dom", html.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    console = [ln for ln in (taken.stderr + dumped.stderr).splitlines() if ":CONSOLE" in ln]
    check = re.search(r'<div id="render-check"([^>]*)>', dumped.stdout)
    attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', check.group(1))) if check else {}
    png = shot.read_bytes() if shot.exists() else b""
    size = struct.unpack(">II", png[16:24]) if png[:8] == b"\x89PNG\r\n\x1a\n" else None
    return {"screenshot": shot, "png_size": size, "png_bytes": len(png), "dom": dumped.stdout, "console": console,
            "check": attrs, "figures": re.findall(r"<figure data-plot=\"([a-z_]+)\" data-empty=\"(true|false)\"", dumped.stdout)}


class _Controller:
    def __init__(self) -> None:
        self.counters, self.in_flight, self.timers = Counter(tokens_generated=0), 3, {"generate_s": 0.0, "env_s": 0.0}


class _Buffer(list):
    capacity = 8

    def __init__(self) -> None:
        super().__init__([1, 2])
        self.counters = Counter(dropped_stale=0)


def write_run(run: Path, steps: int = 6) -> Path:
    """A run directory as a training loop writes it: meta.json, a stage report, and metrics.jsonl rows
    from the real step_row, HarnessStats and MetricsLog (with evaluation rows every 3 steps)."""
    (run / "stage8").mkdir(parents=True)
    (run / "reports").mkdir()
    (run / "meta.json").write_text(json.dumps({"run_id": run.name, "created_at": "2026-12-01T00:00:00+00:00",
                                               "config_hash": "abc123", "harnesses": [
                                                   {"name": "terminal_like", "held_out": False},
                                                   {"name": "tool_api_like", "held_out": True}]}))
    checks = [Check("loss finite", "pass", [1.0, 0.9], "every loss finite"),
              Check("reward distribution not degenerate", "fail", {"std": 0.0}, "std > 0", hint="raise rollout.group_size")]
    report = StageReport(stage=8, title="training", status="fail", checks=checks, started_at="2026-12-01T00:00:00+00:00",
                         duration_s=12.5, run_id=run.name, config_hash="abc123", environment={})
    (run / "reports" / "stage-8.json").write_text(json.dumps(report.to_dict()))
    log, stats, ctl, buf, rng = MetricsLog(run / "stage8" / "metrics.jsonl"), HarnessStats(), _Controller(), _Buffer(), random.Random(0)
    for step in range(1, steps + 1):
        for _ in range(20):
            stats.record_step("terminal_like", rng.uniform(0.01, 0.2))
            stats.record_tool("terminal_like", "bash", "ok", rng.uniform(0.005, 0.1))
            stats.record_generation("terminal_like", rng.uniform(0.05, 0.5))
        stats.record_create("terminal_like", 0.02)
        ctl.counters["tokens_generated"] += 100
        buf.counters["dropped_stale"] += step % 2
        row = step_row(step=step, version=step // 2, metrics={"loss": 1.0 / step}, wait_s=0.5, train_s=1.0,
                       stats={"reward/mean": 0.1 * step, "reward/success_rate": 0.05 * step, "rollout/staleness_mean": 0.5},
                       sync_s=0.2 * (step % 2 == 0), elapsed=2.0 * step, controller=ctl, buffer=buf, watchdog=Watchdog(10),
                       trained_tokens=80 * step)
        log.append({**row, **stats.snapshot()})
        if step % 3 == 0:
            log.append({"step": step, "version": step // 2, "eval/terminal_like/success_rate": 0.1 * step,
                        "eval/tool_api_like/success_rate": 0.05 * step})
    log.close()
    return run


def test_metrics_rows_carry_namespaced_keys_and_system_figures(tmp_path):
    rows = read_rows(write_run(tmp_path / "run") / "stage8" / "metrics.jsonl")
    step = rows[0]
    for key in ("train/loss", "reward/mean", "time/sampling_share", "sync/seconds", "rollout/queue_length",
                "env/terminal_like/step_ms_p99", "infer/terminal_like/generate_ms_p50", "system/rss_mb"):
        assert key in step, key
    assert step["system/rss_mb"] > 0
    assert len(step["env/terminal_like/step_ms_samples"]) == 20  # the samples since the previous row, no more


def test_report_of_a_run_without_metrics_still_has_every_figure(tmp_path):
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    path, data = write_report(run)
    page = path.read_text()
    assert all(f"data-plot='{name}' data-empty='true'" in page for name in PLOTS)
    assert "http://" not in page and "https://" not in page  # nothing to fetch: it opens offline


@needs_chromium
@pytest.mark.integration
def test_report_renders_in_chromium_with_every_plot_and_no_console_error(tmp_path):
    path, _ = write_report(write_run(tmp_path / "run"))
    seen = render_in_chromium(path, tmp_path)
    assert seen["console"] == [], seen["console"]
    assert seen["png_size"] == (WIDTH, HEIGHT) and seen["png_bytes"] > 50_000
    assert sorted(name for name, _ in seen["figures"]) == sorted(PLOTS)
    assert [name for name, empty in seen["figures"] if empty == "true"] == []  # every plot drew data
    assert seen["check"]["images"] == seen["check"]["decoded"] == str(len(PLOTS))
    assert "what to do: raise rollout.group_size" in seen["dom"]  # the failing check's hint is on the page
    print(f"screenshot {seen['png_size']} {seen['png_bytes']} bytes; page height {seen['check']['height']} px; "
          f"plots {[n for n, _ in seen['figures']]}")


def test_report_command_writes_the_html_and_summarises_the_run(cli, isolated):
    write_run(isolated / "runs" / "20261201-000000-abcdef")
    result, data = cli.json("report")
    assert result.exit_code == 0, result.stderr
    assert data["run_id"] == "20261201-000000-abcdef" and data["steps"] == 6 and data["stages"] == {"8": "fail"}
    assert Path(data["report"]).name == "report.html" and (isolated / data["report"]).exists()
    assert data["time_shares_last"]["train"] > 0.5
    shown = cli("report", "20261201-000000-abcdef")
    assert shown.exit_code == 0 and "Report: " in shown.stdout and "reward_mean_last" in shown.stdout


def test_report_of_an_unknown_run_is_a_usage_error(cli):
    result = cli("report", "no-such-run")
    assert result.exit_code == 2 and "no-such-run" in result.stderr
