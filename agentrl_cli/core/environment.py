"""Facts about this host and the installed packages, recorded in run metadata and reports.

Reads package versions from distribution metadata, so nothing heavy (torch, deepspeed) is imported.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import sys
from importlib import metadata

import agentrl_cli

# the inference engines' own packages are added by the caller (`engines.registry.engine_packages`)
PACKAGES = ("agentrl-cli", "torch", "transformers", "deepspeed", "safetensors", "pyarrow", "boto3", "fastapi",
            "uvicorn", "httpx", "pydantic", "typer", "rich", "prometheus-client")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_facts() -> dict:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "bwrap": shutil.which("bwrap"),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "agentrl": agentrl_cli.__version__,
    }


def short_environment() -> dict:
    """The few facts each stage report carries (the full set is in meta.json)."""
    facts = host_facts()
    return {k: facts[k] for k in ("hostname", "python", "cpu_count", "memory_bytes", "agentrl")}
