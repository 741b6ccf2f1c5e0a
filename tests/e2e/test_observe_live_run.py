"""One live `agentrl stage run 8 --phase smoke` (random tiny model, 2 steps and the resume) through the
real console script with `observe.prometheus_port` and `observe.tensorboard` on: the Prometheus
endpoint, scraped while the run goes on, serves rollout, train and sync metrics; TensorBoard's own
reader reads the event files back; the stage runner names the HTML report, which renders in headless
Chromium with every figure and no console error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agentrl_cli.acceptance.run_report import PLOTS
from tests.conftest import free_port
from tests.integration.test_report_html import CHROMIUM, render_in_chromium

pytestmark = [pytest.mark.e2e, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]
AGENTRL = Path(sys.executable).parent / "agentrl"
WANTED = ("agentrl_rollout_", "agentrl_train_", "agentrl_sync_")


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@pytest.fixture(scope="module")
def live_run(tmp_path_factory, random_model_dir):
    work = tmp_path_factory.mktemp("live")
    port = free_port()
    sets = [f"model.path={random_model_dir}", f"inference.port={free_port()}", "stages.smoke_steps=2",
            "rollout.max_steps_per_trajectory=2", "inference.max_new_tokens=16", "rollout.group_size=2",
            "training.micro_batch_size=2", f"observe.prometheus_port={port}", "observe.tensorboard=true"]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AGENTRL_")}
    proc = subprocess.Popen([str(AGENTRL), "stage", "run", "8", "--phase", "smoke", "--json",
                             *[a for s in sets for a in ("--set", s)]], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scraped = None
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        page = scrape(port)
        if page and all(w in page for w in WANTED):
            scraped = page
            break
        time.sleep(0.05)  # a 2-step part of this tiny run is live with train metrics for well under a second
    try:
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    yield {"work": work, "scraped": scraped, "code": proc.returncode, "stdout": out, "stderr": err, "port": port}


def test_prometheus_serves_rollout_train_and_sync_metrics_while_the_run_is_live(live_run):
    page = live_run["scraped"]
    assert page is not None, live_run["stderr"][-3000:]
    samples = {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line and not line.startswith("#")}
    assert {"agentrl_rollout_tokens_generated", "agentrl_train_loss", "agentrl_sync_seconds", "agentrl_step",
            "agentrl_time_sampling_share"} <= samples, sorted(samples)
    assert 'run_id="' in page
    assert scrape(live_run["port"]) is None  # the endpoint closes with the run


def test_tensorboard_reader_reads_the_event_files_back(live_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = json.loads(live_run["stdout"])
    tb = Path(live_run["work"]) / data["run_dir"] / "stage8" / "tensorboard"
    events = sorted(tb.glob("events.out.tfevents.*"))
    assert events, list(tb.parent.iterdir())
    steps: dict[str, list[int]] = {}
    for f in events:
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            steps.setdefault(tag, []).extend(e.step for e in acc.Scalars(tag))
    assert {"train/loss", "reward/mean", "time/train_s", "rollout/tokens_generated", "sync/seconds"} <= set(steps)
    assert sorted(set(steps["train/loss"])) == [1, 2, 3, 4]  # two steps, then two more after the resume


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (bash .ci/setup --dev installs it)")
def test_stage_run_names_the_report_and_it_renders_with_every_plot(live_run, tmp_path):
    data = json.loads(live_run["stdout"])
    report = Path(live_run["work"]) / data["report"]
    assert f"Run report: {data['report']}" in live_run["stderr"]
    seen = render_in_chromium(report, tmp_path)
    assert seen["console"] == [], seen["console"]
    assert sorted(name for name, _ in seen["figures"]) == sorted(PLOTS)
    drawn = {name for name, empty in seen["figures"] if empty == "false"}
    # a 2-step smoke run of a random model has no tool calls; everything else has data
    assert {"reward", "success", "time_shares", "latency_generation", "latency_env_step", "queue_buffer",
            "staleness", "system"} <= drawn, seen["figures"]
    assert seen["check"]["images"] == seen["check"]["decoded"] == str(len(PLOTS))
    assert "Evaluation metrics by harness and phase" in seen["dom"] and "smoke</td>" in seen["dom"]
    print(f"live-run report screenshot {seen['png_size']} {seen['png_bytes']} bytes; page height "
          f"{seen['check']['height']} px; plots with data {sorted(drawn)}")
