"""Operating a deployment: the resource plan, the network plan, the control plane (Slurm, Kubernetes,
local executors), images and their lock, the infrastructure benchmarks, and simulated nodes for a
rehearsal on one machine (rehearse/)."""
