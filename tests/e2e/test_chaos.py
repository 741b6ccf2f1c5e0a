"""`agentrl chaos --json` with all five faults on a random tiny model, as a user runs it: a short
stage 8 run (two DeepSpeed ranks, two embedded inference servers, the reward and sandbox services as
processes, S3 on moto's server) trained twice, uninterrupted and with the faults. Every fault is
seen and recovered within the bound the report states, and the faulted run stored and trained
exactly what the uninterrupted one did: nothing lost, nothing twice."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from agentrl_cli.acceptance.chaos.schedule import FAULTS
from agentrl_cli.acceptance.chaos.services import moto_available
from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (the sandbox service)"),
              pytest.mark.skipif(not moto_available(), reason="moto[server] not installed (the S3 store)")]
STEPS = 20


def _why(report: dict) -> str:
    """A failed chaos report, the cause first: its problems, how the run ended, each fault's outcome,
    the loss counts (the draws' lists left out: they bury the rest)."""
    faults = [(f["kind"], f["status"], f["injected_step"], f["detail"]) for f in report["faults"]]
    losses = {k: v for k, v in report["losses"].items() if k != "draws"}
    return json.dumps({"problems": report["problems"], "run": report["run"], "reference": report["reference"],
                       "faults": faults, "losses": losses}, indent=1, default=str)[:8000]


def test_chaos_with_every_fault_recovers_each_within_its_bound_and_loses_nothing(cli, random_model_dir, isolated):
    result, report = cli.json("chaos", "--faults", ",".join(FAULTS), "--seed", "3", "--steps", str(STEPS),
                              "--set", f"model.path={random_model_dir}", "--set", f"inference.port={free_port()}")
    assert report["status"] == "pass", _why(report)
    assert result.exit_code == 0

    faults = {f["kind"]: f for f in report["faults"]}
    assert sorted(faults) == sorted(FAULTS)
    for f in faults.values():
        assert f["status"] == "pass" and f["injected_step"] is not None, f
        assert 0 <= f["detect_s"] <= f["detect_bound_s"] and f["detect_s"] <= f["recover_s"] <= f["recover_bound_s"], f
        assert f["detected_by"] and f["how"], f
    assert faults["rank"]["evidence"]["cause"] == "rank_died"
    [restart] = report["run"]["restarts"]
    assert restart["restart/cause"] == "rank_died" and restart["restart/from_checkpoint"] is not None
    assert faults["reward"]["evidence"]["failures"] > 0 and faults["store"]["evidence"]["failures"] > 0
    for kind in ("server", "sandbox"):
        assert [e["event"] for e in faults[kind]["evidence"]["events"]][:1] == ["down"]
        assert "back" in [e["event"] for e in faults[kind]["evidence"]["events"]]

    losses = report["losses"]
    assert losses["missing"] == 0 and losses["duplicated"] == 0 and losses["stored_twice"] == []
    assert losses["draws_equal"] and losses["draws"]["trained"] == losses["draws"]["reference"] == STEPS * 2
    assert losses["trained"] == STEPS * 4 and losses["trained_not_stored"] == []
    assert losses["stored"] >= losses["trained"] and losses["spooled_not_uploaded"] == 0
    assert losses["generated"] + losses["reused_after_resume"] >= losses["trained"]
    assert losses["dropped_stale"] == 0 and losses["episode_errors"] == 0
    assert report["run"]["steps"] == report["reference"]["steps"] == STEPS

    [chaos_dir] = list((isolated / "runs").glob("*/chaos"))
    assert json.loads((chaos_dir / "chaos.json").read_text())["status"] == "pass"
    assert not (chaos_dir / "services" / "reward.key").exists()  # the keys went with the services
    for url in report["services"].values():  # every service and gate was stopped
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) != 0, url
