"""Running the conformance check for one engine: build its surface (the launch argv after the
interpreter and `wire_calls`), run the probe under the engine's interpreter, read its answer.

Belongs here: the surface, the probe's run and its result. Does not: reading the engine's code
(`probe/`), rendering (`agentrl_cli/cli/`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from agentrl_cli.engines.inference.launcher import InferenceUnavailable

PROBE = Path(__file__).parent / "probe" / "probe_main.py"
MARK = "@@PROBE-RESULT@@"
PROBED = {"sglang", "vllm"}  # engines the probe knows how to read


@dataclass
class Conformance:
    """What the probe found: `problems` empty and `items` not is a pass."""

    engine: str
    version: str
    python: str
    items: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    import_errors: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[dict]:
        return [i for i in self.items if not i["ok"]]

    @property
    def passed(self) -> bool:
        return bool(self.items) and not self.problems

    @property
    def paths(self) -> str:
        """How the engine's code was read: "imported", "source", or both."""
        return "+".join(sorted({i["path"] for i in self.items})) or "none"

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "passed": self.passed, "paths": self.paths}


def surface(engine, config) -> dict:
    """The launch argv (after the interpreter) and the wire calls of `engine` under `config`."""
    with tempfile.TemporaryDirectory(prefix="agentrl-conformance-") as key_dir:
        launch = engine.server_launch(config, "/models/policy", config.inference.port, key_dir=Path(key_dir),
                                      beside_trainer=False)
    calls = [dataclasses.asdict(c) for c in engine.wire_calls(config)]
    return {"argv": list(launch.cmd[1:]), "calls": calls}


def run_probe(kind: str, python: str, argv: list[str], calls: list[dict], timeout_s: float = 600) -> Conformance:
    """The probe for engine `kind` ("sglang", "vllm") under `python`."""
    if kind not in PROBED:
        raise ValueError(f"no conformance probe for engine {kind!r}: it reads {sorted(PROBED)}")
    request = json.dumps({"engine": kind, "argv": argv, "calls": calls})
    try:
        proc = subprocess.run([python, str(PROBE)], input=request, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise InferenceUnavailable(f"no interpreter at {python}", f"point --python (or inference.python) at the "
                                   f"Python of the environment that has {kind}") from None
    except subprocess.TimeoutExpired:
        raise InferenceUnavailable(f"the conformance probe under {python} did not finish in {timeout_s:.0f}s",
                                   "run it again; if it hangs, an import of the engine blocks (see its log)") from None
    if MARK not in proc.stdout:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "PackageNotFoundError" in proc.stderr or "no package" in proc.stderr:
            raise InferenceUnavailable(f"{kind} is not installed for {python} ({last})",
                                       f"install it there (`pip install {kind}`), or pass --python of the environment "
                                       f"that has it; `bash scripts/engine-venvs.sh` builds the pinned ones")
        raise InferenceUnavailable(f"the conformance probe failed under {python}: {last}",
                                   "run the probe by hand to see the traceback: "
                                   f"{python} {PROBE} < surface.json")
    data = json.loads(proc.stdout.split(MARK, 1)[1].strip().splitlines()[0])
    return Conformance(data["engine"], data["version"], data["python"], data["items"], data.get("notes", []),
                       data.get("import_errors", {}))


def verify(engine, config, python: str | None = None) -> Conformance:
    """The check for `engine` (an InferenceEngine) under `config`, with `python` or inference.python."""
    kind = probe_kind(engine)
    s = surface(engine, config)
    return run_probe(kind, python or config.inference.python, s["argv"], s["calls"])


def probe_kind(engine) -> str:
    """Which engine's code the probe reads for `engine`: its first lock package that the probe knows."""
    for package in engine.lock_packages:
        if package in PROBED:
            return package
    raise ValueError(f"{engine.title} is not a production engine the conformance probe reads "
                     f"({', '.join(sorted(PROBED))}): there is nothing of its own to check against")
