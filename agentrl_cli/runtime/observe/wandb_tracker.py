"""The run's metrics in a Weights & Biases run (`observe.trackers: [wandb]`), offline by default: the run
is written under `<run dir>/wandb/offline-run-*/` and never touches the network; `wandb sync <run
dir>/wandb` uploads it later, `wandb leet inspect --json <that dir>` prints its records. A
WANDB_MODE variable (online, disabled) overrides offline, and WANDB_DIR the directory.

One W&B run per metrics log (a trainer restart opens another), named `<run id>/<log dir>` and
grouped by run id; its config is the resolved config (secrets masked) plus the run's metadata under
`run_meta`. W&B keeps one history row per step, in order: a row whose step is below the last one is
refused (an error the fan-out counts), never silently dropped.
Belongs here: W&B's calls; what goes in and when is `trackers.py`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentrl_cli.core.errors import ConfigError
from agentrl_cli.runtime.observe.trackers import missing_package


class WandbTracker:
    name = "wandb"

    def __init__(self, *, project: str, run_name: str, group: str, directory: Path, config: dict, meta: dict) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise missing_package("wandb", "wandb", exc) from exc
        mode = os.environ.get("WANDB_MODE") or "offline"
        directory = Path(os.environ.get("WANDB_DIR") or directory)
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(mode=mode, console="off", silent=True, save_code=False, reinit="create_new",
                                  x_disable_stats=True)  # the rows carry system/… already
        try:
            self.run = wandb.init(project=project, name=run_name, group=group, dir=str(directory),
                                  config={**config, "run_meta": meta}, settings=settings)
        except Exception as exc:  # noqa: BLE001 - any failure to start is the config's to fix, named with the cause
            raise ConfigError(f"observe.trackers: wandb could not start a run in {directory} (mode {mode}): "
                              f"{type(exc).__name__}: {exc}",
                              "check that the directory is writable (WANDB_MODE=offline needs no network), "
                              "or remove wandb from observe.trackers") from exc
        self.last_step = -1

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step < self.last_step:
            raise ValueError(f"W&B keeps history in step order: step {step} after step {self.last_step} is not kept")
        self.last_step = step
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
