"""The learner only: the GRPO loss (`grpo.py`), the trainer backend seam (`backend.py`), its
registry (`backends.py`) and DeepSpeed behind it (`deepspeed_backend.py`, several ranks through
`ranks_backend.py` / `rank_worker.py`), checkpoints (`checkpoint.py`). Not here: how weights reach
the servers (`agentrl_cli/weightsync/`), the run that joins learner, rollout and servers
(`agentrl_cli/run/training_run.py`, `agentrl_cli/run/loop/`), nor anything that observes it (`agentrl_cli/runtime/observe/`)."""
