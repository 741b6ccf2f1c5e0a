"""`agentrl troubleshoot SYMPTOM`: look a symptom up (English or Chinese) in the knowledge base;
`agentrl troubleshoot --run RUN`: diagnose a run from what it recorded, causes ranked by evidence."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.panel import Panel
from rich.table import Table

from pathlib import Path

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, load, out, print_json
from agentrl_cli.core.errors import UsageError
from agentrl_cli.acceptance.troubleshoot.knowledge import Entry, load_knowledge_base, lookup

LANGS = ("en", "zh", "both")


def _entry_json(entry: Entry, score: float | None = None) -> dict:
    data = entry.model_dump()
    if score is not None:
        data["score"] = round(score, 1)
    return data


def _pick(text, lang: str) -> str:
    return {"en": text.en, "zh": text.zh}.get(lang, f"{text.en} / {text.zh}")


def _render_entry(entry: Entry, score: float, lang: str) -> Panel:
    lines = [f"[dim]id {entry.id} · match {score:.0f}"
             + (f" · stages {', '.join(map(str, entry.stages))}" if entry.stages else "") + "[/dim]"]
    for title, items in (("Causes", entry.causes), ("How to check", entry.checks), ("What to do", entry.actions)):
        lines.append(f"\n[bold]{title}[/bold]")
        for item in items:
            if lang == "both":
                lines.append(f"  • {item.en}\n    {item.zh}")
            else:
                lines.append(f"  • {_pick(item, lang)}")
    if entry.config_keys:
        lines.append(f"\n[bold]Config keys[/bold]  {', '.join(entry.config_keys)}")
    return Panel("\n".join(lines), title=_pick(entry.symptom, lang), title_align="left")


def troubleshoot(
    symptom: Annotated[Optional[str], typer.Argument(help="What you see, in English or Chinese (fuzzy).")] = None,
    list_all: Annotated[bool, typer.Option("--list", help="List every symptom in the knowledge base.")] = False,
    run: Annotated[Optional[str], typer.Option(
        "--run", help="Diagnose this run (an id, or 'latest') from its metrics, trajectories and reports.",
        show_default=False)] = None,
    lang: Annotated[str, typer.Option("--lang", help="en, zh or both.")] = "both",
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Look a symptom up: causes, how to check, what to do; or diagnose a run. Lookup: exit 0 found,
    1 no match (closest listed). --run: exit 0 no known problem found, 1 problems found (ranked, with
    the figures that point at each and the fix). 2 bad usage.

    Examples:

    * `agentrl troubleshoot "GPU utilization low"`

    * `agentrl troubleshoot "训练进程一直在等采样" --lang zh`

    * `agentrl troubleshoot --run latest`

    * `agentrl troubleshoot --run 20261129-101500-ab12cd --json`

    * `agentrl troubleshoot --list --json`
    """
    if lang not in LANGS:
        raise UsageError(f"bad --lang {lang!r}", f"use one of: {', '.join(LANGS)}")
    if run is not None:
        if symptom or list_all:
            raise UsageError("--run diagnoses a run; it takes no symptom and no --list",
                             'use `agentrl troubleshoot --run RUN` or `agentrl troubleshoot "SYMPTOM"`')
        _diagnose(run, config, sets, lang, json_out)
        return
    kb = load_knowledge_base()
    if list_all:
        if json_out:
            print_json([_entry_json(e) for e in kb.entries])
            return
        table = Table("id", "symptom", "stages")
        for e in kb.entries:
            table.add_row(e.id, _pick(e.symptom, lang), ",".join(map(str, e.stages)) or "-")
        out().print(table)
        return
    if not symptom or not symptom.strip():
        raise UsageError("no symptom given", 'pass one, e.g. `agentrl troubleshoot "GPU utilization low"`, or --list')
    matches, closest = lookup(symptom, kb)
    if json_out:
        print_json({"query": symptom, "matched": bool(matches),
                    "matches": [_entry_json(e, s) for e, s in matches],
                    "closest": [{"id": e.id, "symptom": e.symptom.model_dump(), "score": round(s, 1)} for e, s in closest]})
        raise typer.Exit(0 if matches else 1)
    console = out()
    if not matches:
        console.print(f"No entry matches {symptom!r}. Closest symptoms:")
        for e, s in closest:
            console.print(f"  {s:5.1f}  {e.id:32} {_pick(e.symptom, lang)}")
        console.print('Try one of them (`agentrl troubleshoot "<symptom>"`) or `agentrl troubleshoot --list`.')
        raise typer.Exit(1)
    for e, s in matches:
        console.print(_render_entry(e, s, lang))


def _diagnose(run_id: str, config, sets, lang: str, json_out: bool) -> None:
    from agentrl_cli.core.rundir import get_run
    from agentrl_cli.acceptance.troubleshoot.diagnose import diagnose

    loaded = load(config, sets)
    run = get_run(Path(loaded.config.observe.runs_dir), run_id)
    findings = diagnose(run, loaded.config)
    if json_out:
        print_json({"run_id": run.run_id, "problems_found": bool(findings), "findings": [f.to_dict() for f in findings]})
        raise typer.Exit(1 if findings else 0)
    console = out()
    if not findings:
        console.print(f"run {run.run_id}: no known problem found")
        return
    console.print(f"run {run.run_id}: {len(findings)} known problem(s), strongest evidence first")
    for rank, f in enumerate(findings, 1):
        lines = [f"[dim]id {f.entry.id} · evidence strength {f.strength:.2f}[/dim]", "", "[bold]Evidence[/bold]"]
        lines += [f"  • {h.summary}" for _, h in f.hits]
        lines += ["", "[bold]What to do[/bold]"] + [f"  • {_pick(a, lang)}" for a in f.entry.actions]
        if f.entry.config_keys:
            lines.append(f"\n[bold]Config keys[/bold]  {', '.join(f.entry.config_keys)}")
        console.print(Panel("\n".join(lines), title=f"{rank}. {_pick(f.entry.symptom, lang)}", title_align="left"))
    raise typer.Exit(1)
