"""`agentrl stage run 2`, `agentrl image lock|render|verify|build` and `agentrl plan` as a user runs them."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.ops.image.lock import lock_digest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_stage_2_passes_here_and_skips_only_what_cannot_exist(cli, isolated):
    result, data = cli.json("stage", "run", "2")
    report = data["reports"][0]
    by_name = {c["name"]: c for c in report["checks"]}
    assert result.exit_code == 0 and report["status"] == "pass", [(c["name"], c["detail"][:300]) for c in report["checks"]
                                                                   if c["status"] == "fail"]
    skipped = {n: c["detail"] for n, c in by_name.items() if c["status"] == "skip"}
    assert set(skipped) <= {"NCCL available", "SGLang importable", "vLLM importable", "image build and probe",
                            "environment images"}
    assert "no harnesses[].image" in skipped["environment images"]  # the default config runs on the host's root
    assert "GPU" in skipped.get("NCCL available", "GPU") and "engine" in skipped.get("SGLang importable", "engine")
    assert "engine" in skipped.get("vLLM importable", "engine")
    if "image build and probe" in skipped:
        assert "docker build" in skipped["image build and probe"] or "buildah bud" in skipped["image build and probe"]
    for name in ("lock complete", "licences allowed", "Dockerfiles rendered", "packages match the lock (train)",
                 "packages match the lock (inference)", "packages match the lock (env)", "DeepSpeed report"):
        assert by_name[name]["status"] == "pass", name
    image = isolated / "runs" / data["run_id"] / "image"
    assert (image / "agentrl.lock.json").exists() and (image / "build" / "Dockerfile.train").exists()


def test_stage_2_with_a_malformed_lock_file_fails_with_a_hint(cli, tmp_path):
    bad = tmp_path / "broken.lock.json"
    bad.write_text('{"schema_version": 1, "roles": ')
    result, data = cli.json("stage", "run", "2", "--set", f"image.lock_file={bad}")
    check = next(c for c in data["reports"][0]["checks"] if c["name"] == "image lock readable")
    assert result.exit_code == 1 and check["status"] == "fail" and "agentrl image lock" in check["hint"]


@pytest.fixture
def lock_file(cli, tmp_path):
    result, data = cli.json("image", "lock", "--out", str(tmp_path / "agentrl.lock.json"))
    assert result.exit_code == 0 and data["status"] == "pass"
    return tmp_path / "agentrl.lock.json"


def test_verify_fails_naming_the_package_when_the_environment_differs(cli, lock_file, tmp_path):
    lock = json.loads(lock_file.read_text())
    for role in lock["roles"].values():  # as if locked on a host with another pyarrow
        if "pyarrow" in role["packages"]:
            role["packages"]["pyarrow"]["version"] = "1.0.0"
    lock["digest"] = lock_digest(lock)
    other = tmp_path / "other-host.lock.json"
    other.write_text(json.dumps(lock))
    result, data = cli.json("image", "verify", "--lock", str(other), "--role", "env")
    packages = next(c for c in data["checks"] if c["name"] == "packages match the lock")
    assert result.exit_code == 1 and packages["status"] == "fail"
    assert packages["measured"]["mismatched"] == ["pyarrow"] and "pyarrow==1.0.0" in packages["detail"]
    result, data = cli.json("image", "verify", "--lock", str(lock_file), "--role", "env")
    assert result.exit_code == 0 and data["status"] == "pass"


def test_render_and_build_from_the_lock(cli, lock_file, tmp_path):
    result, data = cli.json("image", "render", "--lock", str(lock_file), "--out", str(tmp_path / "ctx"))
    assert result.exit_code == 0 and [i["role"] for i in data["images"]] == ["base", "train", "inference", "env", "controlplane"]
    assert (tmp_path / "ctx" / "Dockerfile.base").read_text().count("FROM ") == 1
    result, data = cli.json("image", "build", "--lock", str(lock_file), "--out", str(tmp_path / "ctx"))
    build = data["checks"][-1]
    assert build["name"] == "image build and probe" and build["status"] in ("pass", "skip")
    assert result.exit_code == (0 if build["status"] != "fail" else 1)


def test_malformed_lock_is_a_usage_error_without_traceback(cli, tmp_path):
    (tmp_path / "bad.json").write_text("[1, 2")
    for cmd in ("verify", "render"):
        result = cli("image", cmd, "--lock", str(tmp_path / "bad.json"))
        assert result.exit_code == 2 and "not valid JSON" in result.stderr and "Traceback" not in result.output


def test_plan_json_has_every_area_with_formulas(cli, random_model_dir):
    result, data = cli.json("plan", "--set", f"model.path={random_model_dir}")
    assert result.exit_code == 0 and data["model"]["params"] > 0
    assert {ln["area"] for ln in data["lines"]} == {"training", "inference", "rollout", "environments", "storage"}
    assert all(ln["formula"] for ln in data["lines"])
