"""The rendered manifests carry the harnesses' images (docs/environments.md "The sandbox service
and images"): the digest of each harness image is read at render and named on the sandbox pods and
in the config the clients read, and the sandbox pods mount the image cache read-only at
sandbox.image_cache_dir; a harness image whose digest cannot be had refuses to render. (That they
validate against the schemas is in test_manifests.py, whose worker has the schemas loaded.)"""

from __future__ import annotations

import pytest
import yaml

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.envs.images import ImageError
from agentrl_cli.ops.controlplane.manifests import IMAGES_ANNOTATION, IMAGES_CLAIM, render_all
from agentrl_cli.ops.image.names import WORKLOAD_ROLES
from tests.image_layouts import entry, tar_layer, write_layout

PINNED = "sha256:" + "d" * 64
# `agentrl plan`'s figures, fixed: computing them loads the model's shape (seconds), which these tests do not need
PLAN = {"storage checkpoint size": 1.0, "inference KV cache per server": 1.0, "inference memory per server": 2.0,
        "environments hosts": 2, "environments CPU cores": 8, "environments memory": 8.0, "training memory per rank": 4.0}
IMAGES = {w: f"registry.example/agentrl-{w}:t" for w in WORKLOAD_ROLES}


def _render(harnesses: list[dict]) -> list[dict]:
    return render_all(PlatformConfig.model_validate({"cluster": {"namespace": "rl"}, "harnesses": harnesses,
                                                     "sandbox": {"image_cache_dir": "/var/cache/agentrl-images"}}),
                      images=IMAGES, plan=PLAN)


def _sandbox_pod(docs) -> tuple[dict, dict]:
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    return sts["spec"]["template"]["metadata"], sts["spec"]["template"]["spec"]


def test_the_sandbox_pods_mount_the_image_cache_and_name_each_harness_digest(tmp_path):
    layout = write_layout(tmp_path / "layout", [tar_layer([entry("f", b"x")])], tag="env")
    docs = _render([{"name": "terminal_like", "image": f"oci:{layout}:env"},
                    {"name": "tool_api_like", "image": "oci:/only/on/the/build/host:env", "image_digest": PINNED},
                    {"name": "code_sandbox_like"}])
    meta, pod = _sandbox_pod(docs)
    from agentrl_cli.envs.images import digest_of

    digest = digest_of(f"oci:{layout}:env")
    assert meta["annotations"][IMAGES_ANNOTATION] == f"terminal_like={digest}, tool_api_like={PINNED}"
    (container,) = pod["containers"]
    assert {"name": "images", "mountPath": "/var/cache/agentrl-images", "readOnly": True} in container["volumeMounts"]
    assert {"name": "images", "persistentVolumeClaim": {"claimName": IMAGES_CLAIM, "readOnly": True}} in pod["volumes"]
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):  # the clients ask the service for these digests
        pinned = {h["name"]: h["image_digest"] for h in yaml.safe_load(cm["data"]["agentrl.yaml"])["harnesses"]}
        assert pinned == {"terminal_like": digest, "tool_api_like": PINNED, "code_sandbox_like": ""}


def test_without_harness_images_the_sandbox_pods_get_no_image_volume():
    meta, pod = _sandbox_pod(_render([{"name": "terminal_like"}]))
    assert "annotations" not in meta and all(v["name"] != "images" for v in pod["volumes"])


def test_a_harness_image_whose_digest_cannot_be_had_refuses_to_render(tmp_path):
    with pytest.raises(ImageError, match="harness 'terminal_like': the manifests must name its digest, and no OCI layout"):
        _render([{"name": "terminal_like", "image": f"oci:{tmp_path / 'missing'}:env"}])
