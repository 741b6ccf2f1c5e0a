"""The learner only: the GRPO loss (`grpo.py`), the trainer backend seam and DeepSpeed behind it
(`backend.py`, `deepspeed_backend.py`), checkpoints (`checkpoint.py`) and the weight-sync transports
to the inference servers (`weight_sync.py`). Not here: the run that joins learner, rollout and
servers (`agentrl_cli/run.py`), nor anything that observes it (`agentrl_cli/observe/`)."""
