"""agentrl: bring up an agentic-RL training platform stage by stage and prove every stage works.

The package holds the runtime and the command line. Stage acceptance logic lives in the
top-level `stages` package; environments live in `harnesses`.
"""

__version__ = "0.1.0"

from agentrl_cli.logstreams import keep_library_logs_off_stdout as _keep_library_logs_off_stdout

_keep_library_logs_off_stdout()
