"""The services a chaos run trains against, started here as processes on 127.0.0.1, and the config
that points the run at them.

- the reward service (`agentrl serve reward`) and the sandbox service (`agentrl serve sandbox`),
  each with a fresh key, handed to the run as `ProcessComponent`s: the run's supervisor watches and
  restarts them (the same command on the same port) like the servers it starts itself;
- an S3-compatible endpoint (moto's server mode, when installed) as the trajectory store;
- gates (`gate.py`) in front of the reward service and the S3 endpoint: the run talks to the gates,
  the supervisor to the reward service itself, so closing a gate is an outage of the network path
  the run uses while the service stays healthy.

The services read a copy of the run's config without its secrets (`services.yaml`); their keys come
from key files named in their environment, never the command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from pathlib import Path

import yaml
from pydantic import SecretStr

from agentrl_cli.acceptance.chaos.gate import Gate
from agentrl_cli.acceptance.chaos.schedule import SANDBOX_STARTUP_S
from agentrl_cli.core.errors import UsageError
from agentrl_cli.run.supervise.component import REWARD, SANDBOX, ProcessComponent

BUCKET = "agentrl-chaos"
S3_STARTUP_S = 60.0
REWARD_STARTUP_S = 60.0
DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_available() -> bool:
    try:
        import moto.server  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def without_secrets(data):
    """A config dump with every secret left out (the services get theirs from key files)."""
    if isinstance(data, dict):
        return {k: without_secrets(v) for k, v in data.items() if not isinstance(v, SecretStr)}
    if isinstance(data, list):
        return [without_secrets(v) for v in data]
    return data


class ChaosServices:
    """Start with `start()` (on the thread that runs the training: the children die with it), stop
    with `stop()`. `overrides()` is what the run's config needs to use them."""

    def __init__(self, cfg, root: Path, *, s3: bool) -> None:
        self.cfg, self.root, self.with_s3 = cfg, Path(root), s3
        self.logs = self.root / "logs"
        self.reward: ProcessComponent | None = None
        self.sandbox: ProcessComponent | None = None
        self.s3 = None  # launcher.ServerProcess of the S3 endpoint
        self.reward_gate: Gate | None = None
        self.s3_gate: Gate | None = None
        self._keys: dict[str, str] = {}
        self._env_saved: dict[str, str | None] = {}

    def start(self, progress=lambda msg: None) -> "ChaosServices":
        from agentrl_cli.engines.inference.launcher import start_process, wait_healthy

        if self.with_s3 and not moto_available():
            raise UsageError("the store fault needs an S3-compatible endpoint, and moto's server mode is not installed",
                             "pip install 'moto[server]', or leave store out of --faults")
        self.root.mkdir(parents=True, exist_ok=True)
        config_path = self.root / "services.yaml"
        config_path.write_text(yaml.safe_dump(without_secrets(self.cfg.model_dump(mode="python")), sort_keys=False),
                               encoding="utf-8")
        agentrl = [sys.executable, "-m", "agentrl_cli"]
        if self.with_s3:
            progress("starting the S3 endpoint (moto)")
            port = free_port()
            self.s3 = start_process("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    f"http://127.0.0.1:{port}", self.logs, DUMMY_AWS)
            wait_healthy([self.s3], S3_STARTUP_S, "/moto-api/")
            self.s3_gate = Gate(port).start()
        for name in (REWARD, SANDBOX):
            key = secrets.token_urlsafe(24)
            path = self.root / f"{name}.key"
            path.touch(mode=0o600)
            path.write_text(key + "\n", encoding="utf-8")
            self._keys[name] = key
        progress("starting the reward and sandbox services")
        reward_port, sandbox_port = free_port(), free_port()
        self.reward = ProcessComponent(
            REWARD, [*agentrl, "serve", "reward", "--host", "127.0.0.1", "--port", str(reward_port), "--config",
                     str(config_path)], f"http://127.0.0.1:{reward_port}", self.logs,
            {"AGENTRL_REWARD__API_KEY_FILE": str(self.root / f"{REWARD}.key")}, kind=REWARD,
            startup_timeout_s=REWARD_STARTUP_S)
        self.sandbox = ProcessComponent(
            SANDBOX, [*agentrl, "serve", "sandbox", "--host", "127.0.0.1", "--port", str(sandbox_port), "--config",
                      str(config_path)], f"http://127.0.0.1:{sandbox_port}", self.logs,
            {"AGENTRL_SANDBOX__API_KEY_FILE": str(self.root / f"{SANDBOX}.key")}, kind=SANDBOX,
            startup_timeout_s=SANDBOX_STARTUP_S)
        for c in (self.reward, self.sandbox):
            c.start()
        for c in (self.reward, self.sandbox):
            c.start(wait_s=c.startup_timeout_s)
        self.reward_gate = Gate(reward_port).start()
        if self.with_s3:
            self._aws_env()
            self._make_bucket()
        return self

    def describe(self) -> dict:
        """Where each service listened (and the gate the run reached it through)."""
        return {"reward": self.reward.url, "reward_gate": self.reward_gate.url, "sandbox": self.sandbox.url,
                "s3": self.s3.url if self.s3 is not None else None,
                "s3_gate": self.s3_gate.url if self.s3_gate is not None else None}

    def components(self) -> list[ProcessComponent]:
        return [self.reward, self.sandbox]

    def overrides(self) -> dict:
        """Dotted config keys that point a run at these services."""
        out = {"reward.service_url": self.reward_gate.url, "reward.api_key": self._keys[REWARD],
               "sandbox.service_url": self.sandbox.url, "sandbox.api_key": self._keys[SANDBOX]}
        if self.with_s3:
            out.update({"data.store": "s3", "data.s3.endpoint_url": self.s3_gate.url, "data.s3.bucket": BUCKET,
                        "data.s3.prefix": "trajectories", "data.root": str(self.root / "store")})
        return out

    def _aws_env(self) -> None:
        """Credentials for the local endpoint, for this process while the services run (restored by
        `stop`): boto3 reads them from the environment, and a real account's must not be sent."""
        for key, value in DUMMY_AWS.items():
            self._env_saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            self._env_saved.setdefault(key, os.environ.get(key))
            os.environ.pop(key, None)

    def _make_bucket(self) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.s3.url, region_name=DUMMY_AWS["AWS_DEFAULT_REGION"]).create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        """Stop whatever `start` got to (it may have failed half-way)."""
        for gate in (self.reward_gate, self.s3_gate):
            if gate is not None:
                gate.stop()
        for c in (self.reward, self.sandbox):
            if c is not None:
                c.stop()
        if self.s3 is not None:
            self.s3.stop()
        for key, value in self._env_saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env_saved.clear()
        for name in self._keys:
            with contextlib.suppress(OSError):
                (self.root / f"{name}.key").unlink()
