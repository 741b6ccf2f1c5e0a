"""The run's metrics as TensorBoard event files (`observe.tensorboard`), under `<run dir>/tensorboard/`:
one scalar per numeric key of each row, at the row's step (tags are the row keys, `train/loss`).
Belongs here: writing; reading back is TensorBoard's."""

from __future__ import annotations

from pathlib import Path


class TensorBoardExporter:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def update(self, row: dict) -> None:
        step = int(row.get("step") or 0)
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.writer.add_scalar(key, float(value), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
