"""One training run, wired: the composition root (`training_run`), what a run is made of and what
changes (`parts`: RunParts, RunState), building and closing the parts (`build`), what passes from a
crashed attempt to the next (`attempts`), the step loop (`run/loop/`) and the supervision of its
components (`run/supervise/`).

`agentrl_cli.run` was once the module now at `agentrl_cli.run.training_run`; its names still
resolve here (`from agentrl_cli.run import TrainingRun`), with a DeprecationWarning."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    from agentrl_cli import _moved

    module = importlib.import_module("agentrl_cli.run.training_run")
    if not hasattr(module, name):
        raise AttributeError(f"module 'agentrl_cli.run' has no attribute {name!r}")
    _moved.deprecated(f"agentrl_cli.run.{name}", f"agentrl_cli.run.training_run.{name}")
    return getattr(module, name)
