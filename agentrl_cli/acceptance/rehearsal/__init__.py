"""`agentrl rehearse`: the acceptance of a deployment before it meets a cluster. The simulated nodes,
their rules and the services the rehearsal starts on them are `ops/rehearse/`'s; here: the order of a
rehearsal, its workload and checks (`rehearsal.py`), the node faults of `--chaos` (`faults.py`) and
the client calls made from inside a node (`probe.py`)."""
