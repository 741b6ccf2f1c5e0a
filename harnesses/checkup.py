"""`agentrl harness check`: one harness against the contract without a model. It loads the class
(required members, contract version), shows which optional members agentrl's defaults stand in for
(`harnesses.defaults`), resolves its reward source and its tasks, and plays one episode: the
harness's scripted solution where it ships one, else two plain actions (`contract.some_actions`).

Belongs here: those checks as `Check`s. Not here: stage 5's sandbox and training-path checks.
"""

from __future__ import annotations

from agentrl_cli.core.errors import AgentrlError
from agentrl_cli.core.report import Check
from harnesses.base import CONTRACT_VERSION, OPTIONAL_DEFAULTS, REQUIRED_MEMBERS, missing_members


def check_harness(target: str, platform_config) -> list[Check]:
    """The checks of harness `target` (a registered name or `module:Class`), configured from
    `platform_config`'s `harnesses[]` entry of that name when there is one."""
    from agentrl_cli.config.models import HarnessConfig
    from agentrl_cli.core.plugins import import_target
    from harnesses.registry import registered, resolve

    hc = next((h for h in platform_config.harnesses if h.name == target), None) or HarnessConfig(name=target)
    try:
        path = registered().get(target)
        cls = import_target(f"harness {target!r}", path or target) if path or ":" in target else resolve(target)
    except AgentrlError as exc:
        return [Check.judge("loads", False, target, "importable by name or module:Class", exc.hint, exc.message)]
    missing = missing_members(cls)
    checks = [Check.judge("contract", not missing, {"contract": CONTRACT_VERSION, "class": f"{cls.__module__}:{cls.__qualname__}",
                                                    "missing": missing},
                          f"defines the required members: {', '.join(REQUIRED_MEMBERS)}",
                          f"define {', '.join(missing)} on the class (harnesses/base.py)",
                          f"missing {', '.join(missing)}" if missing else "")]
    if missing:
        return checks
    from harnesses.defaults import defaults_applied

    applied = {m: OPTIONAL_DEFAULTS[m] for m, defaulted in defaults_applied(cls).items() if defaulted}
    checks.append(Check.info("defaults applied", applied or "none: the harness defines every optional member",
                             "optional members agentrl's default stands in for (harnesses/base.py)"))
    checks.append(_contained("reward source", lambda: _reward(hc)))
    tasks_check, task = _tasks(hc, platform_config)
    checks.append(tasks_check)
    if task is not None:
        checks.append(_contained("one episode", lambda: _episode(hc.name, platform_config, task)))
    if getattr(cls, "roles", None):
        checks.append(_contained("roles", lambda: _roles(cls, hc, task, platform_config)))
    return checks


def _roles(cls, hc, task, platform_config) -> Check:
    """A multi-agent harness: its roles' seats from the config, and every role's scripted play scored."""
    from harnesses.multi_agent import ROLES_EXPECTED, ROLES_HINT, roles_check, seats
    from harnesses.registry import create

    seated = seats(cls, hc.roles, hc.name)
    if task is None or not hasattr(cls, "scripted_move"):
        return Check.info("roles", {"seats": seated}, "no scripted_move (or no task) to play the roles with")
    h = create(hc.name, platform_config)
    try:
        ok, measured, detail = roles_check(h, [task])
    finally:
        h.close()
    return Check.judge("roles", ok, {"seats": seated, **measured}, ROLES_EXPECTED, ROLES_HINT, detail)


def _contained(name: str, fn) -> Check:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a harness bug is this check's failure, never a crash
        return Check.crashed(name, exc)


def _reward(hc) -> Check:
    from harnesses.registry import reward_source

    return Check("reward source", "pass", reward_source(hc), "verifiers, harness (compute_reward) or mix", "", "")


def _tasks(hc, platform_config):
    from harnesses.task_sources import task_set

    try:
        ts = task_set(hc, platform_config.data)
    except Exception as exc:  # noqa: BLE001 - no tasks is this check's failure
        return Check.crashed("tasks", exc), None
    train, eval_ = ts.select("train"), ts.select("eval")
    check = Check.judge("tasks", bool(ts.tasks), {"version": ts.version, "train": len(train), "eval": len(eval_)},
                        "at least one task", "set harnesses[].tasks, or give the class a task_set() classmethod")
    return check, (train or list(ts.tasks) or [None])[0]


def _episode(name: str, platform_config, task) -> Check:
    from harnesses.contract import play, scripted_policy, some_actions
    from harnesses.defaults import WithDefaults
    from harnesses.registry import create

    h = WithDefaults(lambda: create(name, platform_config))
    step = "reset"
    try:
        policy = scripted_policy(h.inner)
        kind = "scripted" if policy is not None else "plain actions"
        step = "reset/step"
        traj, last = play(h, task, policy=policy or some_actions)
        step = "evidence"
        evidence = h.evidence(traj)
        step = "compute_reward"
        reward = h.harness_reward(traj) if h.has_reward() else None
    except Exception as exc:  # noqa: BLE001 - what the harness raised is this check's finding
        return Check.judge("one episode", False, {"task": task.task_id, "failed_in": step}, "played without an exception",
                           f"fix the harness's {step}()", f"{step} raised {type(exc).__name__}: {exc}")
    finally:
        h.close()
    measured = {"task": task.task_id, "policy": kind, "turns": len(traj.actions), "done": last.done,
                "statuses": [o.status for o in traj.observations], "final_answer": evidence.final_answer,
                "reward": None if reward is None else reward.score, **({"flags": reward.flags} if reward and reward.flags else {})}
    if kind == "scripted" and reward is not None:
        return Check.judge("one episode", reward.score == 1.0, measured, "the scripted solution earns reward 1.0",
                           "the harness's scripted_action or compute_reward is wrong for this task", reward.detail)
    return Check("one episode", "pass", measured, "played without an exception (no scripted solution to judge the reward by)",
                 reward.detail if reward else "", "")
