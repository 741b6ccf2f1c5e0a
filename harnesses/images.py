"""The image a configured harness's episodes run in, as runs record it and replay checks it: the
reference (`harnesses[].image`) and the manifest digest it resolves to now. A harness that acts
through no sandbox (tool_api_like: its tools are an HTTP API) runs in no image whatever its entry
says, so its digest is "" like the host root's.

`image_tag` is a label only (recorded in meta.json beside this); `image` is what the sandboxes run in.
Belongs here: naming the image of a harness. Not here: resolving or unpacking images
(`agentrl_cli.envs.images`), running in them (`agentrl_cli.envs.sandbox`)."""

from __future__ import annotations

from dataclasses import dataclass

HOST_ROOT = ""  # the digest recorded for an episode on the host's root filesystem (or with no sandbox)


@dataclass(frozen=True)
class HarnessImage:
    ref: str  # harnesses[].image as configured ("" = the host root)
    digest: str  # what episodes run in: the image's manifest digest, HOST_ROOT when none
    sandboxed: bool  # whether the harness's episodes run in sandboxes at all

    def to_dict(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "sandboxed": self.sandboxed}


def harness_image(name: str, platform_config) -> HarnessImage:
    """The image `name`'s episodes run in under `platform_config` (its `harnesses[]` entry; none, or
    no config: the host root). ImageError (exit 2, naming the image and why) when its image cannot be
    found or verified."""
    from agentrl_cli.envs.images import digest_of
    from harnesses.registry import uses_sandboxes

    hc = next((h for h in getattr(platform_config, "harnesses", ()) if h.name == name), None)
    ref = hc.image if hc is not None else ""
    sandboxed = uses_sandboxes(name)
    pinned = hc.image_digest if hc is not None else ""  # the service's pin: the client may hold no copy of the image
    return HarnessImage(ref, (pinned or digest_of(ref)) if ref and sandboxed else HOST_ROOT, sandboxed)


def task_image(name: str, platform_config, task_id: str) -> HarnessImage:
    """The image the episodes of one task run in: the harness's (`harness_image`), unless the harness
    gives its tasks images of their own (a classmethod `task_image_digest(options, task_id)` returning
    a digest, or None for the harness's image; the Harbor adapter's tasks built from their Dockerfiles)."""
    from harnesses.registry import resolve

    own = getattr(resolve(name), "task_image_digest", None)
    if own is not None:
        options = next((dict(h.options) for h in getattr(platform_config, "harnesses", ()) if h.name == name), {})
        digest = own(options, task_id)
        if digest is not None:
            return HarnessImage(f"{name} task {task_id}", digest, True)
    return harness_image(name, platform_config)


def describe(digest: str | None) -> str:
    """Where a digest says an episode ran, for a message."""
    if digest is None:
        return "an image not recorded (a trajectory stored before schema 4)"
    return f"image {digest}" if digest else "the host's root filesystem (no image)"
