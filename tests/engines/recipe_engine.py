"""An engine written from docs/engines.md ("A minimal engine"): the embedded server under a name of
its own, ready on /health, announcing itself in the server process. It also counts, in the process
that drives it, the generate requests it builds, so a test can tell the run's client used it."""

import dataclasses
from collections import Counter

from agentrl_cli.engines.embedded import EmbeddedEngine

MARK = "recipe engine serving"
USED: Counter = Counter()  # member -> calls, in this process


class RecipeEngine(EmbeddedEngine):
    name = "recipe"                      # servers recipe-0, ...; logs/recipe-0.log
    title = "the recipe engine"
    routes = dataclasses.replace(EmbeddedEngine.routes, ready="/health")

    def server_launch(self, config, model_path, port, *, key_dir=None, beside_trainer=False):
        USED["server_launch"] += 1
        return super().server_launch(config, model_path, port, key_dir=key_dir, beside_trainer=beside_trainer)

    def generate_body(self, input_ids, sampling, rid=None, adapter=None):
        USED["generate_body"] += 1
        return super().generate_body(input_ids, sampling, rid, adapter)

    def serve(self, config, model_path, options, say):
        say(f"{MARK} {model_path}")   # runs in the server process
        super().serve(config, model_path, options, say)
