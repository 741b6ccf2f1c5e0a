"""Training-side helpers: checkpoints and the state a resumed run needs."""
