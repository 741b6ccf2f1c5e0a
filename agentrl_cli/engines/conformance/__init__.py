"""Conformance of agentrl's engine clients against the engines' OWN code: the launch command line
through the engine's argument parser, each request's route, body and query against its route
table and request models, and each field we read against its response models
(`agentrl engine verify`, stage 4, `agentrl image lock`; docs/engines.md "Verified engine versions").

The check runs `probe/probe_main.py` under the engine's interpreter (`inference.python`), which needs
no agentrl there; this side builds what to check from the engine object and reads the answer.
Belongs here: the pinned versions we verify (`VERIFIED`), building the surface, running the probe,
the record of passes. Does not: reading the engine's code (`probe/`), rendering (`cli/`)."""

from __future__ import annotations

# The engine versions CI verifies (scripts/engine-venvs.sh installs exactly these; pyproject's extras pin them).
VERIFIED: dict[str, str] = {"sglang": "0.5.23", "vllm": "0.33.0"}
