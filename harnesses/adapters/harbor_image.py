"""Which image a Harbor task runs in: its environment/Dockerfile built with buildah
(`agentrl_cli.envs.images.dockerfile`), or the fallback, said in every episode.

Options (harnesses[harbor].options):
- `build`: "off" (the default: today's behaviour, every task in the fallback), "auto" (build each
  task's Dockerfile; a task that cannot be built runs in the fallback, with the reason in its
  episodes and a warning) or "required" (a task that cannot be built is refused, exit 2).
- `base_images`: the Dockerfile's FROM name -> a local image (`oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`,
  `docker-archive:FILE[:TAG]`), or "env" for
  the image `agentrl image build --role env` built (Debian 12 with bash, coreutils and Python 3).
  The key "*" maps every other FROM. Default {"*": "env"}: ANY FROM (python:3.12-slim,
  ubuntu:24.04 ...) is built on agentrl's Debian env image, not on the image it names, since no
  registry is reachable to pull that one; map a FROM to its real image's layout where it matters.
- `fallback_image`: where a task that is not built runs: "" (the default) = the host's root, read-only,
  with environment/'s files copied in; or an image reference (`harnesses[].image` syntax).
- `build_dir`: where built layouts and buildah's storage live ("" = ~/.cache/agentrl/images).
- `build_network`: whether the Dockerfile's RUN steps reach the network (default false: they run
  in an empty network namespace, so `apt-get install` from a mirror fails; true for task sets you trust).

A build runs the Dockerfile's RUN steps as root in buildah's chroot isolation (docs/security.md
row 37): build only task sets you would `docker build` yourself.

Belongs here: the policy (what to build from what, what to fall back to, what to record). Not here:
running buildah (`envs/images/dockerfile.py`), the episode (`harbor.py`).
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.envs.images import ImageError, parse
from agentrl_cli.envs.images.dockerfile import BuildError, build, builder_missing, external_froms

log = logging.getLogger("agentrl.harbor")
BUILD_MODES = ("off", "auto", "required")
ENV_IMAGE = "env"  # a base_images value: the image `agentrl image build --role env` built
DEFAULT_BASES = {"*": ENV_IMAGE}
IMAGE_OPTIONS = ("build", "base_images", "fallback_image", "build_dir", "build_network")  # ImagePolicy's arguments


@dataclass(frozen=True)
class TaskImage:
    environment: str  # "built" | "fallback"
    image: str  # the reference the task's sandboxes run in; "" = the host's root
    digest: str  # the image's manifest digest ("" for the host's root)
    reason: str  # why the task is not in its built image ("" when it is)
    build_s: float | None = None
    cached: bool | None = None

    def record(self) -> dict:
        """What an episode says of its environment (its first observation's info)."""
        out = {"environment": self.environment, "image": self.image or "host", "digest": self.digest or None}
        if self.reason:
            out["reason"] = self.reason
        if self.build_s is not None:
            out.update(build_s=self.build_s, build_cached=self.cached)
        return out


class ImagePolicy:
    """The options above, checked; `for_task` builds (once per task and process) or falls back."""

    def __init__(self, build: str = "off", base_images: dict | None = None, fallback_image: str = "", build_dir: str = "",
                 build_network: bool = False) -> None:
        if build not in BUILD_MODES:
            raise ConfigError(f"harnesses[harbor].options.build: {build!r}", f"use one of {', '.join(BUILD_MODES)}")
        if not isinstance(base_images, (dict, type(None))) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in (base_images or {}).items()):
            raise ConfigError(f"harnesses[harbor].options.base_images: {base_images!r}",
                              'a mapping of FROM names to oci:DIR[:TAG] or "env", e.g. {"python:3.12-slim": "oci:/images/py:3.12"}')
        if build == "required" and (missing := builder_missing()):
            raise ConfigError(f"harnesses[harbor].options.build is 'required', but {missing}",
                              "apt-get install -y buildah, or set build: auto to run unbuildable tasks in the fallback image")
        if fallback_image:
            parse(fallback_image)  # a registry reference or an empty one is refused now, not at the first fallback
        self.mode = build
        self.bases = {**DEFAULT_BASES, **(base_images or {})}
        self.fallback_image = fallback_image
        self.network = bool(build_network)
        self.build_dir = Path(build_dir).expanduser() if build_dir else _default_build_dir()
        self._done: dict[str, TaskImage] = {}
        self._env_image: str | None = None
        self._lock = threading.Lock()

    def for_task(self, task_dir: Path) -> TaskImage:
        """The image the task's episodes run in (BuildError when it cannot be built and build is 'required')."""
        key = str(task_dir)
        with self._lock:  # one build per task, also when several episodes of it start at once
            if key not in self._done:
                self._done[key] = self._decide(task_dir)
            return self._done[key]

    def fallback(self, reason: str) -> TaskImage:
        return TaskImage("fallback", self.fallback_image, "", reason)

    def _decide(self, task_dir: Path) -> TaskImage:
        if self.mode == "off":
            return self.fallback("build is off (harnesses[harbor].options.build)")
        context = task_dir / "environment"
        try:
            if not (context / "Dockerfile").is_file():
                raise BuildError(str(task_dir), "the task has no environment/Dockerfile")
            froms = external_froms((context / "Dockerfile").read_text(encoding="utf-8"))
            bases = {name: self._base(name) for name in froms}
            built = build(context, bases, self.build_dir, progress=_progress(task_dir.name), network=self.network)
        except ImageError as exc:
            if self.mode == "required":
                raise
            reason = exc.reason + (f" (fix: {exc.hint})" if exc.hint else "")
            log.warning("Harbor task %s runs in the fallback image (%s): %s", task_dir.name, self.fallback_image or "host root", reason)
            return self.fallback(reason)
        if not built.cached:
            print(f"[harbor] built {task_dir.name} in {built.seconds} s: {built.image} ({built.digest})", file=sys.stderr)
        return TaskImage("built", built.image, built.digest, "", built.seconds, built.cached)

    def _base(self, name: str) -> str:
        ref = self.bases.get(name, self.bases.get("*", ""))
        if ref != ENV_IMAGE:
            return ref  # "" leaves the FROM unmapped: the builder refuses it, naming the fix
        if self._env_image is None:
            from agentrl_cli.ops.image.env_image import EnvInputs, cached_image, default_cache_root

            hit = cached_image(default_cache_root(), EnvInputs())
            if hit is None:
                raise BuildError(name, f"FROM {name} maps to the env image (base_images), which is not built here",
                                 "run `agentrl image build --role env` once (minutes), or map the FROM to an OCI layout "
                                 "in harnesses[harbor].options.base_images")
            self._env_image = hit.reference
        return self._env_image


def _default_build_dir() -> Path:
    from agentrl_cli.ops.image.env_image import default_cache_root

    return default_cache_root()


def _progress(task: str):
    def say(line: str) -> None:
        print(f"[harbor build {task}] {line}", file=sys.stderr)
    return say
