"""`agentrl serve sandbox`: run a platform service in the foreground."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from agentrl_cli.commands.common import ConfigOpt, SetOpt, err, load

app = typer.Typer(help="Run platform services (sandbox pool; inference and reward arrive with their issues).",
                  no_args_is_help=True)


@app.command("sandbox")
def sandbox(
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default; the API has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8700,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Serve the sandbox pool over HTTP (create, exec, files, reset, close, health, metrics) for
    harnesses on other machines; point them at it with sandbox.service_url.

    Examples:

    * `agentrl serve sandbox --port 8700`

    * `agentrl serve sandbox --set sandbox.pool_size=32 --set sandbox.max_concurrency=256`
    """
    import uvicorn

    from agentrl_cli.sandbox import SandboxPool, SandboxSettings
    from agentrl_cli.sandbox.bwrap import check_bwrap
    from agentrl_cli.sandbox.service import create_app

    loaded = load(config, sets)
    c = loaded.config.sandbox
    if c.backend == "bwrap":
        check_bwrap(c.bwrap)  # fail closed before binding
    try:
        exposed = not ipaddress.ip_address(host).is_loopback
    except ValueError:
        exposed = True
    if exposed:
        err().print(f"[yellow]warning: binding {host}: the sandbox API has no authentication; "
                    "keep it on a private network reachable only by the trainer's rollout workers[/]")
    pool = SandboxPool(SandboxSettings.from_config(c), size=c.pool_size, max_concurrency=c.max_concurrency,
                       lease_timeout_s=c.lease_timeout_s)
    err().print(f"sandbox service on http://{host}:{port} (backend {c.backend}, pool {c.pool_size}, max {c.max_concurrency})")
    try:
        uvicorn.run(create_app(pool), host=host, port=port, log_level=loaded.config.observe.log_level)
    finally:
        pool.close()
