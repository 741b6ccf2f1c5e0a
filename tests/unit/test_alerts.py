"""The alert rules: rendered as a Prometheus rule file whose expressions are exactly the rule objects'
renderings over the names the run's Prometheus endpoint exposes; the same objects evaluated on
metrics rows with PromQL's semantics (range window, increase with resets, deriv's least squares,
`and`); `agentrl observe alerts` writes them with the config's thresholds."""

from __future__ import annotations

import json

import pytest
import yaml

from agentrl_cli.config.models import ObserveConfig
from agentrl_cli.acceptance import alerts
from agentrl_cli.runtime.observe import keys
from agentrl_cli.runtime.observe.prometheus import _RowCollector


def _rows(series: dict[str, list], step_s: float = 60.0) -> list[dict]:
    n = max(len(v) for v in series.values())
    return [{keys.STEP: i + 1, keys.ELAPSED_S: (i + 1) * step_s, **{k: v[i] for k, v in series.items() if v[i] is not None}}
            for i in range(n)]


def test_the_rule_file_has_prometheus_shape_and_each_expression_is_its_rule_rendered():
    observe = ObserveConfig()
    doc = yaml.safe_load(alerts.render(observe, 1.0))
    assert list(doc) == ["groups"] and len(doc["groups"]) == 1
    group = doc["groups"][0]
    assert isinstance(group["name"], str) and group["name"]
    rendered = {r["alert"]: r for r in group["rules"]}
    objects = alerts.rules(observe, 1.0)
    assert tuple(rendered) == tuple(r.alert for r in objects) == alerts.ALERTS
    assert set(rendered) >= {"AgentrlEnvCreationFailures", "AgentrlSandboxLeaks", "AgentrlSandboxMemoryHigh",
                             "AgentrlSandboxMemoryCreep", "AgentrlTrainerIdle", "AgentrlWeightSyncShare", "AgentrlRewardPinnedAtMax"}
    for rule in objects:
        r = rendered[rule.alert]
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}
        assert r["expr"] == rule.promql(observe.alert_window_minutes * 60)
        assert r["for"] == "5m" and r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
    assert rendered["AgentrlTrainerIdle"]["expr"] == "avg_over_time(agentrl_time_sampling_share[15m]) > 0.7"
    assert rendered["AgentrlEnvCreationFailures"]["expr"] == \
        "sum by (run_id, harness) (increase(agentrl_env_create_failures[15m])) > 5"
    assert rendered["AgentrlRewardPinnedAtMax"]["expr"] == \
        "(min_over_time(agentrl_reward_mean[15m]) >= 0.999) and (max_over_time(agentrl_reward_std[15m]) <= 1e-06)"


def test_every_metric_a_rule_names_is_one_the_prometheus_endpoint_serves():
    row = {keys.time_share("sampling"): 0.5, keys.time_share("sync"): 0.1, keys.REWARD_MEAN: 0.5, keys.REWARD_STD: 0.2,
           keys.env_create_failures("h", "OSError"): 1, "sandbox/h/leaked_processes": 0,
           keys.env_resource("h", "peak_mem_mb_max"): 10.0}
    collector = _RowCollector("r1")
    collector.update(row)
    served = {family.name for family in collector.collect()}
    for rule in alerts.rules(ObserveConfig(), 1.0):
        for c in rule.conditions:
            assert c.metric in served, (rule.alert, c.metric, served)


def test_range_functions_follow_promql_over_the_window_ending_at_the_last_row():
    observe = ObserveConfig(alert_window_minutes=3)  # the last 3 rows at one per minute
    share = alerts.Condition("agentrl_time_sampling_share", "avg_over_time", ">", 0.7)
    rows = _rows({keys.time_share("sampling"): [1.0, 1.0, 0.6, 0.8, 0.9]})
    assert share.values(rows, alerts.window_s(observe)) == {(): pytest.approx((0.6 + 0.8 + 0.9) / 3)}
    assert share.evaluate(rows, alerts.window_s(observe)) == {(): pytest.approx(0.7666666)}
    assert share.evaluate(_rows({keys.time_share("sampling"): [1.0, 1.0, 0.6, 0.7, 0.7]}), 180.0) == {}

    failures = alerts.Condition("agentrl_env_create_failures", "increase", ">", 5, by=("harness",))
    rows = _rows({keys.env_create_failures("a", "OSError"): [0, 4, 2, 6],  # 4 -> 2 is a reset: +2 then +4
                  keys.env_create_failures("a", "TimeoutError"): [0, 0, 1, 1],
                  keys.env_create_failures("b", "OSError"): [0, 1, 2, 3]})
    assert failures.values(rows, 600.0) == {(("harness", "a"),): 11.0, (("harness", "b"),): 3.0}
    assert failures.evaluate(rows, 600.0) == {(("harness", "a"),): 11.0}

    creep = alerts.Condition("agentrl_env_peak_mem_mb_max", "deriv", ">", 512, scale=3600.0)
    rows = _rows({keys.env_resource("h", "peak_mem_mb_max"): [100, 110, 120, 130]})  # 10 MiB a minute = 600 an hour
    assert creep.evaluate(rows, 900.0) == {(("harness", "h"),): pytest.approx(600.0)}
    flat = _rows({keys.env_resource("h", "peak_mem_mb_max"): [100, 101, 99, 100]})
    assert creep.evaluate(flat, 900.0) == {}
    assert creep.values(_rows({keys.env_resource("h", "peak_mem_mb_max"): [100]}), 900.0) == {}  # one sample: no slope


def test_reward_pinned_needs_both_conditions():
    rule = next(r for r in alerts.rules(ObserveConfig(), 1.0) if r.alert == "AgentrlRewardPinnedAtMax")
    pinned = _rows({keys.REWARD_MEAN: [0.4, 1.0, 1.0, 1.0], keys.REWARD_STD: [0.3, 0.0, 0.0, 0.0]})
    assert rule.evaluate(pinned, 900.0) == {}  # the window still holds the 0.4 step
    assert rule.evaluate(pinned, 180.0) == {(): 1.0}
    spread = _rows({keys.REWARD_MEAN: [1.0, 1.0, 1.0], keys.REWARD_STD: [0.0, 0.2, 0.0]})
    assert rule.evaluate(spread, 900.0) == {}


def test_observe_alerts_writes_the_rules_with_the_configs_thresholds(cli, tmp_path):
    target = tmp_path / "rules" / "agentrl.yaml"
    res = cli("observe", "alerts", "--out", str(target), "--set", "observe.alert_peak_memory_mb=100",
              "--set", "observe.alert_window_minutes=5")
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(target.read_text())
    expr = {r["alert"]: r["expr"] for r in doc["groups"][0]["rules"]}
    assert expr["AgentrlSandboxMemoryHigh"] == "max_over_time(agentrl_env_peak_mem_mb_max[5m]) > 100"
    res = cli("observe", "alerts", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["groups"][0]["rules"][0]["alert"] == "AgentrlEnvCreationFailures"
    res = cli("observe", "alerts", "--set", "observe.alert_sync_share=2")
    assert res.exit_code == 2 and "alert_sync_share" in res.output


def test_troubleshoot_applies_the_same_rules_with_the_runs_own_thresholds(tmp_path):
    from agentrl_cli.acceptance.troubleshoot.diagnose import diagnose
    from tests.unit.test_verify_faults import loaded_config, make_run, rows

    def metrics():
        out = rows()  # a row every 10 s
        for i, r in enumerate(out, 1):
            r[keys.env_resource("h", "peak_mem_mb_max")] = 100.0 + 5 * i  # 5 MiB per 10 s: 1800 MiB an hour
            r[keys.time_share("sync")] = 0.5
        return out

    loaded = loaded_config(tmp_path / "a", "observe.alert_window_minutes=2")
    found = {f.entry.id: dict(f.hits) for f in diagnose(make_run(loaded, metrics=metrics()), loaded.config)}
    creep = found["sandbox-memory-high"]["alert:AgentrlSandboxMemoryCreep"].evidence["alert/firing"]
    assert creep["value"] == pytest.approx(1800.0) and creep["labels"] == {"harness": "h"}
    assert creep["expr"] == "deriv(agentrl_env_peak_mem_mb_max[2m]) * 3600 > 512"
    assert "alert:AgentrlSandboxMemoryHigh" not in found["sandbox-memory-high"]  # peaks of 200 MiB < 2048
    assert found["step-time-share-drift"]["alert:AgentrlWeightSyncShare"].evidence["alert/firing"]["value"] == pytest.approx(0.5)

    quiet = loaded_config(tmp_path / "b", "observe.alert_memory_creep_mb_per_hour=2000", "observe.alert_sync_share=0.6")
    found = {f.entry.id: dict(f.hits) for f in diagnose(make_run(quiet, metrics=metrics()), quiet.config)}
    assert "alert:AgentrlSandboxMemoryCreep" not in found.get("sandbox-memory-high", {})
    assert "alert:AgentrlWeightSyncShare" not in found.get("step-time-share-drift", {})
