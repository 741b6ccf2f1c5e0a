"""The run's supervisor and what it watches: health checks of the components a run depends on,
restarts of those it started, and servers joining and leaving a running run (`agentrl run servers`)."""

from agentrl_cli.run.supervise.component import Component, GatewayComponent, ProcessComponent, RemoteComponent
from agentrl_cli.run.supervise.supervisor import ComponentFailed, Supervisor

__all__ = ["Component", "ComponentFailed", "GatewayComponent", "ProcessComponent", "RemoteComponent", "Supervisor"]
