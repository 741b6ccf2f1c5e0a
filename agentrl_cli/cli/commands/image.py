"""`agentrl image lock|render|verify|build`: the image lock, role Dockerfiles, and the environment against them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from agentrl_cli.cli.commands.common import ConfigOpt, JsonOpt, SetOpt, checks_json, err, finish, load, out, print_json
from agentrl_cli.cli.render import print_table, render_checks

app = typer.Typer(help="Lock exact versions per role, render Dockerfiles, verify this environment, build images.",
                  no_args_is_help=True)

LockOpt = Annotated[Optional[Path], typer.Option("--lock", help="Lock file (default: image.lock_file).", show_default=False,
                                                 dir_okay=False)]


@app.command("lock")
def lock_cmd(
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Where to write the lock (default: image.lock_file).", show_default=False, dir_okay=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write the lock of exact versions and licences per role (image.roles) from this environment:
    Python, torch and its CUDA/ROCm build, DeepSpeed, transformers, SGLang or vLLM for the inference
    role when inference.engine is sglang or vllm, agentrl itself and everything they need; and the
    engine versions that passed the conformance check (pinned in CI, or `agentrl engine verify` here). Exit 1 when a role's
    package is missing or a licence is outside image.allowed_licences (the lock is written anyway).

    Examples:

    * `agentrl image lock`

    * `agentrl image lock --out locks/gpu-node.lock.json --json`
    """
    from agentrl_cli.envs.images import ImageError
    from agentrl_cli.ops.image import env_images
    from agentrl_cli.ops.image.lock import build_lock, image_tags, lock_checks, write_lock

    cfg = load(config, sets).config
    pins, unresolved = env_images.pin(cfg.harnesses)
    if unresolved:
        name, exc = next(iter(unresolved.items()))  # the lock pins every harnesses[].image by its digest
        raise ImageError(exc.image, f"{exc.reason} (harnesses[{name}].image, which the lock pins by digest)",
                         exc.hint or f"fix harnesses[{name}].image, or unset it for the host's root, and lock again")
    lock = build_lock(cfg.image, cfg.inference.engine, cfg.cluster.base_image, cfg.model.cache_dir, env_images=pins)
    path = write_lock(lock, out_path or Path(cfg.image.lock_file))
    checks = lock_checks(lock, cfg.image.allowed_licences)
    tags = image_tags(lock, cfg.cluster.image_registry)
    if json_out:
        print_json(checks_json(checks, lock_file=str(path), digest=lock["digest"], python=lock["python"],
                               torch_build=lock["torch_build"], tags=tags, verified_engines=lock["verified_engines"],
                               roles={r: {"packages": len(b["packages"]), "missing": b["missing"]} for r, b in lock["roles"].items()}))
    else:
        t = Table("role", "packages", "tag", title=f"image lock {path} (digest {lock['digest'][:12]})", title_justify="left")
        for role, body in lock["roles"].items():
            t.add_row(role, str(len(body["packages"])), tags[role])
        print_table(out(), t)
        out().print("engine versions verified (agentrl engine verify): " +
                    "; ".join(f"{e} {', '.join(v)}" for e, v in lock["verified_engines"].items()))
        render_checks(out(), checks, "lock checks")
    finish(checks)


@app.command("render")
def render_cmd(
    lock_path: LockOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Build context directory to write.", file_okay=False)] = Path("image-build"),
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Render Dockerfiles from templates/docker/ and a lock: one base image pinning the runtime, a
    thin image per role on it, tags derived from the lock; requirement files, the lock and
    images.json (tags in build order) go into the build context.

    Examples:

    * `agentrl image render`

    * `agentrl image render --lock agentrl.lock.json --out build/image --json`
    """
    from agentrl_cli.ops.image.lock import read_lock
    from agentrl_cli.ops.image.render import render, render_checks

    cfg = load(config, sets).config
    lock = read_lock(lock_path or Path(cfg.image.lock_file))
    index = render(lock, out_dir, cfg.cluster.image_registry, cfg.cluster.base_image)
    checks = render_checks(lock, out_dir)
    if json_out:
        print_json(checks_json(checks, **index))
    else:
        t = Table("role", "Dockerfile", "tag", title=f"rendered into {out_dir}", title_justify="left")
        for img in index["images"]:
            t.add_row(img["role"], img["dockerfile"], img["tag"])
        print_table(out(), t)
        render_checks(out(), checks, "render checks")
    finish(checks)


@app.command("verify")
def verify_cmd(
    lock_path: LockOpt = None,
    role: Annotated[Optional[str], typer.Option("--role", help="Role to verify (default: $AGENTRL_IMAGE_ROLE, else train).", show_default=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the running environment against the lock for a role: Python, every package at its
    locked version (each mismatch named with its fix), torch and the expected devices, NCCL where
    there are GPUs, DeepSpeed's own report (train), SGLang (inference with engine sglang).
    Exit 0 pass, 1 a mismatch, 2 a missing or malformed lock.

    Examples:

    * `agentrl image verify`

    * `agentrl image verify --role inference --lock /opt/agentrl/agentrl.lock.json --json`
    """
    from agentrl_cli.ops.image.lock import read_lock
    from agentrl_cli.ops.image.verify import verify_checks

    cfg = load(config, sets).config
    role = role or os.environ.get("AGENTRL_IMAGE_ROLE") or "train"
    path = lock_path or Path(cfg.image.lock_file)
    lock = read_lock(path, strict_digest=False)
    checks = verify_checks(lock, role, cfg)
    if json_out:
        print_json(checks_json(checks, lock_file=str(path), role=role, digest=lock["digest"]))
    else:
        render_checks(out(), checks, f"environment vs {path} (role {role})", verbose=True)
    finish(checks)


@app.command("build")
def build_cmd(
    lock_path: LockOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Build context directory.", file_okay=False)] = Path("image-build"),
    role: Annotated[Optional[str], typer.Option("--role", help="env: build the harnesses' environment image from Debian's packages with mmdebstrap (no daemon) instead of the Dockerfile roles.", show_default=False)] = None,
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", help="With --role env: where built images are kept (default: ~/.cache/agentrl/images).", show_default=False, file_okay=False)] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="With --role env: build again even when a whole image of the same inputs is cached.")] = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Render, then build the base and role images with docker, podman or buildah (image.builder)
    and run `agentrl image verify` inside each. Without a working builder the check is a skip that
    lists the exact commands that would run. Exit 0 built or skipped, 1 a build or verify failed.

    With `--role env`: build the built-in harnesses' environment image (Debian 12 minbase with bash,
    coreutils and Python 3) with mmdebstrap, as an OCI layout in a cache directory named by the hash
    of its inputs; unchanged inputs reuse it ("cached"). Prints the reference for
    `harnesses[].image` / `sandbox run --image` and the manifest digest. The first build takes about
    half a minute to minutes (it downloads the packages); progress goes to stderr. Exit 2 when
    mmdebstrap is missing, 1 when it fails.

    Examples:

    * `agentrl image build`

    * `agentrl image build --set image.builder=podman --json`

    * `agentrl image build --role env --json`
    """
    if role is not None:
        _build_role(role, cache_dir, rebuild, json_out)
        return
    from agentrl_cli.ops.image.build import build_checks
    from agentrl_cli.ops.image.lock import read_lock
    from agentrl_cli.ops.image.render import render, render_checks

    cfg = load(config, sets).config
    lock = read_lock(lock_path or Path(cfg.image.lock_file))
    index = render(lock, out_dir, cfg.cluster.image_registry, cfg.cluster.base_image)
    checks = render_checks(lock, out_dir)
    if not json_out:
        err().print(f"build context {out_dir}; building {len(index['images'])} images")
    checks += build_checks(index, cfg.image.builder)
    if json_out:
        print_json(checks_json(checks, **index))
    else:
        render_checks(out(), checks, "image build")
    finish(checks)


def _build_role(role: str, cache_dir: Path | None, rebuild: bool, json_out: bool) -> None:
    from agentrl_cli.core.errors import UsageError
    from agentrl_cli.ops.image.env_image import build_env_image, default_cache_root

    if role != "env":
        raise UsageError(f"--role {role!r} is not built from Debian's packages; only env is",
                         "use --role env, or leave --role out to build the Dockerfile roles with a builder")
    console = err()
    image = build_env_image(cache_dir or default_cache_root(), progress=lambda line: console.print(line, markup=False, soft_wrap=True),
                            force=rebuild)
    how = "cached" if image.cached else f"built in {image.seconds:g} s"
    if json_out:
        print_json({"status": "pass", "role": role, "reference": image.reference, "digest": image.digest,
                    "path": str(image.path), "cached": image.cached, "seconds": image.seconds,
                    "release": image.inputs.release, "mirror": image.inputs.mirror, "packages": list(image.inputs.packages)})
        return
    console.print(f"env image {how}", markup=False)
    typer.echo(f"{image.reference}\n{image.digest}")  # whole lines, never wrapped: they are pasted into --image


@app.command("unpack")
def unpack_cmd(
    image: Annotated[str, typer.Argument(help="The image: oci:PATH[:TAG], oci-archive:FILE[:TAG] or docker-archive:FILE[:TAG].")],
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", help="The image cache to unpack into (default sandbox.image_cache_dir).", show_default=False, file_okay=False)] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Verify an image and unpack it into an image cache (once per digest, as a run would), then
    print its digest and root. This is how a volume is filled for the sandbox service's pods, which
    run an image by digest from their cache (docs/environments.md). Exit 2 when the image cannot
    be found, verified or unpacked.

    Examples:

    * `agentrl image unpack oci:/root/.cache/agentrl/images/env-bfa95970dde6f0d0:env`

    * `agentrl image unpack docker-archive:debian.tar:debian:12 --cache-dir /mnt/agentrl-images --json`
    """
    from agentrl_cli.envs.images import resolve

    cfg = load(config, sets).config
    rootfs = resolve(image, cache_dir or Path(cfg.sandbox.image_cache_dir).expanduser())
    if json_out:
        print_json({"status": "pass", "image": image, "digest": rootfs.digest, "root": str(rootfs.path)})
        return
    typer.echo(f"{rootfs.digest}\n{rootfs.path}")
