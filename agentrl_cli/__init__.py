"""agentrl: bring up an agentic-RL training platform stage by stage and prove every stage works.

The package holds the runtime and the command line, grouped into wings, each importing only the
wings below it (top to bottom): cli, acceptance, run, weightsync, learner, ops, runtime, engines,
model, envs, config, core. Stage acceptance logic lives in the top-level `stages` package;
environments live in `harnesses`. Paths from before the wings still import (`_moved.py`), with a
DeprecationWarning.
"""

__version__ = "0.1.0"

from agentrl_cli.core.logstreams import keep_library_logs_off_stdout as _keep_library_logs_off_stdout

_keep_library_logs_off_stdout()

from agentrl_cli import _moved as _moved  # noqa: E402

_moved.install()
