"""`agentrl verify`: the four-layer acceptance (connectivity, correctness, performance against the
stage-0 baseline, small-sample convergence) plus the cross-harness check, one module per layer.

`acceptance/run_record.py` reads what a run recorded, `judge.py` holds the shared judgements, `measure.py` measures
what is missing (the verification run, the baseline loop again), `core.py` joins them into a report.
"""

from agentrl_cli.acceptance.verify.core import LAYERS, Layer, VerifyReport, verify

__all__ = ["LAYERS", "Layer", "VerifyReport", "verify"]
