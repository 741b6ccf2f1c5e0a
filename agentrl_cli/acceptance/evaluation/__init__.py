"""`agentrl eval`: greedy and sampled evaluation of a model or a run's checkpoint, with pass@k, per
harness and task family, resumable after an interruption.

An evaluation plays every task of the chosen harnesses and split once greedily and `samples` times
at `inference.temperature` through the training run's own rollout side (`run.training(...,
trainer=False)`), stores every trajectory (phase `eval`, the evaluation id as run id) and records
each finished episode in `<observe.runs_dir>/<eval_id>/results.jsonl`; `--resume` plays only what
is missing or was lost to an infrastructure error.

Modules: `plan.py` (tasks, episodes, seeds, what a resume plays), `evaldir.py` (the directory, its
manifest and results), `source.py` (a model or a run's checkpoint), `runner.py` (playing and
recording), `passk.py` (pass@k and the totals), `session.py` (one invocation, new or resumed).
Evaluation during training is `run/loop/evaluation.py`'s, not this package's.
"""
