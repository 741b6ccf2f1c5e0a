"""Image names and the user images run as: the one source `agentrl image build` and
`agentrl controlplane render` share.

Tags come from the lock (`lock.image_tags`: registry, image role, agentrl's version and the lock
digest), so the manifests rendered from a lock name exactly the images `image build` tags from it.
Each workload of the manifests runs the image of one lock role (`WORKLOAD_ROLES`). Every image runs
as `RUN_UID:RUN_GID` (numeric, non-root, above the range hosts give their own users, so the pod's
runAsUser/runAsGroup and the image's USER agree), with HOME and the working directory owned by it;
the pods mount both writable over a read-only root file system.
Belongs here: names, tags and the run-as user; rendering Dockerfiles is `render.py`.
"""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.ops.image.lock import build_lock, image_tags, read_lock

RUN_USER, RUN_UID, RUN_GID = "agentrl", 10001, 10001
HOME, WORKDIR = "/home/agentrl", "/var/lib/agentrl"
# workload of the rendered manifests -> image role of the lock (image.roles)
WORKLOAD_ROLES = {"controlplane": "controlplane", "trainer": "train", "inference": "inference", "gateway": "inference",
                  "reward": "env", "sandbox": "env"}


def config_lock(config) -> tuple[dict, str]:
    """(the lock, where it came from): `image.lock_file` when it exists, else the lock of this
    environment as `agentrl image lock` would write it here."""
    path = Path(config.image.lock_file)
    if path.exists():
        return read_lock(path), str(path)
    return build_lock(config.image, config.inference.engine, config.cluster.base_image), "this environment (no image.lock_file)"


def workload_images(lock: dict, registry: str) -> dict[str, str]:
    """workload -> the tag `image build` gives its image role from `lock`."""
    tags = image_tags(lock, registry)
    missing = sorted({role for role in WORKLOAD_ROLES.values() if role not in tags})
    if missing:
        need = ", ".join(f"{w} runs {r}" for w, r in WORKLOAD_ROLES.items() if r in missing)
        raise ConfigError(f"the image lock has no role {', '.join(missing)} ({need}), so no image would exist for it",
                          f"add {', '.join(f'image.roles.{m}' for m in missing)} (e.g. [agentrl-cli]) and relock with "
                          "`agentrl image lock`")
    return {workload: tags[role] for workload, role in WORKLOAD_ROLES.items()}


def config_images(config) -> dict[str, str]:
    """workload -> image tag for `config` (its lock file, else this environment's lock)."""
    return workload_images(config_lock(config)[0], config.cluster.image_registry)
