"""The acceptance of `agentrl select` (issue 36): on the built-in model, `agentrl select --json`
covers all eight criteria for both backends, with the ZeRO 0-3 and FSDP table measured on 1 and 2
ranks, and exits 0 when every criterion has a measured value. Minutes, not seconds: behind the
`builtin` marker (`pytest -m builtin`)."""

from __future__ import annotations

import shutil

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.model.resolve import builtin_dir
from agentrl_cli.model.tiny import is_complete
from tests.conftest import free_port

pytestmark = [pytest.mark.builtin, pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
              pytest.mark.skipif(not is_complete(builtin_dir(load_config(None, [], env={}).config.model.cache_dir)),
                                 reason="the built-in model is not built (`agentrl model build-tiny`)")]


def test_select_covers_every_criterion_for_both_backends(cli, isolated):
    result, data = cli.json("select", "--set", f"inference.port={free_port()}", "--set", f"observe.runs_dir={isolated / 'runs'}")
    assert data["backends"] == ["deepspeed", "fsdp"] and len(data["criteria"]) == 8
    assert result.exit_code == 0 and data["complete"], data["unmeasured"]
    for criterion in data["criteria"]:
        for backend, cell in criterion["results"].items():
            assert cell["measured"] is not None and cell["status"] in ("pass", "fail", "info"), (criterion["key"], backend, cell)
    rows = {(r["strategy"], r["ranks"]): r for r in data["tables"]["parallel"]}
    assert set(rows) == {(s, n) for s in ("zero0", "zero1", "zero2", "zero3", "fsdp") for n in (1, 2)}
    assert all(r["status"] == "ok" and r["points"] and r["fit"] is not None for r in rows.values()), rows
