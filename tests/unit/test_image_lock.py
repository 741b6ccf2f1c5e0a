"""The image lock from this environment, licence judging, reading bad locks, and rendered Dockerfiles
read back."""

from __future__ import annotations

import json

import pytest

from agentrl_cli.config import load_config
from agentrl_cli.ops.image.lock import (LockError, build_lock, closure, installed, licence_allowed, lock_checks, lock_digest,
                                    read_lock, write_lock)
from agentrl_cli.ops.image.render import render, render_checks


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, []).config


@pytest.fixture(scope="module")
def lock(cfg):
    return build_lock(cfg.image, cfg.inference.engine, cfg.cluster.base_image)


def test_lock_pins_every_role_with_versions_licences_and_torch_build(lock):
    from importlib import metadata

    assert set(lock["roles"]) == {"base", "train", "inference", "env", "controlplane"}
    train = lock["roles"]["train"]["packages"]
    for name in ("torch", "deepspeed", "transformers", "agentrl-cli"):
        assert train[name]["version"] == metadata.version(name)
        assert train[name]["licence"] and train[name]["licence"] != "UNKNOWN"
    assert set(lock["roles"]["base"]["packages"]) <= set(train)  # the base is under every role
    assert lock["torch_build"]["version"] == metadata.version("torch")
    assert lock["digest"] == lock_digest(lock)


def test_closure_follows_requirements_and_reports_missing_roots():
    names, missing = closure(["typer", "no-such-package-xyz"], installed())
    assert {"typer", "rich", "markdown-it-py"} <= names and missing == ["no-such-package-xyz"]


@pytest.mark.parametrize("expr,ok", [("MIT", True), ("Apache-2.0 AND MIT", True), ("GPL-3.0 OR MIT", True),
                                     ("Apache-2.0 WITH LLVM-exception", True), ("MIT AND GPL-3.0", False),
                                     ("UNKNOWN", False), ("(BSD-3-Clause OR GPL-2.0)", True)])
def test_licence_expressions(expr, ok):
    assert licence_allowed(expr, ["MIT", "Apache-2.0", "BSD-*"]) is ok


def test_a_licence_outside_the_allowed_list_fails_naming_the_package(cfg):
    narrow = cfg.image.model_copy(update={"allowed_licences": ["Apache-2.0"]})
    checks = {c.name: c for c in lock_checks(build_lock(narrow), narrow.allowed_licences)}
    bad = checks["licences allowed"]
    assert bad.status == "fail" and "typer: MIT" in bad.detail and "image.allowed_licences" in bad.hint


def test_a_missing_role_package_fails_the_lock(cfg):
    roles = {**cfg.image.roles, "inference": ["agentrl-cli", "sglang-not-installed"]}
    img = cfg.image.model_copy(update={"roles": roles})
    complete = lock_checks(build_lock(img), img.allowed_licences)[0]
    assert complete.status == "fail" and "sglang-not-installed" in complete.detail


def test_malformed_missing_and_edited_locks_are_named_with_the_fix(tmp_path, lock):
    with pytest.raises(LockError, match="no image lock"):
        read_lock(tmp_path / "absent.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(LockError, match="not valid JSON") as e:
        read_lock(tmp_path / "garbage.json")
    assert "agentrl image lock" in e.value.hint
    (tmp_path / "wrong.json").write_text(json.dumps({"schema_version": 1, "roles": {"train": {}}}))
    with pytest.raises(LockError, match="base role"):
        read_lock(tmp_path / "wrong.json")
    edited = json.loads(json.dumps(lock))
    edited["roles"]["train"]["packages"]["torch"]["version"] = "0.1"
    write_lock(edited, tmp_path / "edited.json")
    with pytest.raises(LockError, match="edited by hand"):
        read_lock(tmp_path / "edited.json")
    assert read_lock(tmp_path / "edited.json", strict_digest=False)["roles"]["train"]["packages"]["torch"]["version"] == "0.1"


def test_rendered_dockerfiles_pin_the_lock_and_a_broken_one_is_caught(tmp_path, lock, cfg):
    index = render(lock, tmp_path, cfg.cluster.image_registry, cfg.cluster.base_image)
    assert [i["role"] for i in index["images"]] == ["base", "train", "inference", "env", "controlplane"]
    base = (tmp_path / "Dockerfile.base").read_text()
    assert f"FROM {cfg.cluster.base_image}" in base and f"torch=={lock['torch_build']['version']}" in (tmp_path / "requirements-base.txt").read_text()
    train = (tmp_path / "Dockerfile.train").read_text()
    assert f"FROM {index['images'][0]['tag']}" in train and lock["digest"] in train
    assert render_checks(lock, tmp_path)[0].status == "pass"
    reqs = tmp_path / "requirements-train.txt"
    reqs.write_text(reqs.read_text().replace(f"deepspeed=={lock['roles']['train']['packages']['deepspeed']['version']}", "deepspeed==0.0.1"))
    broken = render_checks(lock, tmp_path)[0]
    assert broken.status == "fail" and "deepspeed" in broken.detail
    env = tmp_path / "Dockerfile.env"
    assert env.read_text().rstrip().splitlines()[-3] == "USER 10001:10001"  # before ENTRYPOINT and CMD
    env.write_text(env.read_text().replace("USER 10001:10001", ""))
    rooted = render_checks(lock, tmp_path)[0]
    assert rooted.status == "fail" and "Dockerfile.env: runs as 0:0, expected the non-root 10001:10001" in rooted.detail
