"""The running platform's services: rollout (the play loops), reward, the trajectory data store and
the emitting side of observation (metrics, trackers, traces, Prometheus)."""
