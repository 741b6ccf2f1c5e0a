"""Dockerfiles for the base image and the role images, rendered from `templates/docker/` and a lock.

One base image pins the runtime (Python from `cluster.base_image`, torch and the base role's
packages, installed `--no-deps` from exact pins); each role image is a thin layer on it with the
role's remaining pins and agentrl's wheel, and runs `agentrl image verify` for its role by default.
Every image ends as the non-root user of `names.py` (numeric USER, the pods' runAsUser/runAsGroup).
Tags come from the lock (`lock.image_tags`, shared with the rendered manifests through `names.py`). The build context gets the requirement files and a
copy of the lock; `images.json` lists the tags in build order, and the harnesses' environment images the lock pins by digest. Belongs here: rendering and reading
the rendered files back to check them; building is `build.py`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from string import Template

import templates
from agentrl_cli.ops.image.lock import image_tags, normalize
from agentrl_cli.ops.image.names import HOME, RUN_GID, RUN_UID, RUN_USER, WORKDIR
from agentrl_cli.core.report import Check

TEMPLATE_DIR = Path(templates.__file__).parent / "docker"
TORCH_INDEX = "https://download.pytorch.org/whl/"


def _torch_index(build: dict) -> str:
    version = build.get("version") or ""
    if build.get("cuda"):
        flavour = "cu" + build["cuda"].replace(".", "")
    elif build.get("hip"):
        flavour = "rocm" + ".".join(build["hip"].split(".")[:2])
    elif version.endswith("+cpu"):
        flavour = "cpu"
    else:
        return ""
    return f"--extra-index-url {TORCH_INDEX}{flavour}"


def agentrl_version(lock: dict) -> str:
    for body in lock["roles"].values():
        for name, p in body["packages"].items():
            if normalize(name) == "agentrl-cli":
                return p["version"]
    return "0"


def wheel_name(lock: dict) -> str:
    return f"agentrl_cli-{agentrl_version(lock)}-py3-none-any.whl"


def _pins(packages: dict) -> str:
    return "".join(f"{name}=={p['version']}\n" for name, p in sorted(packages.items(), key=lambda kv: normalize(kv[0])))


def render(lock: dict, out_dir: Path, registry: str, base_image: str) -> dict:
    """Write Dockerfile.base, Dockerfile.<role>, requirements-<role>.txt, agentrl.lock.json and
    images.json into `out_dir`; returns what images.json holds."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tags = image_tags(lock, registry)
    base_pkgs = lock["roles"]["base"]["packages"]
    base_names = {normalize(n) for n in base_pkgs}
    build = lock.get("torch_build") or {}
    common = {"digest": lock["digest"], "python": lock["python"], "torch": build.get("version") or "none",
              "base_tag": tags["base"], "wheel": wheel_name(lock),
              "user": RUN_USER, "uid": RUN_UID, "gid": RUN_GID, "home": HOME, "workdir": WORKDIR}
    files = {"Dockerfile.base": Template((TEMPLATE_DIR / "Dockerfile.base").read_text()).substitute(
        common, base_image=base_image or lock.get("base_image") or "python:3.11-slim", torch_index=_torch_index(build)),
        "requirements-base.txt": _pins(base_pkgs)}
    role_tpl = Template((TEMPLATE_DIR / "Dockerfile.role").read_text())
    images = [{"role": "base", "tag": tags["base"], "dockerfile": "Dockerfile.base"}]
    for role, body in lock["roles"].items():
        if role == "base":
            continue
        extra = {n: p for n, p in body["packages"].items() if normalize(n) not in base_names and normalize(n) != "agentrl-cli"}
        files[f"Dockerfile.{role}"] = role_tpl.substitute(common, role=role)
        files[f"requirements-{role}.txt"] = _pins(extra)
        images.append({"role": role, "tag": tags[role], "dockerfile": f"Dockerfile.{role}"})
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "agentrl.lock.json").write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    index = {"digest": lock["digest"], "wheel": wheel_name(lock), "images": images, "context": str(out.absolute()),
             # the harnesses' environment images, pinned by digest (built by `image build --role env` or brought as OCI layouts)
             "environment_images": [{"harness": h, **pin} for h, pin in sorted(lock.get("environment_images", {}).items())]}
    (out / "images.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return index


def _read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[normalize(name)] = version
    return pins


def render_checks(lock: dict, out_dir: Path) -> list[Check]:
    """Read the rendered files back: nothing left unrendered, every role FROM the base tag, and
    every locked package of every role pinned exactly at its locked version."""
    out = Path(out_dir)
    index = json.loads((out / "images.json").read_text())
    problems = []
    base_tag = index["images"][0]["tag"]
    base_pins = _read_pins(out / "requirements-base.txt")
    for img in index["images"]:
        text = (out / img["dockerfile"]).read_text()
        if "${" in text or re.search(r"\$[a-z_]+", text):
            problems.append(f"{img['dockerfile']}: unrendered placeholder")
        froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
        users = re.findall(r"^USER\s+(\S+)", text, re.M)
        if not users or users[-1] != f"{RUN_UID}:{RUN_GID}":
            problems.append(f"{img['dockerfile']}: runs as {users[-1] if users else 'root (no USER)'}, expected the non-root "
                            f"{RUN_UID}:{RUN_GID} the pods' securityContext names")
        if img["role"] != "base" and froms != [base_tag]:
            problems.append(f"{img['dockerfile']}: FROM {froms}, expected the base image {base_tag}")
        if img["role"] == "base":
            continue
        pins = {**base_pins, **_read_pins(out / f"requirements-{img['role']}.txt")}
        for name, p in lock["roles"][img["role"]]["packages"].items():
            n = normalize(name)
            if n == "agentrl-cli":
                continue
            if pins.get(n) != p["version"]:
                problems.append(f"{img['role']}: {name} pinned {pins.get(n)}, locked {p['version']}")
    for name, p in lock["roles"]["base"]["packages"].items():
        if base_pins.get(normalize(name)) != p["version"]:
            problems.append(f"base: {name} pinned {base_pins.get(normalize(name))}, locked {p['version']}")
    return [Check.judge("Dockerfiles rendered", not problems,
                        {"images": {i["role"]: i["tag"] for i in index["images"]}, "context": index["context"]},
                        f"one base image, every role FROM it, every locked package pinned at its version, every image "
                        f"running as {RUN_UID}:{RUN_GID}",
                        "fix templates/docker/ (a placeholder or FROM line) or relock", "\n".join(problems[:20]))]
