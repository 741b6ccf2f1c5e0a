"""Verify's cross-harness check: success on the training harnesses beside each held-out harness,
before and after training. A held-out harness far below the training harnesses means the policy
learned one harness's interface conventions (prompt template, return format, tool descriptions)
rather than the task.
"""

from __future__ import annotations

import statistics

from agentrl_cli.report import Check

ADVICE = ("adjust the harness mix (harnesses[].weight), unify prompt and tool-description style across harnesses, "
          "add environment variety; `agentrl troubleshoot held-out-harness-drop`")


def checks(ctx) -> list[Check]:
    rec, cfg = ctx.record, ctx.config
    held = [h.name for h in cfg.harnesses if h.held_out]
    train = [h.name for h in cfg.harnesses if not h.held_out]
    if not held:
        return [Check.skipped("held-out harness", "no harness has held_out: true, so nothing measures transfer")]
    rates = rec.eval_rates()
    if not all(n in rates for n in train + held):
        missing = [n for n in train + held if n not in rates]
        return [Check.skipped("held-out harness", f"the run recorded no evaluation of {', '.join(missing)}")]

    def mean(names, i):
        return statistics.fmean(rates[n][i][1] for n in names)

    out = []
    train_before, train_after = mean(train, 0), mean(train, -1)
    for name in held:
        before, after = rates[name][0][1], rates[name][-1][1]
        drop = train_after - after
        measured = {"training_before": round(train_before, 3), "training_after": round(train_after, 3),
                    "held_out_before": round(before, 3), "held_out_after": round(after, 3), "drop": round(drop, 3),
                    "by_harness": {n: {"before": round(rates[n][0][1], 3), "after": round(rates[n][-1][1], 3)} for n in train}}
        out.append(Check.judge(f"held-out harness {name} vs training harnesses", drop <= cfg.verify.cross_harness_max_drop,
                               measured, f"drop <= {cfg.verify.cross_harness_max_drop:g}",
                               f"{name} scores {after:.2f} against {train_after:.2f} on the training harnesses: "
                               f"the policy learned interface conventions; {ADVICE}"))
    return out
