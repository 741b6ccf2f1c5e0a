"""`agentrl troubleshoot SYMPTOM`: look a symptom up (English or Chinese, fuzzy) in the knowledge base."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.panel import Panel
from rich.table import Table

from agentrl_cli.commands.common import ConfigOpt, JsonOpt, out, print_json
from agentrl_cli.errors import UsageError
from agentrl_cli.troubleshoot.knowledge import Entry, load_knowledge_base, lookup

LANGS = ("en", "zh", "both")


def _entry_json(entry: Entry, score: float | None = None) -> dict:
    data = entry.model_dump()
    if score is not None:
        data["score"] = round(score, 1)
    return data


def _pick(text, lang: str) -> str:
    return {"en": text.en, "zh": text.zh}.get(lang, f"{text.en} / {text.zh}")


def _render_entry(entry: Entry, score: float, lang: str) -> Panel:
    lines = [f"[dim]id {entry.id} · match {score:.0f} · source {', '.join(entry.source)}"
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
    lang: Annotated[str, typer.Option("--lang", help="en, zh or both.")] = "both",
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Look a symptom up: causes, how to check, what to do. Exit 0 found, 1 no match (closest listed), 2 bad usage.

    Examples:

    * `agentrl troubleshoot "GPU utilization low"`

    * `agentrl troubleshoot "GPU 利用率低" --lang zh`

    * `agentrl troubleshoot --list --json`
    """
    if lang not in LANGS:
        raise UsageError(f"bad --lang {lang!r}", f"use one of: {', '.join(LANGS)}")
    kb = load_knowledge_base()
    if list_all:
        if json_out:
            print_json([_entry_json(e) for e in kb.entries])
            return
        table = Table("id", "symptom", "stages", "source")
        for e in kb.entries:
            table.add_row(e.id, _pick(e.symptom, lang), ",".join(map(str, e.stages)) or "-", ", ".join(e.source))
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
