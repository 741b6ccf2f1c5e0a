"""The run's metrics as TensorBoard event files (`observe.trackers: [tensorboard]`, or
`observe.tensorboard: true`), beside metrics.jsonl under `tensorboard/`: one scalar per numeric key of
each row at the row's step (tags are the tracker names of `trackers.py`: `train/loss`), and the
config and metadata as two text summaries (`agentrl/config`, `agentrl/meta`).
Belongs here: writing; reading back is TensorBoard's."""

from __future__ import annotations

import json
from pathlib import Path


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path, config: dict | None = None, meta: dict | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (a dependency)

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        for tag, data in (("agentrl/config", config), ("agentrl/meta", meta)):
            if data:
                self.writer.add_text(tag, "```json\n" + json.dumps(data, indent=2, default=str) + "\n```", global_step=0)
        self.writer.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
