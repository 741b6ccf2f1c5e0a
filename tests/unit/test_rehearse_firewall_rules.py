"""A node's firewall rules are the plan's cluster openings of the roles placed on it, from their
client roles' nodes only, behind a default drop; a refusal's fix names the plan entry to add or
widen. (Applying them to real namespaces: tests/integration/test_rehearse_firewall.py.)"""

from __future__ import annotations

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.core.report import CheckStatus
from agentrl_cli.ops.netplan import CLUSTER, KUBERNETES, LOOPBACK, OUTSIDE, Opening, openings
from agentrl_cli.ops.rehearse.firewall import Refusal, _fix, check, ruleset

PLACEMENT = {"trainer": ["198.18.0.1"], "inference": ["198.18.0.2"], "sandbox": ["198.18.0.3"], "gateway": ["198.18.0.3"]}
PLAN = openings(PlatformConfig(), KUBERNETES)


def _accepts(text: str) -> list[str]:
    return [line.strip().split(" comment ")[0] for line in text.splitlines() if line.strip().endswith('"') and " accept " in line]


def test_a_node_accepts_only_its_roles_planned_ports_from_their_clients_nodes_behind_a_default_drop():
    inference = ruleset(PLAN, PLACEMENT, "198.18.0.2")
    assert "policy drop;" in inference and "ct state established,related accept" in inference
    assert _accepts(inference) == ["ip saddr { 198.18.0.1, 198.18.0.3 } tcp dport 30000 counter accept"]  # trainer, gateway; not sandbox
    assert _accepts(ruleset(PLAN, PLACEMENT, "198.18.0.1")) == []  # one trainer node: no cluster opening of its own
    assert _accepts(ruleset(PLAN, PLACEMENT, "198.18.0.3")) == ["ip saddr { 198.18.0.1 } tcp dport 8700 counter accept",
                                                                "ip saddr { 198.18.0.1, 198.18.0.3 } tcp dport 8730 counter accept"]


def test_a_range_is_rendered_first_to_last_and_a_client_that_is_no_role_is_any_address():
    plan = [Opening("trainer", 32768, 60999, ("trainer",), "collectives", "training.dist_backend", CLUSTER, ephemeral=True),
            Opening("trainer", 9090, 9090, ("prometheus",), "metrics", "observe.prometheus_port", CLUSTER),
            Opening("trainer", 29500, 29500, ("trainer",), "rendezvous", "", LOOPBACK)]
    assert _accepts(ruleset(plan, {"trainer": ["198.18.0.1", "198.18.0.2"]}, "198.18.0.2")) == [
        "ip saddr { 198.18.0.1, 198.18.0.2 } tcp dport 32768-60999 counter accept", "tcp dport 9090 counter accept"]


def test_an_outside_service_a_rehearsal_places_on_a_node_is_opened_there_to_its_clients_only():
    plan = [Opening("s3", 9000, 9000, ("trainer",), "object store (S3)", "data.s3.endpoint_url", OUTSIDE)]
    placed = {"trainer": ["198.18.0.1"], "s3": ["198.18.0.9"]}
    assert _accepts(ruleset(plan, placed, "198.18.0.9")) == ["ip saddr { 198.18.0.1 } tcp dport 9000 counter accept"]
    assert _accepts(ruleset(plan, {"trainer": ["198.18.0.1"]}, "198.18.0.9")) == []  # S3 elsewhere: no node of ours opens it


def test_a_refusals_fix_widens_an_existing_opening_or_names_a_new_one():
    assert _fix(PLAN, ["sandbox"], ["inference"], 30000).startswith(
        "add sandbox to the clients of the plan's opening inference 30000 (HTTP API, key inference.port)")
    assert _fix(PLAN, ["sandbox"], ["trainer"], 29500).startswith(
        "add an opening to the plan in agentrl_cli/ops/netplan.py: listener trainer, port 29500, client sandbox, reach cluster")
    loop = [Opening("trainer", 29500, 29500, ("trainer",), "rendezvous", "training.master_port", LOOPBACK)]
    assert "has reach loopback" in _fix(loop, ["trainer"], ["trainer"], 29500)


def test_the_check_fails_naming_role_port_and_fix_and_passes_with_no_refusal():
    r = Refusal("198.18.0.3", ("sandbox",), "198.18.0.1", ("trainer",), 29500, "add an opening")
    failed = check([r])
    assert failed.status == CheckStatus.FAIL
    assert failed.hint == ("role sandbox (198.18.0.3) connected to trainer (198.18.0.1) port 29500, which the plan does not open: "
                           "add an opening")
    assert check([]).status == CheckStatus.PASS
