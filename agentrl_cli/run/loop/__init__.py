"""The training run's step loop and the small parts it schedules: `steps.py` (the loop, its typed
step times, the run's summary), `samples.py` (buffered groups into GRPO samples), `checkpoints.py`
(when to write one, overlapped or not, and resuming from the newest), `evaluation.py` (greedy
success per harness). They take the run's parts and state (`run/parts.py`), which `run/build.py`
makes and `run/training_run.py` hands them, never the run object."""
