"""Weight sync from the trainer to the inference servers: the transport seam (`base.py`), one
module per transport (`disk.py`, `distributed.py`), the weight-update process group both sides
join (`group.py`), the publisher that owns when and to whom (`publisher.py`), per-server queries
(`servers.py`) and the registry `training.weight_sync` is read through (`registry.py`).

Imports nothing here, so the embedded server can use `group.py` without loading the rest."""
