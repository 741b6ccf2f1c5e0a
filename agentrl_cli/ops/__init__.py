"""Operating a deployment: the resource plan, the network plan, the control plane (Slurm, Kubernetes,
local executors), images and their lock, and the infrastructure benchmarks."""
