"""`agentrl chaos`: a short training run with faults injected at seeded step boundaries, and the
report of each fault (when it was seen, how it was recovered, within which bound) and of the
trajectories (generated, stored, trained; missing; duplicated) against an uninterrupted run.

- `schedule.py`: the fault kinds, the seeded plan, the bound each fault must be recovered within;
- `gate.py`: a TCP gate in front of a service, closed to make that service unreachable;
- `services.py`: the services the run talks to, started here as processes (reward, sandbox, S3);
- `injector.py`: injecting the faults into the run and reading from the run how each was seen and
  recovered;
- `losses.py`: the loss ledger (trajectories and trained draws against the reference run);
- `runner.py`: the reference run and the faulted run, one after the other, and the report.

Nothing here recovers from anything: recovery is the run's own (its supervisor, the trainer
restarts, the reward client's retries, the store's spool); this package only breaks things and
reads what the run did about it.
"""
