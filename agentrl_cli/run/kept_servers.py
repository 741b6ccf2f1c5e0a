"""Inference servers handed from one run to the next run on the same run directory and host, so the
next run does not load the model again: stage 8 smoke's resumed run (`stages/s8_training.py`) and a
trainer restart (`training_run.supervised`) use the servers the run before them started.

Only a run that resumes from a checkpoint takes them: its resume brings every server to the
checkpoint's weights before the rollout starts (`loop/checkpoints.resume`). A run that starts from
the launch weights (no checkpoint yet) stops them and starts its own, as does a run that finds one of
them no longer answering. The run that ends hands its servers over instead of stopping them; the
owner (`close`) stops what is held at the end. Servers die with the thread that started them
(`launcher.start_process`), so the runs that share them run in one thread, one after the other.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

HEALTH_DEADLINE_S = 10.0  # a held server that does not answer within this is stopped, and the run starts its own


class KeptServers:
    """The servers one run hands over to the next (`hand_over`, `take`); `close()` stops what is held."""

    def __init__(self) -> None:
        self.servers: tuple = ()
        self.urls: list[str] = []

    def hand_over(self, servers: tuple) -> None:
        """Hold `servers` (what `launcher.launch` started: the workers, then any router) for the next run."""
        from agentrl_cli.engines.engine import ROUTER

        self.close()
        self.servers, self.urls = tuple(servers), [s.url for s in servers if s.name != ROUTER]

    def take(self, ready_path: str, health_path: str) -> tuple[tuple, list[str]] | None:
        """The held servers and their URLs when every one is running and answers (`ready_path`; a
        router `health_path`); else None, with whatever was held stopped."""
        from agentrl_cli.engines.engine import ROUTER
        from agentrl_cli.engines.inference.launcher import InferenceUnavailable, wait_healthy

        servers, urls = self.servers, self.urls
        self.servers, self.urls = (), []
        if not servers:
            return None
        try:
            if all(s.alive() for s in servers):
                wait_healthy([s for s in servers if s.name != ROUTER], HEALTH_DEADLINE_S, path=ready_path)
                wait_healthy([s for s in servers if s.name == ROUTER], HEALTH_DEADLINE_S, path=health_path)
                return servers, urls
        except InferenceUnavailable as exc:
            log.warning("the servers the last run kept do not answer (%s): starting new ones", exc)
        for s in servers:
            s.stop()
        return None

    def close(self) -> None:
        servers, self.servers, self.urls = self.servers, (), []
        for s in servers:
            s.stop()
