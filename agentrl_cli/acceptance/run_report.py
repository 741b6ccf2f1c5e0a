"""A run's report as one self-contained HTML file (`<run>/report.html`): the figures (PNG data URIs,
no network needed), the per-harness service levels, the evaluation metrics by harness and phase,
and the stage and verify reports with their hints. Each figure sits in a `<figure data-plot=NAME
data-empty=…>` so a reader (or a test) can find it. Belongs here: the page; the data is
`run_data.py`, the drawing `plots.py`.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from agentrl_cli.core.report import CheckStatus
from agentrl_cli.runtime.observe import keys
from agentrl_cli.acceptance import plots
from agentrl_cli.core.redaction import current
from agentrl_cli.acceptance.run_data import RunData, collect, harness_levels, samples, series

REPORT_NAME = "report.html"
# every figure the report draws: name -> caption
PLOTS = {
    "reward": "Reward by harness (training batches; per harness from the stored trajectories)",
    "success": "Success rate by harness: evaluations (held-out harnesses dashed), training episodes, training batches",
    "time_shares": "Phase time shares per step: sampling wait, training, weight sync",
    "latency_generation": "Generation latency",
    "latency_tool": "Tool-call latency",
    "latency_env_step": "Environment step latency",
    "queue_buffer": "Queue length and buffer fill",
    "staleness": "Staleness drops (cumulative) and mean policy lag of trained episodes",
    "system": "CPU and memory of the run's process (accelerators when sampled)",
}
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure{margin:0;border:1px solid #e4e4e4;padding:8px;background:#fff}figure img{max-width:100%}
figcaption{font-size:13px;color:#444}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.pass{color:#157f1f;font-weight:600}.fail{color:#b00020;font-weight:600}.skip{color:#a66b00}.info{color:#0b6e8a}
.hint{color:#555;font-size:12px}.note{color:#a66b00}"""
# After load: how many figures decoded; a reader of the rendered page finds the result in #render-check.
SCRIPT = """window.addEventListener('load',function(){var imgs=document.querySelectorAll('figure[data-plot] img');
var ok=0;imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0){ok++;}});var c=document.getElementById('render-check');
c.setAttribute('data-images',String(imgs.length));c.setAttribute('data-decoded',String(ok));
c.setAttribute('data-height',String(document.documentElement.scrollHeight));});"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return _e(v)


def figures(data: RunData) -> dict[str, tuple[str, bool]]:
    rows = data.step_rows()
    held = data.held_out
    reward = {"batch mean": series(rows, keys.REWARD_MEAN)}
    roles = sorted({m.group(1) for r in rows for k in r if (m := re.match(keys.REWARD_ROLE_PATTERN, k))})
    reward |= {f"role {role} mean": series(rows, keys.reward_role(role)) for role in roles}  # multi-agent harnesses
    reward |= {f"{h}{' (held out)' if h in held else ''} mean": xy for h, xy in data.reward_by_version.items()}
    evals = data.eval_rows()
    names = sorted({k.split("/")[1] for r in evals for k in r if k.startswith(keys.EVAL)}, key=lambda h: (h in held, h))
    success = {f"{h}{' (held out)' if h in held else ''} eval": series(evals, keys.eval_success_rate(h)) for h in names}
    success |= {f"{h}{' (held out)' if h in held else ''} training": xy for h, xy in data.success_by_version.items()}
    success["batch success rate"] = series(rows, keys.REWARD_SUCCESS_RATE)
    steps = [r.get(keys.STEP) for r in rows]
    shares = {label: [r.get(keys.time_share(key)) for r in rows]
              for label, key in (("sampling wait", "sampling"), ("training", "train"), ("weight sync", "sync"))}
    generation = samples(rows, "generate_ms_samples") or {f"{h} (turn minus tool time)": v
                                                          for h, v in data.turn_generation_ms.items()}
    tool = samples(rows, "tool_ms_samples") or data.tool_latency_ms
    system = {"cpu %": series(rows, keys.SYSTEM_CPU_PERCENT), "RSS MB": series(rows, keys.SYSTEM_RSS_MB),
              "children RSS MB": series(rows, keys.SYSTEM_CHILDREN_RSS_MB)}
    gpus = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("system/gpu")})
    system |= {f"{g} util %": series(rows, keys.system_gpu(g, "util_percent")) for g in gpus}
    return {
        "reward": plots.lines("Reward", reward, xlabel="step (per harness: policy version)", ylabel="reward",
                              dashed={k for k in reward if "(held out)" in k}),
        "success": plots.lines("Success rate by harness", success, xlabel="step (training by harness: policy version)",
                               ylabel="success rate",
                               dashed={k for k in success if "(held out)" in k}),
        "time_shares": plots.stacked_shares("Phase time shares", steps, shares),
        "latency_generation": plots.histogram("Generation latency", generation),
        "latency_tool": plots.histogram("Tool-call latency", tool),
        "latency_env_step": plots.histogram("Environment step latency", samples(rows, "step_ms_samples")),
        "queue_buffer": plots.lines("Queue length and buffer fill", {
            "queue length (in flight + buffered)": series(rows, keys.ROLLOUT_QUEUE_LENGTH),
            "in flight": series(rows, keys.ROLLOUT_IN_FLIGHT), "buffer fill": series(rows, keys.ROLLOUT_BUFFER_FILL),
            "buffer capacity": series(rows, keys.ROLLOUT_BUFFER_CAPACITY)}, ylabel="episodes"),
        "staleness": plots.lines("Staleness", {"dropped stale (cumulative)": series(rows, keys.ROLLOUT_DROPPED_STALE),
                                               "mean policy lag": series(rows, keys.ROLLOUT_STALENESS_MEAN)}),
        "system": plots.lines("System", system),
    }


def _checks_table(checks: list[dict]) -> str:
    out = ["<table><tr><th>check</th><th>status</th><th>measured</th><th>expected</th><th>detail / what to do</th></tr>"]
    for c in checks:
        status = str(c.get("status", ""))
        detail = (c.get("detail") or "").splitlines()[:1]
        hint = c.get("hint") if status in (CheckStatus.FAIL, CheckStatus.SKIP) else ""
        out.append(f"<tr><td>{_e(c.get('name'))}</td><td class='{_e(status)}'>{_e(status.upper())}</td>"
                   f"<td>{_e(c.get('measured'))}</td><td>{_e(c.get('expected'))}</td><td>{_e(' '.join(detail))}"
                   + (f"<div class='hint'>what to do: {_e(hint)}</div>" if hint else "") + "</td></tr>")
    return "".join(out) + "</table>"


def _eval_table(rows: list[dict]) -> str:
    if not rows:
        return "<p class='note'>No stored trajectories of this run were read, so there is no evaluation table.</p>"
    from agentrl_cli.runtime.data.metrics import METRICS

    head = "".join(f"<th>{_e(m.label)}</th>" for m in METRICS)
    out = [f"<table><tr><th>harness</th><th>phase</th>{head}</tr>"]
    for r in rows:
        out.append(f"<tr><td>{_e(r.get('harness'))}</td><td>{_e(r.get('phase'))}</td>"
                   + "".join(f"<td>{_fmt(r.get(m.key))}</td>" for m in METRICS) + "</tr>")
    return "".join(out) + "</table>"


def _levels_table(levels: dict[str, dict]) -> str:
    if not levels:
        return "<p class='note'>This run recorded no per-harness service levels (env/&lt;harness&gt;/… keys).</p>"
    out = ["<table><tr><th>harness</th><th>figure</th><th>value</th></tr>"]
    for h, figs in sorted(levels.items()):
        for k, v in sorted(figs.items()):
            out.append(f"<tr><td>{_e(h)}</td><td>{_e(k)}</td><td>{_fmt(v)}</td></tr>")
    return "".join(out) + "</table>"


def render_html(data: RunData) -> str:
    figs = figures(data)
    rows = data.step_rows()
    last = rows[-1] if rows else {}
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>agentrl run {_e(data.run_id)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>agentrl run {_e(data.run_id)}</h1>",
             f"<p>started {_e(data.meta.get('created_at') or data.meta.get('started_at'))} · config "
             f"{_e(data.meta.get('config_hash'))} · metrics from {_e(data.main_log()[0] or 'no training loop')} · "
             f"{len(rows)} steps · goodput {_fmt(last.get(keys.ROLLOUT_GOODPUT))}</p>"]
    parts += [f"<p class='note'>{_e(n)}</p>" for n in data.notes]
    parts.append("<h2>Training</h2><div class='grid'>")
    for name, caption in PLOTS.items():
        uri, has = figs[name]
        parts.append(f"<figure data-plot='{name}' data-empty='{str(not has).lower()}'><img alt='{_e(caption)}' "
                     f"src='{uri}'><figcaption>{_e(caption)}</figcaption></figure>")
    parts.append("</div>")
    parts.append("<h2>Service levels by harness (newest row)</h2>" + _levels_table(harness_levels(rows)))
    parts.append("<h2>Evaluation metrics by harness and phase</h2>" + _eval_table(data.eval_table))
    parts.append("<h2>Stage reports</h2>")
    if not data.stage_reports:
        parts.append("<p class='note'>No stage report in this run.</p>")
    for r in data.stage_reports:
        status = str(r.get("status", ""))
        parts.append(f"<h3>Stage {_e(r.get('stage'))}: {_e(r.get('title'))} — <span class='{_e(status)}'>"
                     f"{_e(status.upper())}</span> ({_fmt(r.get('duration_s'))} s)</h3>" + _checks_table(r.get("checks", [])))
    if data.verify_report:
        v = data.verify_report
        parts.append(f"<h2>Verify — <span class='{_e(v.get('status'))}'>{_e(str(v.get('status', '')).upper())}</span></h2>"
                     f"<p>judged: {_e(v.get('judged'))}</p>")
        for layer, checks in (v.get("layers") or {}).items():
            parts.append(f"<h3>{_e(layer)}</h3>" + _checks_table(checks))
    parts.append(_select_section(data.path / "reports" / "select.json"))
    parts.append(f"<div id='render-check' data-plots='{len(figs)}'></div><script>{SCRIPT}</script></body></html>")
    return "".join(parts)


def _select_section(path: Path) -> str:
    """`agentrl select`'s scorecard (reports/select.json), when the run has one: per criterion, a
    cell per backend, with the deployment action."""
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    state = "complete" if card.get("complete") else "incomplete"
    parts = [f"<h2>Framework selection scorecard ({_e(state)}; backends {_e(', '.join(card.get('backends', [])))})</h2>"]
    for c in card.get("criteria", []):
        parts.append(f"<h3>{_e(c.get('title'))}</h3><p class='hint'>action: {_e(c.get('action'))}</p>"
                     + _checks_table(list((c.get("results") or {}).values())))
    return "".join(parts)


def write_report(run_path: Path, *, data_config=None, store=None, out: Path | None = None) -> tuple[Path, RunData]:
    """Write the run's HTML report (default `<run>/report.html`); returns its path and the data shown.
    The trajectory store is `store`, else opened from `data_config` (the config's `data` section)."""
    note = None
    if store is None and data_config is not None:
        try:
            from agentrl_cli.runtime.data.stores import open_store

            store = open_store(data_config)
        except Exception as exc:  # noqa: BLE001 - the report still has every metrics-based part without the store
            note = f"the trajectory store did not open ({type(exc).__name__}: {exc}); the trajectory-based parts are missing"
    data = collect(Path(run_path), store)
    if note:
        data.notes.append(note)
    out = Path(out) if out else Path(run_path) / REPORT_NAME
    tmp = out.with_suffix(".html.tmp")
    # secrets redacted from everything shown (the figures' data URIs left whole): the page quotes
    # check details, notes and whatever the run recorded
    tmp.write_text(current().html(render_html(data)), encoding="utf-8")
    tmp.replace(out)
    return out, data


def report_or_reason(run_path: Path, data_config=None) -> tuple[str | None, str]:
    """Write the run's HTML report: (its path, "") or (None, why not). A command that ends by naming
    the report never fails because of it: the report is a view of results already written."""
    try:
        return str(write_report(run_path, data_config=data_config)[0]), ""
    except Exception as exc:  # noqa: BLE001 - the results stand; the report is a view of them
        return None, f"{type(exc).__name__}: {exc} (retry with `agentrl report`)"
