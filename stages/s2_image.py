"""Stage 2 - image and runtime.

Checks: the lock of exact versions per role (base, train, inference, env) made from this
environment is complete and every package's licence is within `image.allowed_licences`; the
Dockerfiles rendered from `templates/docker/` pin exactly the lock; the running environment
matches the lock (`image.lock_file` when it exists, else the lock this run wrote): Python, every
role's packages, torch and the devices the cluster config expects, NCCL where there are GPUs,
DeepSpeed's own report, the inference engine's modules (SGLang's with engine sglang); each
harness's environment image (`harnesses[].image`) pinned in the lock beside the role images, found,
verified and at the digest the lock pins (none configured: skipped, saying so); with docker,
podman or buildah working here, the role images are built and verified inside. The lock, the
Dockerfiles and the build context are kept under `runs/<run_id>/image/`.
"""

from __future__ import annotations

from pathlib import Path

from agentrl_cli.acceptance.context import StageContext
from agentrl_cli.ops.image import env_images
from agentrl_cli.ops.image.build import build_checks
from agentrl_cli.ops.image.lock import LockError, build_lock, lock_checks, read_lock, write_lock
from agentrl_cli.ops.image.render import render, render_checks
from agentrl_cli.ops.image.verify import deepspeed_check, device_checks, engine_checks, packages_check, python_check
from agentrl_cli.core.report import Check, CheckStatus, StageReport


def run(ctx: StageContext) -> StageReport:
    cfg = ctx.config
    out = ctx.run.path / "image"
    ctx.progress("lock")
    pins, _unresolved = env_images.pin(cfg.harnesses)  # an image that does not resolve fails its check below
    lock = build_lock(cfg.image, cfg.inference.engine, cfg.cluster.base_image, env_images=pins)
    written = write_lock(lock, out / "agentrl.lock.json")
    checks = lock_checks(lock, cfg.image.allowed_licences)
    notes = [f"this environment's lock: {written} (digest {lock['digest'][:12]})"]
    pinned = Path(cfg.image.lock_file)
    try:
        if pinned.exists():
            reference, source = read_lock(pinned), str(pinned)
        else:
            reference, source = read_lock(written), str(written)
            notes.append(f"no image.lock_file at {pinned} yet, so the environment is compared with the lock this run wrote; "
                         "pin one with `agentrl image lock` and later runs compare with it")
    except LockError as exc:
        checks.append(Check("image lock readable", CheckStatus.FAIL, str(pinned), "a valid lock file", exc.message, exc.hint))
        return ctx.report(checks, notes)
    checks.append(Check("image lock readable", CheckStatus.PASS, {"file": source, "digest": reference["digest"][:12]}, "a valid lock file"))
    ctx.progress("Dockerfiles")
    index = render(reference, out / "build", cfg.cluster.image_registry, cfg.cluster.base_image)
    checks.append(ctx.check("Dockerfiles rendered", lambda: render_checks(reference, out / "build")[0]))
    ctx.progress("environment against the lock")
    checks.append(python_check(reference))
    for role in reference["roles"]:
        if role != "base":
            checks.append(packages_check(reference, role, f"packages match the lock ({role})"))
    checks += device_checks(cfg.cluster.gpus_per_node)
    checks.append(ctx.check("DeepSpeed report", deepspeed_check))
    if "inference" in reference["roles"]:
        checks += engine_checks(cfg.inference.engine, cfg.inference.python)
    ctx.progress("environment images")
    checks += env_images.checks(reference, source, cfg.harnesses)
    ctx.progress("image build")
    checks += build_checks(index, cfg.image.builder)
    return ctx.report(checks, notes, environment={"image_lock": {"file": source, "digest": reference["digest"],
                                                                 "tags": {i["role"]: i["tag"] for i in index["images"]},
                                                                 "environment_images": reference.get(env_images.KEY, {})}})
