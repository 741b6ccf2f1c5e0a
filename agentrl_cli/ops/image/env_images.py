"""The environment images in the image lock: each harness's `harnesses[].image` pinned by the digest
it resolves to (`environment_images` in the lock: harness -> {"ref", "digest"}), beside the role
images the lock's packages make; and stage 2's check of each against the lock: the image present,
every blob verified, and its digest the one the lock pins (a mismatch fails naming both).

A lock without `environment_images` pins none (every harness on the host's root); the key is
written only when a harness names an image, so a lock of the default config is unchanged.
Belongs here: pinning and judging environment images. Not here: reading or unpacking an image
(`agentrl_cli.envs.images`), the role images (`lock.py`, `render.py`).
"""

from __future__ import annotations

from agentrl_cli.core.report import Check
from agentrl_cli.envs.images import ImageError, digest_of

KEY = "environment_images"
RELOCK = "pin the images the config names now with `agentrl image lock` (it writes image.lock_file)"


def configured(harnesses) -> dict[str, str]:
    """harness -> its image reference, for the harnesses that name one."""
    return {h.name: h.image for h in harnesses if h.image}


def pin(harnesses) -> tuple[dict[str, dict], dict[str, ImageError]]:
    """({harness: {"ref", "digest"}} for every image that resolves, {harness: the ImageError} for the rest)."""
    pins, errors = {}, {}
    for name, ref in configured(harnesses).items():
        try:
            pins[name] = {"ref": ref, "digest": digest_of(ref)}
        except ImageError as exc:
            errors[name] = exc
    return pins, errors


def malformed(lock: dict) -> list[str]:
    """What is wrong with a lock's `environment_images` (empty when absent or well-formed)."""
    pins = lock.get(KEY)
    if pins is None:
        return []
    ok = isinstance(pins, dict) and all(isinstance(v, dict) and isinstance(v.get("ref"), str)
                                        and isinstance(v.get("digest"), str) for v in pins.values())
    return [] if ok else [f"{KEY} must map harness names to {{ref, digest}}"]


def checks(lock: dict, source: str, harnesses) -> list[Check]:
    """One check per harness with an image, or pinned one by the lock at `source`: the image the
    config names found and verified, its digest the one pinned. No image anywhere: one skip saying so."""
    pinned = lock.get(KEY) or {}
    images = configured(harnesses)
    if not images and not pinned:
        return [Check.skipped("environment images", "no harnesses[].image set and none pinned: every harness's sandbox "
                              "runs on the host's root filesystem (read-only), so there is no image to verify",
                              "an image pinned by digest for each harness that names one")]
    return [_check(name, images.get(name, ""), pinned.get(name), source) for name in sorted(set(images) | set(pinned))]


def _check(name: str, ref: str, pin: dict | None, source: str) -> Check:
    title = f"environment image ({name})"
    expected = "the image the config names, every blob verified, at the digest the lock pins"
    if not ref:
        return Check.judge(title, False, {"pinned": pin}, expected,
                           f"set harnesses[{name}].image to the pinned image ({pin['ref']}), or {RELOCK}",
                           f"the lock at {source} pins {pin['digest']} ({pin['ref']}) for {name}, but the config runs it "
                           "on the host's root filesystem (no harnesses[].image)")
    try:
        actual = digest_of(ref)
    except ImageError as exc:
        return Check.judge(title, False, {"image": ref, "pinned": pin and pin["digest"]}, expected,
                           exc.hint or f"check harnesses[{name}].image", exc.message)
    measured = {"image": ref, "digest": actual, "pinned": pin and pin["digest"]}
    if pin is None:
        return Check.judge(title, False, measured, expected, RELOCK,
                           f"the lock at {source} pins no image for {name}, which runs in {ref} ({actual})")
    return Check.judge(title, actual == pin["digest"], measured, expected,
                       f"restore the pinned image ({pin['ref']}, {pin['digest']}) at harnesses[{name}].image, or {RELOCK}",
                       "" if actual == pin["digest"] else
                       f"{ref} is {actual}, the lock at {source} pins {pin['digest']} ({pin['ref']})")
