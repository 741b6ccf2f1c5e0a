"""One module per runbook stage (s0_baseline .. s8_training). Each holds the acceptance logic of its
stage and exposes `run(ctx) -> StageReport`; the capability it checks lives in `agentrl_cli`."""
