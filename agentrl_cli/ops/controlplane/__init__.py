"""The control plane: a state store (SQLite or PostgreSQL) holding the experiment and job registry, a
leader lease with a fencing token on every write, and executors that hand jobs to a scheduler (local
subprocesses, Slurm, Kubernetes with Kueue). Queues, quotas, priorities and preemption are the
scheduler's; nothing here schedules beyond the local executor's slots and priority order."""
