"""Verify's cross-harness check: success on the training harnesses beside each held-out harness,
before and after training. The drop is how far the held-out harness fell behind during training:
the training harnesses' gain minus its own gain. A held-out harness left behind means the policy
learned one harness's interface conventions (prompt template, return format, tool descriptions)
rather than the task; a gap that was there before training (a harness the model never learned) is
not the training's doing and is not counted, and a held-out harness scored 0 before and after
(never solved) cannot show transfer either way: that check is skipped with the reason.
"""

from __future__ import annotations

from agentrl_cli.core.report import Check, CheckStatus
from agentrl_cli.acceptance.verify.judge import UNMEASURABLE, gap_widening

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

    out = []
    for name in held:
        measured = gap_widening([(rates[n][0][1], rates[n][-1][1]) for n in train], (rates[name][0][1], rates[name][-1][1]))
        measured["by_harness"] = {n: {"before": round(rates[n][0][1], 3), "after": round(rates[n][-1][1], 3)} for n in train}
        drop = measured.pop("measurable") and measured["drop"]
        if drop is False:
            reason = UNMEASURABLE.format(name=name)
            out.append(Check(f"held-out harness {name} vs training harnesses", CheckStatus.SKIP, measured, "", reason, reason))
            continue
        out.append(Check.judge(f"held-out harness {name} vs training harnesses", drop <= cfg.verify.cross_harness_max_drop,
                               measured, f"drop <= {cfg.verify.cross_harness_max_drop:g} (training gain minus held-out gain)",
                               f"{name} went {measured['held_out_before']:.2f} -> {measured['held_out_after']:.2f} while the "
                               f"training harnesses went {measured['training_before']:.2f} -> {measured['training_after']:.2f}: "
                               f"the policy learned interface conventions; {ADVICE}"))
    return out
