"""The running environment against the image lock and a role's needs.

Checks: Python's version; every locked package of the role installed at its locked version (each
mismatch named with the pip command that fixes it); torch imports and sees the devices the cluster
config expects; NCCL available where there are GPUs; DeepSpeed's own report (`ds_report`) runs and
agrees with the installed torch; the inference engine's modules importable for the inference role
(SGLang's with engine sglang). A part that cannot exist here (NCCL without a GPU, SGLang with the
embedded engine) is a skip that says what would be checked. Belongs here: the comparison and the probes, nothing that builds.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys

from agentrl_cli.ops.image.lock import digest_check, installed, normalize
from agentrl_cli.core.report import Check, CheckStatus

DS_OP = re.compile(r"^(?P<op>[a-z0-9_]+)\s*\.+\s*\[(?P<installed>[^\]]*)\]\s*\.+\s*\[(?P<compatible>[^\]]*)\]")


def package_mismatches(lock: dict, role: str) -> list[dict]:
    """[{package, locked, installed, fix}] for every package of `role` that differs here."""
    dists = installed()
    out = []
    for name, p in lock["roles"][role]["packages"].items():
        d = dists.get(normalize(name))
        have = d.version if d is not None else None
        if have != p["version"]:
            out.append({"package": name, "locked": p["version"], "installed": have,
                        "fix": f"pip install --no-deps '{name}=={p['version']}'"})
    return out


def python_check(lock: dict) -> Check:
    have, want = platform.python_version(), lock["python"]
    same_minor = have.split(".")[:2] == want.split(".")[:2]
    return Check.judge("python matches the lock", same_minor, have, f"{want} (major.minor must match)",
                       f"use Python {'.'.join(want.split('.')[:2])} (the base image pins it), or relock with `agentrl image lock`",
                       "" if have == want else f"patch release differs: {have} here, {want} locked")


def packages_check(lock: dict, role: str, name: str = "packages match the lock") -> Check:
    if role not in lock["roles"]:
        return Check(name, CheckStatus.FAIL, role, f"a role of the lock: {', '.join(lock['roles'])}",
                     f"the lock has no role {role!r}", "pass --role with one of the lock's roles, or relock")
    bad = package_mismatches(lock, role)
    detail = "\n".join(f"{m['package']}: locked {m['locked']}, installed {m['installed'] or 'not installed'} -> {m['fix']}"
                       for m in bad)
    return Check.judge(name, not bad,
                       {"role": role, "packages": len(lock["roles"][role]["packages"]), "mismatched": [m["package"] for m in bad]},
                       f"every {role} package at its locked version",
                       "install the locked versions (the fixes are in the detail), or relock with `agentrl image lock` "
                       "if the change was intended", detail)


def _probe_torch() -> dict:
    code = ("import json, torch, torch.distributed as d\n"
            "cuda = torch.cuda.is_available()\n"
            "out = {'version': torch.__version__, 'cuda_build': torch.version.cuda, 'hip_build': torch.version.hip,\n"
            "       'cuda': cuda, 'devices': torch.cuda.device_count() if cuda else 0,\n"
            "       'gloo': d.is_gloo_available(), 'nccl': d.is_nccl_available()}\n"
            "if cuda and d.is_nccl_available():\n"
            "    out['nccl_version'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[-1500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def device_checks(gpus_per_node: int) -> list[Check]:
    t = _probe_torch()
    if "error" in t:
        return [Check("torch sees the expected devices", CheckStatus.FAIL, None, "torch imports", t["error"],
                      "reinstall torch for this host's hardware (CPU: `pip install torch==2.13.0`; GPUs: the CUDA build)")]
    want = gpus_per_node
    measured = {k: t[k] for k in ("version", "cuda", "devices", "cuda_build")}
    if want:
        dev = Check.judge("torch sees the expected devices", t["cuda"] and t["devices"] >= want, measured,
                          f">= {want} GPUs (cluster.gpus_per_node)",
                          "install the CUDA build of torch matching the driver (`nvidia-smi`), check CUDA_VISIBLE_DEVICES "
                          "and the container's GPU runtime")
    else:
        dev = Check.judge("torch sees the expected devices", True, measured, "CPU (cluster.gpus_per_node: 0)", "",
                          f"{t['devices']} GPU(s) visible, unused by this config" if t["devices"] else "")
    if t["devices"] or want:
        nccl = Check.judge("NCCL available", bool(t.get("nccl_version")), {"nccl": t.get("nccl_version"), "available": t["nccl"]},
                           "torch built with NCCL and it reports a version",
                           "use a CUDA build of torch (the CPU build has no NCCL); check that libnccl matches on every node")
    else:
        nccl = Check.skipped("NCCL available", "no GPU here (cluster.gpus_per_node: 0): on GPU nodes this checks that torch "
                             "has NCCL and reports its version; gloo serves CPU ranks",
                             "NCCL version from torch.cuda.nccl.version()")
        nccl.measured = {"gloo": t["gloo"]}
    return [dev, nccl]


def deepspeed_check() -> Check:
    """DeepSpeed's own environment report: it runs, and names the installed torch."""
    # mlflow refused as if not installed: DeepSpeed's autotuner imports it (with pandas) only for its own
    # experiments, 1.8 s of the report's start-up here (learner/deepspeed_backend.import_deepspeed)
    cmd = [sys.executable, "-c", "import sys; sys.modules['mlflow'] = None\n"
           "from deepspeed.env_report import cli_main; cli_main()"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return Check("DeepSpeed report", CheckStatus.FAIL, None, "ds_report finishes", "ds_report did not finish in 300 s",
                     "run `ds_report` by hand to see where it stops")
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)
    ops = {m["op"]: (m["installed"].strip(), m["compatible"].strip()) for m in map(DS_OP.match, text.splitlines()) if m}
    torch_line = re.search(r"torch version\s*\.+\s*(\S+)", text)
    ds_line = re.search(r"deepspeed info\s*\.+\s*(\S+)", text)
    from importlib import metadata

    torch_v, ds_v = metadata.version("torch"), metadata.version("deepspeed")
    reported_ds = ds_line.group(1).rstrip(",") if ds_line else None
    agree = (torch_line is not None and torch_line.group(1).split("+")[0] == torch_v.split("+")[0]
             and reported_ds is not None and reported_ds.split("+")[0] == ds_v.split("+")[0])
    compatible = sorted(op for op, (_, c) in ops.items() if c.upper() == "OKAY")
    # agentrl passes torch's AdamW to DeepSpeed, so no DeepSpeed op must be compiled for training
    return Check.judge("DeepSpeed report", proc.returncode == 0 and agree,
                       {"deepspeed": reported_ds, "torch": torch_line.group(1) if torch_line else None,
                        "ops_compatible": len(compatible), "ops_listed": len(ops)},
                       "ds_report runs and names the installed torch and DeepSpeed; no op must be compiled (agentrl uses torch AdamW)",
                       "reinstall deepspeed against the installed torch (`pip install --force-reinstall --no-deps deepspeed`)",
                       proc.stderr.strip()[-1500:] if proc.returncode else "")


def engine_checks(engine_name: str, python: str) -> list[Check]:
    """The engine's modules (`import_modules`) import with `python` (inference.python). An engine
    that is part of agentrl has nothing to import: then each registered engine that would import
    something is a skip saying what it would check."""
    from agentrl_cli.engines.registry import ENGINES, engine_named

    engine = engine_named(engine_name)
    if not engine.import_modules:
        return [Check.skipped(f"{other.title} importable", f"inference.engine is {engine_name} ({engine.title}): with "
                              f"engine {name} this imports {' and '.join(other.import_modules)} with inference.python ({python})")
                for name, other in ((n, engine_named(n)) for n in ENGINES) if other.import_modules]
    modules = engine.import_modules
    proc = subprocess.run([python, "-c", f"import {', '.join(modules)}; print({modules[0]}.__version__)"],
                          capture_output=True, text=True, timeout=300)
    return [Check.judge(f"{engine.title} importable", proc.returncode == 0, proc.stdout.strip() or None,
                        f"{' and '.join(modules)} import with {python}",
                        f"install {engine.title} for inference.python (`pip install {' '.join(engine.lock_packages)}`) "
                        "or point inference.python at its environment", proc.stderr.strip()[-1500:])]


def verify_checks(lock: dict, role: str, config) -> list[Check]:
    checks = [digest_check(lock), python_check(lock), packages_check(lock, role)]
    checks += device_checks(config.cluster.gpus_per_node)
    if role in ("train", "base"):
        checks.append(deepspeed_check())
    if role == "inference":
        checks += engine_checks(config.inference.engine, config.inference.python)
    return checks
