"""Issue 47's acceptance for pinned images (long: stage 8 smoke plays real episodes, a few minutes on
2 cores; the first `image build --role env` adds mmdebstrap's download, later ones reuse the cached
image): with all three built-in harnesses' `harnesses[].image` set to the environment image `agentrl
image build --role env` makes from Debian's packages (tool_api_like's is refused: it acts through no
sandbox), stage 5 passes and reports each sandboxed
harness's image digest, its os-release (Debian 12) and a host-only file absent inside; stage 8 smoke
passes; meta.json and every stored trajectory of a sandboxed harness carry the image's digest
(tool_api_like acts through no sandbox: none); and `agentrl replay` of one of them with the harness
on the host's root is refused, naming both.

    .venv/bin/python -m pytest -m long tests/e2e/test_stages_in_env_image.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.model.resolve import builtin_dir
from agentrl_cli.model.tiny import is_complete
from tests.image_layouts import traversable_dir

pytestmark = [pytest.mark.e2e, pytest.mark.long,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
              pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="needs mmdebstrap (apt-get install -y mmdebstrap)")]
HARNESSES = ("terminal_like", "code_sandbox_like", "tool_api_like")
SANDBOXED = HARNESSES[:2]


def _agentrl(env: dict, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl_cli", *args], capture_output=True, text=True, timeout=timeout, env=env)


def _checks(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for r in json.loads(proc.stdout)["reports"] for c in r["checks"]}


def test_stage5_and_stage8_smoke_in_the_env_image_record_its_digest_and_replay_refuses_another(tmp_path, quick_sets):
    d = traversable_dir("agentrl-test-pinned-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
        env |= {"AGENTRL_SANDBOX__IMAGE_CACHE_DIR": str(d / "cache"), "AGENTRL_SANDBOX__ROOT_DIR": str(d / "sandboxes")}
        built = _agentrl(env, "image", "build", "--role", "env", "--json")  # the cached image when its inputs are unchanged
        assert built.returncode == 0, built.stderr[-3000:]
        image = json.loads(built.stdout)
        digest = image["digest"]
        sets = list(quick_sets)
        if is_complete(builtin_dir(load_config(None, [], env={}).config.model.cache_dir)):
            sets += ["--set", "model.path=builtin:tiny-agent"]  # a model that calls tools: commands run in the image
        sets += ["--set", f"observe.runs_dir={tmp_path / 'runs'}", "--set", f"data.root={tmp_path / 'data'}"]
        # the sandboxed ones: an image on tool_api_like, which acts through no sandbox, is refused at load
        sets += [a for i in range(len(SANDBOXED)) for a in ("--set", f"harnesses.{i}.image={image['reference']}")]

        stage5 = _agentrl(env, "stage", "run", "5", "--json", *sets)
        checks = _checks(stage5)
        assert stage5.returncode == 0, [(n, c["detail"][-400:]) for n, c in checks.items() if c["status"] == "fail"]
        for name in SANDBOXED:
            assert checks[f"harness {name}: image"]["measured"]["digest"] == digest
            assert checks[f"harness {name}: image os-release"]["measured"]["pretty_name"].startswith("Debian GNU/Linux 12")
            absent = checks[f"harness {name}: host-only file absent in image"]
            assert absent["status"] == "pass" and absent["measured"]["visible_on_host_root"] is True
            assert checks[f"harness {name}: scripted episodes"]["status"] == "pass"

        stage8 = _agentrl(env, "stage", "run", "8", "--phase", "smoke", "--json", *sets)
        checks8 = _checks(stage8)
        failing = [n for n, c in checks8.items() if c["status"] == "fail"]
        assert stage8.returncode == 0 and not failing, [(n, checks8[n]["detail"][-400:]) for n in failing] + [stage8.stderr[-2000:]]

        run_dir = tmp_path / "runs" / json.loads(stage8.stdout)["run_dir"].rstrip("/").split("/")[-1]
        meta = json.loads((run_dir / "meta.json").read_text())
        images = {h["name"]: h["image"] for h in meta["harnesses"]}
        assert all(images[n] == {"ref": image["reference"], "digest": digest, "sandboxed": True} for n in SANDBOXED), images
        assert images["tool_api_like"]["digest"] == ""

        from agentrl_cli.runtime.data.local_store import LocalStore
        from agentrl_cli.runtime.data.writer import read_records

        records = read_records(LocalStore(tmp_path / "data"))
        assert {r.harness for r in records} >= set(SANDBOXED), {r.harness for r in records}
        for r in records:
            assert (r.schema_version, r.image_digest) == (4, digest if r.harness in SANDBOXED else ""), (r.harness, r.image_digest)

        one = next(r for r in records if r.harness == "terminal_like")
        data_sets = ["--set", f"data.root={tmp_path / 'data'}"]
        refused = _agentrl(env, "replay", one.trajectory_id, *data_sets)  # terminal_like on the host's root
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"ran in image {digest}" in refused.stderr and "the host's root filesystem" in refused.stderr
        same = _agentrl(env, "replay", one.trajectory_id, *data_sets, "--set", f"harnesses.0.image={image['reference']}")
        assert same.returncode in (0, 1) and "ran in image" not in same.stderr, same.stderr[-2000:]  # replayed, not refused
    finally:
        shutil.rmtree(d, ignore_errors=True)
