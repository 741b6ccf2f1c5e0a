"""The acceptance criterion of the engine seam: a test engine written from the docs' recipe
(docs/engines.md, tests/engines/recipe_engine.py) serves stage 4, named only in the config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl_cli.model.tiny import build_random
from tests.engines import recipe_engine
from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
PATH = "tests.engines.recipe_engine:RecipeEngine"


def test_a_test_engine_written_from_the_docs_recipe_serves_stage_4(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # for its servers
    recipe_engine.USED.clear()
    model = build_random(tmp_path / "model", seed=3)
    result, data = cli.json("stage", "run", "4", "--set", f"inference.engine={PATH}", "--set", f"model.path={model}",
                            "--set", f"inference.port={free_port()}", "--set", "stages.inference_load_concurrency=8",
                            # the default throughput floor is test_stage4's; this test judges that the
                            # recipe's engine serves every check, not how fast
                            "--set", "stages.inference_min_tokens_per_s=1")
    report = data["reports"][0]
    failing = [(c["name"], c["detail"][:300]) for c in report["checks"] if c["status"] != "pass"]
    assert result.exit_code == 0 and report["status"] == "pass", failing
    assert report["environment"]["engine"] == PATH
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["weight update round trip"]["measured"]["versions"] == ["0", "stage4-perturbed", "stage4-restored"]
    # the engine object was really used: the launcher asked it for the server's command, the server
    # process it started ran the engine's own serve (its log is named after the engine), and the
    # stage's client built its generate requests with it
    assert recipe_engine.USED["server_launch"] == 1 and recipe_engine.USED["generate_body"] > 0
    [log] = list(tmp_path.rglob("logs/recipe-0.log"))  # the run directory is under the working directory
    assert recipe_engine.MARK in log.read_text()
    assert not list(tmp_path.rglob("hf-0.log"))
