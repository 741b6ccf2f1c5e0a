"""Where episodes run: sandboxes (bubblewrap, cgroups, seccomp, the pool) and tools (the caller and
its call log). The harnesses themselves stay in the top-level `harnesses/` plug-in folder."""
