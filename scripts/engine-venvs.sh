#!/usr/bin/env bash
# Build the engine environments the conformance check runs in (`agentrl engine verify`,
# tests/integration/test_engine_conformance.py): one virtual environment per pinned engine
# (agentrl_cli/engines/conformance/__init__.py VERIFIED), holding the engine itself (--no-deps: none
# of its GPU kernels) and only the pure-Python packages its argument parser, route and protocol
# modules import, each at the engine's own version specifier. torch, transformers and what else
# agentrl's own environment (.venv) has are shared from it (a .pth after the engine's own packages, so
# a version the engine pins and installs here wins): two environments build side by side in about a
# minute instead of four. Idempotent: a complete one is kept.
# Usage: bash scripts/engine-venvs.sh [DIR]   (default ${AGENTRL_ENGINE_VENVS:-$HOME/.cache/agentrl/engines})
# Environment: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-${AGENTRL_ENGINE_VENVS:-$HOME/.cache/agentrl/engines}}"
py="${PYTHON:-python3}"
pins=$(.venv/bin/python -c "from agentrl_cli.engines.conformance import VERIFIED; print(' '.join(f'{k}=={v}' for k, v in VERIFIED.items()))")
# What each engine's modules import on a CPU machine (beyond the engine itself).
common="msgspec numpy orjson psutil pybase64 requests pydantic fastapi uvicorn uvloop pyzmq pillow packaging
        typing_extensions tqdm aiohttp transformers einops openai partial_json_parser prometheus_client pyyaml regex
        setproctitle cachetools cloudpickle"
sglang_deps="$common triton IPython python-multipart"
vllm_deps="$common cbor2 openai-harmony py-cpuinfo xgrammar llguidance blake3 python-json-logger ijson"

build() {  # build NAME VERSION
  local name=$1 version=$2 dir="$root/$1-$2" deps
  if [[ -f "$dir/.complete" ]]; then echo "engine-venvs: $dir is ready" >&2; return; fi
  echo "engine-venvs: building $dir" >&2
  rm -rf "$dir" && "$py" -m venv "$dir"
  # agentrl's environment after the engine's own site-packages (torch, transformers, fastapi, ...)
  .venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    > "$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-agentrl-venv.pth"
  local pip=("$dir/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install --no-deps "$name==$version"
  deps=$([[ $name == sglang ]] && echo "$sglang_deps" || echo "$vllm_deps")
  # each at the engine's own specifier where its metadata names one
  specs=$("$dir/bin/python" - "$name" $deps <<'PY'
import re, sys
from importlib.metadata import requires
name, wanted = sys.argv[1], sys.argv[2:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
declared = {}
for req in requires(name) or []:
    if "extra ==" in req:
        continue
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*([^;]*)", req)
    declared[norm(m.group(1))] = m.group(3).strip()
print(" ".join(w + declared.get(norm(w), "") for w in wanted))
PY
)
  "${pip[@]}" install $specs 2>&1 | grep -v "dependency conflicts\|requires\|incompatible\|^WARNING" >&2 || true
  "$dir/bin/python" -c "import $name" >/dev/null 2>&1 || true  # byte-compile the package's entry once
  touch "$dir/.complete"
}
# the engines build side by side (mostly waiting on downloads); any one failing fails the script
pids=()
for pin in $pins; do build "${pin%%==*}" "${pin##*==}" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done
