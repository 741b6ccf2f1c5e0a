"""The README and the documentation site (docs/, mkdocs.yml) stay small, buildable and true.

- The README is a front page of at most 15 KB (15,360 bytes); the rest lives under docs/.
- `mkdocs build --strict` succeeds: mkdocs.yml's `validation:` turns a link to a missing page, a
  missing anchor, an absolute link and a page left out of the nav into warnings, which strict mode
  makes fatal. The README is not part of the site, so its links are checked here the same way.
- Config snippets are valid configs. The rule: every fenced code block tagged ```yaml (or ```yml)
  in README.md or docs/*.md is an agentrl platform config, unless the line just before its fence
  (blank lines skipped) is the marker `<!-- not-config -->` (for Kubernetes manifests, Slurm
  files, a tracker's config, ...). A config snippet may be partial (one section, a few keys): it is
  read as `agentrl --config SNIPPET` reads a file, merged onto the built-in defaults and validated
  by `agentrl_cli.config.load_config`, so an unknown key, a wrong type or a rule the models enforce
  fails the test with the key path and the fix. A snippet whose top-level keys are not config
  sections fails too, naming the marker, so nothing is skipped silently.
- The README's runbook table is the one docs/runbook.md shows, and the capability matrix sits
  between its markers (a generator replaces what is between them).

tests/unit/test_hinted_commands.py checks that the `agentrl` commands these pages name exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl_cli.config import PlatformConfig, load_config
from agentrl_cli.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 15 * 1024
NOT_CONFIG = "<!-- not-config -->"
MATRIX_START, MATRIX_END = "<!-- capability-matrix:start -->", "<!-- capability-matrix:end -->"
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def fenced_blocks(path: Path) -> list[tuple[int, str, str, str]]:
    """(line of the opening fence, language, body, the non-blank line before the fence) per block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        close = m.group(1)[0] * len(m.group(1))
        j = i + 1
        while j < len(lines) and not lines[j].startswith(close):
            j += 1
        out.append((i + 1, m.group(2).lower(), "\n".join(lines[i + 1:j]), before))
        i = j + 1
    return out


def yaml_snippets() -> list[tuple[str, str, str]]:
    """(where, body, the line before) of every ```yaml block of the README and docs/*.md."""
    return [(f"{path.relative_to(ROOT)}:{line}", body, before)
            for path in pages() for line, lang, body, before in fenced_blocks(path) if lang in ("yaml", "yml")]


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move the detail to a page "
                                      "under docs/ and link it from the README")


def test_mkdocs_build_strict(tmp_path):
    """The site builds with every warning fatal, so a broken link or anchor fails here and in CI."""
    try:
        import material  # noqa: F401  (the theme mkdocs.yml names)
        import mkdocs  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"{exc.name} is not installed: it is in the dev extra, `pip install -e '.[dev]'`")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_mkdocs_validation_is_on():
    """The strictness the build test relies on is configured, not assumed."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["theme"]["name"] == "material"
    links = config["validation"]["links"]
    assert {links[k] for k in ("not_found", "anchors", "absolute_links", "unrecognized_links")} == {"warn"}
    assert config["validation"]["nav"]["omitted_files"] == "warn"


def test_there_are_config_snippets_to_check():
    assert len(yaml_snippets()) >= 5


@pytest.mark.parametrize("where,body,before", yaml_snippets(), ids=[w for w, _, _ in yaml_snippets()])
def test_config_snippet_validates(where, body, before, tmp_path):
    if before == NOT_CONFIG:
        pytest.skip(f"{where} is marked {NOT_CONFIG}")
    data = yaml.safe_load(body)
    assert isinstance(data, dict) and data, f"{where}: a config snippet is a mapping of sections"
    sections = set(PlatformConfig.model_fields)
    strangers = sorted(set(data) - sections)
    assert not strangers, (f"{where}: top-level keys {strangers} are not config sections ({', '.join(sorted(sections))}); "
                           f"if this snippet is not an agentrl config, put {NOT_CONFIG} on the line before its fence")
    path = tmp_path / "snippet.yaml"
    path.write_text(body, encoding="utf-8")
    try:
        load_config(path, env={})
    except ConfigError as exc:
        pytest.fail(f"{where}: the snippet does not validate against the config schema:\n{exc}")


def test_the_snippet_check_catches_a_bad_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout: {concurency: 8}\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(path, env={})


def _slug(text: str) -> str:
    """The anchor MkDocs (toc's default slugify) and GitHub give a heading."""
    from markdown.extensions.toc import slugify

    return slugify(re.sub(r"[`*]", "", text), "-")


def _anchors(path: Path) -> set[str]:
    text, found, fence = path.read_text(encoding="utf-8").splitlines(), set(), False
    for line in text:
        if FENCE.match(line):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)):
            found.add(_slug(m.group(1)))
    return found


def test_readme_links_resolve():
    """The README is outside the site, so its relative links and their anchors are checked here."""
    text = README.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (README.parent / file) if file else README
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(path):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file or 'README.md'}")
    assert not broken, "README.md links that do not resolve:\n" + "\n".join(broken)


def _runbook_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("| stage | brings up or checks | built |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def test_readme_runbook_table_matches_the_docs():
    readme = _runbook_table(README.read_text(encoding="utf-8"))
    assert [row.split(" ", 2)[1] for row in readme[2:]] == [str(n) for n in range(9)], "the runbook table lists stages 0-8"
    assert readme == _runbook_table((DOCS / "runbook.md").read_text(encoding="utf-8")), \
        "README.md's runbook table differs from docs/runbook.md's: change both"


def test_readme_keeps_the_quick_start_and_the_matrix_markers():
    text = README.read_text(encoding="utf-8")
    assert "bash .ci/setup && .venv/bin/agentrl stage run all" in text
    assert "bash .ci/setup --dev && .venv/bin/ruff check && .venv/bin/python -m pytest" in text
    assert text.count(MATRIX_START) == 1 and text.count(MATRIX_END) == 1
    assert text.index(MATRIX_START) < text.index(MATRIX_END)
