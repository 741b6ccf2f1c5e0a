"""A rehearsal of a deployment on one machine: simulated nodes (network namespaces on a private
bridge, `nodes.py`), their firewall rules from the plan (`firewall.py`), Slurm across them
(`slurm.py`: slurmctld on a node of its own, a slurmd per compute node), trainer nodes the `deepspeed`
launcher reaches with pdsh over ssh (`trainers.py`), the facts and commands of
the host they are built with (`host.py`), the record each run keeps of what it made (`record.py`)
and the removal of what a killed run left (`leftovers.py`, also run by `agentrl sandbox reclaim`).

Belongs here: making, using, fencing and removing simulated nodes, the cluster software a rehearsal
runs on them (Slurm's daemons, the trainer nodes' sshd) and the platform's services it places there
(`topology.py`, `services.py`). Does not: the deployment's plan (`ops/plan.py`, `ops/netplan.py` say
what the nodes run, open and share), the rehearsal's workload and checks (`acceptance/rehearsal/`).
"""
