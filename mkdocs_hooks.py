"""MkDocs hooks for the documentation site (mkdocs.yml `hooks:`).

GitHub's Markdown splits a table row at every unescaped `|`, even inside a code span, so the pages
write `\\|` there (`agentrl stage run SEL [--phase smoke\\|short\\|full]`). Python-Markdown's tables
already ignore a `|` inside a code span and would show the backslash, so the site gets the plain
`|` back inside the code spans of table rows. The pages stay written for GitHub; the site renders
them the same way.
"""

from __future__ import annotations

import re

CODE_SPAN = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **_) -> str:
    lines, fence = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and line.lstrip().startswith("|"):
            line = CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
        lines.append(line)
    return "\n".join(lines)
