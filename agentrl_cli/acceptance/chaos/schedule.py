"""What faults a chaos run injects, when, and the bound within which each must be seen and recovered.

The plan is a function of the seed alone: the step boundary each fault is due at (after that many
trainer steps). The rank fault comes first, in the first quarter of the run but not before the first
checkpoint (so the restart resumes from one); the others follow in a seeded order at seeded
boundaries up to the middle of the run, and may overlap, each being read from its own component.
Nothing is injected while the run restarts after the rank fault (a restart replaces the run's
servers, supervisor and clients, and reads the store), so the rank fault goes first: what follows it
is injected into the resumed run. The second half of the run is there for the last recoveries: the
reward and store outages are seen, and end, only through the run's own traffic. The bounds follow
from the run's config, so a report states what the platform promises under that config, not a
figure picked to pass:

- server (SIGKILL an inference server): the supervisor sees it within DOWN_AFTER + 1 of its polls
  (`observe.health_interval_s` plus a probe's timeout each; a dead process at the next one), restarts
  the server after `supervisor.backoff_s`, waits up to `inference.startup_timeout_s` for it, and
  brings it to the run's weights (one weight load, `inference.request_timeout_s`);
- rank (SIGKILL a trainer rank): the next call to the trainer fails (at the latest after the wait for
  a step's samples and `training.rank_timeout_s`); the run restarts from its latest checkpoint:
  new ranks (`training.start_timeout_s`), new servers (`inference.startup_timeout_s`), the load;
- reward (the service unreachable for OUTAGE_S): a call during the outage fails at once; the first
  call after it succeeds within the client's largest backoff and one call (`reward.timeout_s` + 5);
- store (S3 unreachable for OUTAGE_S): a publish during the outage spools its file; the next
  publish after it uploads the spool (`data.write_timeout_s` bounds one);
- sandbox (SIGKILL the sandbox service): as server, with the service's own start-up deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentrl_cli.run.supervise.supervisor import DOWN_AFTER

FAULTS = ("server", "rank", "reward", "sandbox", "store")
OUTAGE_S = 5.0  # how long the reward service and the store stay unreachable
SANDBOX_STARTUP_S = 60.0  # the sandbox service's start-up deadline when the supervisor restarts it
REWARD_BACKOFF_S = 0.1  # runtime/reward/client.py: the first retry waits this, doubling
DESCRIPTIONS = {
    "server": "SIGKILL an inference server",
    "rank": "SIGKILL a trainer rank",
    "reward": f"the reward service unreachable for {OUTAGE_S:g} s (its address refuses connections)",
    "sandbox": "SIGKILL the sandbox service",
    "store": f"the trajectory store (S3) unreachable for {OUTAGE_S:g} s (its address refuses connections)",
}


@dataclass
class PlannedFault:
    kind: str
    after_step: int  # due at the boundary after this many trainer steps
    target: int = 0  # which server or rank (by index)


def parse_faults(text: str) -> list[str]:
    """`server,rank` -> ["server", "rank"]; "all" -> every fault; ValueError naming an unknown one."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if names == ["all"]:
        return list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)} (or all)")
    if len(set(names)) != len(names):
        raise ValueError(f"a fault is named twice in {text!r}; name each once")
    return names


def plan(kinds: list[str], seed: int, steps: int, *, servers: int, ranks: int, checkpoint_every: int) -> list[PlannedFault]:
    """The faults, each due at a seeded boundary (see the module's docstring), in the order they are due;
    never two at one boundary when there is room."""
    rng = random.Random(seed)
    last = max(1, steps // 2)
    out, after = [], 0
    if "rank" in kinds:
        first = min(checkpoint_every, steps - 1)
        after = rng.randint(first, max(first, steps // 4))
        out.append(PlannedFault("rank", after, rng.randrange(ranks)))
    others = [k for k in rng.sample(list(kinds), len(kinds)) if k != "rank"]
    free = list(range(after + 1, max(last, after + 1) + 1))
    steps_for = (rng.sample(free, len(others)) if len(others) <= len(free)
                 else [rng.choice(free) for _ in others])
    for kind, step in zip(others, steps_for):
        out.append(PlannedFault(kind, step, rng.randrange(servers) if kind == "server" else 0))
    return sorted(out, key=lambda f: f.after_step)


def bounds(kind: str, cfg) -> tuple[float, float]:
    """(seconds from injection to detection, seconds from injection to recovery) the run promises."""
    interval = cfg.observe.health_interval_s
    poll = (DOWN_AFTER + 1) * (interval + max(0.2, min(2.0, interval)))  # polls and their probes' timeouts
    restart = cfg.supervisor.backoff_s
    if kind == "server":
        return poll, poll + restart + cfg.inference.startup_timeout_s + cfg.inference.request_timeout_s
    if kind == "sandbox":
        return poll, poll + restart + SANDBOX_STARTUP_S
    if kind == "rank":
        detect = cfg.training.step_wait_timeout_s + cfg.training.rank_timeout_s  # a step's wait, then the call
        return detect, (detect + cfg.training.start_timeout_s + cfg.inference.startup_timeout_s
                        + cfg.training.rank_timeout_s)
    if kind == "reward":
        r = cfg.reward
        return OUTAGE_S, OUTAGE_S + REWARD_BACKOFF_S * 2 ** max(0, r.max_retries - 1) + r.timeout_s + 5.0
    if kind == "store":
        return OUTAGE_S, OUTAGE_S + cfg.data.write_timeout_s
    raise ValueError(f"unknown fault {kind!r}")
