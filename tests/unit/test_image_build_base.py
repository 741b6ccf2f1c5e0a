"""Stage 2's image build: the base images the Dockerfiles start FROM, a base the builder can neither
find nor pull is a skip naming it (never a failed build), and buildah verifies without podman."""

import shutil

import pytest

from agentrl_cli.core.report import CheckStatus
from agentrl_cli.ops.image.build import build_checks, build_commands, external_bases


def _index(tmp_path, base="127.0.0.1:9/agentrl/none:0"):  # loopback port 9 (discard): nothing listens, the pull is refused
    (tmp_path / "Dockerfile.base").write_text(f"FROM {base}\nRUN true\n")
    (tmp_path / "Dockerfile.trainer").write_text("FROM agentrl/base:1\nRUN true\n")
    return {"context": str(tmp_path), "images": [{"role": "base", "tag": "agentrl/base:1", "dockerfile": "Dockerfile.base"},
                                                 {"role": "trainer", "tag": "agentrl/trainer:1", "dockerfile": "Dockerfile.trainer"}]}


def test_external_bases_are_the_froms_no_rendered_image_builds(tmp_path):
    assert external_bases(_index(tmp_path, "python:3.11-slim")) == ["python:3.11-slim"]


def test_buildah_verifies_in_a_working_container_of_its_own_not_with_podman(tmp_path):
    verify = [c for label, c in build_commands("buildah", _index(tmp_path)) if label == "verify trainer"][0]
    assert "podman" not in " ".join(verify)
    assert "buildah from --name agentrl-verify-trainer agentrl/trainer:1" in verify[-1]
    assert "buildah run agentrl-verify-trainer -- agentrl image verify --role trainer" in verify[-1]


@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed (Debian package buildah)")
def test_a_base_image_buildah_cannot_get_skips_the_build_naming_it(tmp_path):
    checks = build_checks(_index(tmp_path), "buildah")
    assert [c.status for c in checks] == [CheckStatus.SKIP]
    assert "127.0.0.1:9/agentrl/none:0" in checks[0].detail and "buildah bud" in checks[0].detail
    assert "cluster.base_image" in checks[0].hint
