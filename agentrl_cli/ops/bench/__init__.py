"""Measurements stage 1 makes and `agentrl bench` runs on their own: all-reduce bandwidth across
ranks, checkpoint-directory storage, the trajectory object store, and sandbox network isolation.
Each returns figures and `Check`s; none imports the command line."""
