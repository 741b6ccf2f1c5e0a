"""`agentrl observe alerts`: the run's Prometheus alerting rules (acceptance/alerts.py), rendered with
the config's `observe.alert_*` thresholds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json

app = typer.Typer(help="Monitoring of runs: Prometheus alert rules for what troubleshoot --run detects.", no_args_is_help=True)


@app.command("alerts")
def alerts_command(
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write the rule file here instead of printing it.",
                                                     show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Render Prometheus alerting rules (a rule file: groups, rules with alert, expr, for, labels,
    annotations) for environment creation failures, sandbox leaks, sandbox memory (high, creeping),
    trainer idle share, weight-sync share and a reward pinned at its maximum. The metric names are
    the ones a run serves on observe.prometheus_port; thresholds come from observe.alert_*, the
    reward maximum from reward.weights. `agentrl troubleshoot --run` applies the same rules to a
    run's metrics.jsonl.

    Examples:

    * `agentrl observe alerts --out agentrl-alerts.yaml`

    * `agentrl observe alerts --set observe.alert_peak_memory_mb=4096`
    """
    from agentrl_cli.acceptance.alerts import render, rule_file
    from agentrl_cli.acceptance.verify.judge import achievable_max_reward

    cfg = load(config, sets).config
    top = achievable_max_reward(cfg.reward.weights)
    if json_out:
        print_json(rule_file(cfg.observe, top))
        return
    text = render(cfg.observe, top)
    if out_file is None:
        typer.echo(text, nl=False)
        return
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(text, encoding="utf-8")
    out().print(f"wrote {len(rule_file(cfg.observe, top)['groups'][0]['rules'])} alert rules to {out_file} "
                "(load it with rule_files in prometheus.yml)")
