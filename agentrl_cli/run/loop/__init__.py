"""The training run's step loop and the small parts it schedules: `steps.py` (the loop, its typed
step times, the run's summary), `samples.py` (buffered groups into GRPO samples), `checkpoints.py`
(when to write one, overlapped or not, and resuming from the newest), `acceptance/evaluation.py` (greedy
success per harness). `agentrl_cli/run/training_run.py` builds the parts and hands them to the loop."""
