"""This machine's matrix-multiply throughput, on the command line: the measurement and the model-FLOP
rules live in `agentrl_cli/acceptance/gemm_rate.py` (stage 0's breakdown uses them too) and are
re-exported here for the benchmarks.

    python benchmarks/gemm.py [--size 2048] [--seconds 2] [--threads 0]   (prints one JSON line)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.acceptance.gemm_rate import (  # noqa: E402
    batch_bound, decode_bound, linear_shapes, measure_gemm, model_flops, output_head, prefill_bound, sample_flops)

__all__ = ["batch_bound", "decode_bound", "linear_shapes", "measure_gemm", "model_flops", "output_head", "prefill_bound",
           "sample_flops"]


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    print(json.dumps(measure_gemm(args.size, args.seconds, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
