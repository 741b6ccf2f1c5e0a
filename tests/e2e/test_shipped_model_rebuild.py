"""A rebuild of the built-in model from its recipe meets the shipped copy's quality bar: stage 4's checks
and stage 8 smoke pass with it, and its greedy success on every default harness (the held-out
tool_api_like included) is the shipped model's within noise (three standard errors of the difference
of two rates). Marked `long`: the build takes several minutes on two cores.

    .venv/bin/python -m pytest -m long tests/e2e/test_shipped_model_rebuild.py -s
"""

from __future__ import annotations

import math
import shutil

import pytest

from agentrl_cli.model.resolve import build_tiny
from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.long,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")]


def _greedy(cli, model: str, cache) -> dict[str, tuple[int, int]]:
    """(successes, episodes) of each default harness's evaluation split, played greedily."""
    result, body = cli.json("eval", model, "--set", f"inference.port={free_port()}", "--set", f"model.cache_dir={cache}")
    assert result.exit_code == 0, result.stderr[-2000:]
    return {name: (h["greedy"]["success"], h["greedy"]["n"]) for name, h in body["harnesses"].items()}


def test_a_rebuild_from_the_recipe_meets_the_shipped_models_bar(cli, tmp_path):
    cache = tmp_path / "cache"
    rebuilt = build_tiny(tmp_path / "rebuilt")
    sets = ["--set", f"model.path={rebuilt}", "--set", f"inference.port={free_port()}", "--set", f"model.cache_dir={cache}"]
    result, data = cli.json("stage", "run", "4", *sets)
    assert result.exit_code == 0, [(c["name"], c["detail"][:300]) for c in data["reports"][0]["checks"] if c["status"] == "fail"]
    result, data = cli.json("stage", "run", "8", "--phase", "smoke", *sets[:2], "--set", f"inference.port={free_port()}",
                            "--set", f"model.cache_dir={cache}")
    assert result.exit_code == 0, [(c["name"], c["detail"][:300]) for c in data["reports"][-1]["checks"] if c["status"] == "fail"]

    ours, shipped = _greedy(cli, str(rebuilt), cache), _greedy(cli, "builtin:tiny-agent", cache)
    print("greedy success, rebuilt vs shipped:", {h: (ours[h], shipped[h]) for h in shipped})
    assert set(ours) == set(shipped)
    for harness, (s1, n1) in shipped.items():
        s2, n2 = ours[harness]
        p1, p2 = s1 / n1, s2 / n2
        pooled = (s1 + s2) / (n1 + n2)
        se = math.sqrt(max(pooled * (1 - pooled), 0.25 / (n1 + n2)) * (1 / n1 + 1 / n2))  # a floor: never 0 at 0% or 100%
        assert abs(p1 - p2) <= 3 * se, (harness, (s1, n1), (s2, n2))
