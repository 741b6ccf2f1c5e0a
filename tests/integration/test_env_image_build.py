"""The real `agentrl image build --role env` (long: mmdebstrap downloads Debian's packages, about
25 s here on a fast mirror, minutes on a slow one): the image it prints runs `sandbox run`, shows
Debian 12's release, runs Python 3, a rebuild is "cached", and stage 5's scripted episodes of the
three built-in harnesses pass inside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.image_layouts import traversable_dir
from tests.integration.conftest import needs_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.long, needs_bwrap,
              pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="needs mmdebstrap (apt-get install -y mmdebstrap)")]


def _agentrl(env: dict, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl_cli", *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_the_env_image_builds_from_debian_runs_the_builtin_harnesses_and_is_cached(tmp_path):
    d = traversable_dir("agentrl-test-envimg-")
    try:
        env = {**os.environ, "AGENTRL_SANDBOX__IMAGE_CACHE_DIR": str(d / "cache"),
               "AGENTRL_SANDBOX__ROOT_DIR": str(d / "sandboxes")}
        built = _agentrl(env, "image", "build", "--role", "env", "--cache-dir", str(tmp_path / "images"), "--json")
        assert built.returncode == 0, built.stderr[-3000:]
        image = json.loads(built.stdout)
        assert not image["cached"] and image["digest"].startswith("sha256:") and "I: success" in built.stderr
        again = json.loads(_agentrl(env, "image", "build", "--role", "env", "--cache-dir", str(tmp_path / "images"), "--json").stdout)
        assert again["cached"] and again["digest"] == image["digest"]

        release = _agentrl(env, "sandbox", "run", "--image", image["reference"], "--", "cat", "/etc/os-release")
        assert release.returncode == 0 and 'VERSION_ID="12"' in release.stdout and "ID=debian" in release.stdout, release.stderr
        py = _agentrl(env, "sandbox", "run", "--image", image["reference"], "--", "python3", "-c", "print(6 * 7)")
        assert py.stdout.strip() == "42", py.stderr

        sets = [a for i in range(3) for a in ("--set", f"harnesses.{i}.image={image['reference']}")]
        sets += ["--set", f"observe.runs_dir={tmp_path / 'runs'}"]
        stage = _agentrl(env, "stage", "run", "5", "--json", *sets)
        assert stage.returncode == 0, stage.stdout[-4000:] + stage.stderr[-2000:]
        checks = [c for s in json.loads(stage.stdout)["reports"] for c in s["checks"]]
        episodes = [c for c in checks if c["name"].endswith("scripted episodes")]
        assert len(episodes) == 3 and all(c["status"] == "pass" for c in episodes)
    finally:
        shutil.rmtree(d, ignore_errors=True)
