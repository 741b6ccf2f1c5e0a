"""A server's settings against the config it was started from: what an engine says a server started
from the config must report (`InferenceEngine.expected_settings`), what each server's
`routes.server_info` answer reports (`reported_settings`), and the differences, each naming the
config key. Stage 4's "server settings match the config" check is `settings_check`.

Belongs here: the comparison and asking the servers. Does not: which settings an engine expects or
how it reads an answer (each engine's module, `sglang_dialect.py`), starting servers
(`inference/launcher.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import httpx

from agentrl_cli.core.httpclient import http_client
from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.core.security.keys import client_key
from agentrl_cli.engines.engine import SERVER, Setting
from agentrl_cli.engines.registry import engine_for

NAME = "server settings match the config"
HINT = ("start the servers from this config (a run's own servers get each setting from the engine's launch "
        "command, docs/engines.md), or for inference.urls restart those servers with the config's settings, "
        "or set the named key to what the servers serve")


def same(reported: object, expected: object) -> bool:
    """Equal values; numbers within float rounding (the embedded server reports its batch window
    from seconds), a bool only as a bool."""
    if isinstance(reported, bool) or isinstance(expected, bool):
        return type(reported) is type(expected) and reported == expected
    if isinstance(reported, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(reported, expected, rel_tol=1e-9, abs_tol=1e-9)
    return reported == expected


def differences(expected: Mapping[str, object], reported: Mapping[str, object]) -> list[str]:
    """One line per expected setting the server reports otherwise, or not at all:
    "context_length: the server reports 1024, the config says 2048 (model.context_length)"."""
    lines = []
    for name, want in expected.items():
        setting = want if isinstance(want, Setting) else Setting(want)
        where = f" ({setting.key})" if setting.key else ""
        if name not in reported:
            lines.append(f"{name}: the server does not report it, the config says {setting.value!r}{where}")
        elif not same(reported[name], setting.value):
            lines.append(f"{name}: the server reports {reported[name]!r}, the config says {setting.value!r}{where}")
    return lines


def server_urls(config, engine) -> list[str]:
    """The URLs of the servers themselves (a router reports none of their settings): inference.urls,
    or the ports the engine's servers take (`InferenceEngine.ports`)."""
    inf = config.inference
    if inf.urls:
        return [u.rstrip("/") for u in inf.urls]
    return [f"http://{inf.host}:{port}" for use in engine.ports(inf) if use.role == SERVER
            for port in range(use.first, use.last + 1)]


def settings_check(config, urls: list[str] | None = None, engine=None) -> Check:
    """GET each server's `routes.server_info` (`urls`: the config's servers, `server_urls`) and compare
    what it reports with what the engine (the config's) expects of a server started from `config`:
    fail naming each difference, skip (with the reason) for an engine that names no settings."""
    engine = engine_for(config) if engine is None else engine
    urls = server_urls(config, engine) if urls is None else urls
    title = getattr(engine, "title", type(engine).__name__)
    expect, read = getattr(engine, "expected_settings", None), getattr(engine, "reported_settings", None)
    if expect is None or read is None:
        return Check.skipped(NAME, f"{title} does not say what its servers report (no expected_settings and "
                                   "reported_settings, docs/engines.md)", hint="add both methods to the engine class")
    expected = expect(config)
    if not expected:
        return Check.skipped(NAME, f"{title} names no settings its servers must report")
    if not urls:
        return Check.skipped(NAME, "no servers to ask")
    key = client_key(config.inference.api_key)
    route = engine.routes.server_info
    problems: list[str] = []
    with http_client(timeout=config.inference.request_timeout_s, headers={"Authorization": f"Bearer {key}"} if key else {}) as http:
        for url in urls:
            try:
                reply = http.get(url + route, params=getattr(engine, "server_info_query", None))
            except httpx.HTTPError as exc:
                problems.append(f"{url}: GET {route} failed: {exc!r}")
                continue
            if reply.status_code != 200:
                problems.append(f"{url}: GET {route} answered {reply.status_code}: {reply.text[:200]}")
                continue
            problems += [f"{url}: {line}" for line in differences(expected, read(reply.json()))]
    compared = {name: (s.value if isinstance(s, Setting) else s) for name, s in expected.items()}
    want = f"each server's {route} reports the config's " + ", ".join(expected)
    if problems:
        return Check(NAME, CheckStatus.FAIL, {"mismatches": problems}, want, "; ".join(problems), HINT)
    return Check(NAME, CheckStatus.PASS, {"servers": len(urls), "compared": compared}, want)
