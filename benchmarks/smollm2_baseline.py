"""Greedy success of a model before any training, per task family, through agentrl's own evaluation
path: the run's rollout side (`agentrl_cli.run.training_run.training(..., trainer=False)`: the embedded inference
server, the harnesses, the reward path) and `TrainingRun.evaluate`, the greedy evaluation stage 8
records its curve with. Used to pick the SmolLM2 recipe's task families (templates/smollm2/): a
family worth training on has a greedy success above 0 and below 0.5.

Two ways to name the families:
- `--config FILE`: every family of every harness the config names (held-out ones too), its eval
  tasks picked as stage 8 picks them (`--tasks` of them, spread over the family; stage 8 takes 12),
  with the config's own inference and rollout settings: the "before" of `stage run 8 --phase short`.
- FAMILY arguments (default: CANDIDATES and `code_sandbox_like:arith`): `reasoning_gym:DATASET`
  (eval-split tasks generated with its config in CANDIDATES, or `reasoning_gym:DATASET:{json config}`)
  and `HARNESS:FAMILY` for a built-in harness's committed eval tasks, with --max-new-tokens,
  --max-turns and --prompt.

Each family is evaluated on its own (its wall time is its own); one inference server serves them
all. `--samples K` also plays each task K times at `inference.temperature` (what a GRPO group sees).
Progress goes to stderr.

    python benchmarks/smollm2_baseline.py [--json] [--model smollm2] [--cache-dir /tmp/smol-cache]
        [--config templates/smollm2/platform.yaml] [--tasks 40] [--max-new-tokens 64] [--max-turns 2]
        [--prompt direct] [--samples 0] [--show 2] [FAMILY ...]
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import figure, parser, report  # noqa: E402

# The easiest configs of small reasoning-gym datasets whose answer is a short string.
CANDIDATES = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"]},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 1},
    "letter_counting": {"min_words": 3, "max_words": 5},
    "spell_backward": {},
    "number_sorting": {"min_numbers": 3, "max_numbers": 3},
    "gcd": {},
}
DEFAULT_FAMILIES = [f"reasoning_gym:{d}" for d in CANDIDATES] + ["code_sandbox_like:arith"]
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[smollm2 baseline {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def spread(tasks: list, n: int) -> list:
    """Up to `n` of `tasks`, spread evenly over them, as stage 8 picks a family's evaluation tasks."""
    return tasks[::max(1, len(tasks) // n)][:n]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(args):
    """The config the families are played with: `--config` with the model and cache overridden, or
    the candidates' settings."""
    from agentrl_cli.config import load_config

    common = [f"model.cache_dir={args.cache_dir}", f"inference.port={_port()}", f"data.root={args.work}/data",
              f"observe.runs_dir={args.work}/runs"]
    if args.model:
        common.append(f"model.path={args.model}")
    if args.config:
        return load_config(args.config, common, env={}).config
    harnesses = sorted({spec.partition(":")[0] for spec in args.families})
    return load_config(None, common + [
        f"inference.max_new_tokens={args.max_new_tokens}", f"rollout.max_steps_per_trajectory={args.max_turns}",
        "inference.request_timeout_s=600", "training.seq_len_limit=1536",
        "harnesses=" + json.dumps([{"name": h, "options": {"prompt": args.prompt} if h == "reasoning_gym" else {}}
                                   for h in harnesses]),
    ], env={}).config


def families(args, cfg) -> list[tuple[str, str, list]]:
    """[(label, harness name, eval tasks)] to measure."""
    from harnesses.task_sources import task_set

    if args.config:
        out = []
        for h in cfg.harnesses:
            by_family: dict[str, list] = {}
            for t in task_set(h, cfg.data).select("eval"):
                by_family.setdefault(t.meta.get("family", ""), []).append(t)
            out += [(f"{h.name} {family}" + (" (held out)" if h.held_out else ""), h.name, spread(tasks, args.tasks))
                    for family, tasks in by_family.items()]
        return out
    out = []
    for spec in args.families:
        harness, _, rest = spec.partition(":")
        if harness == "reasoning_gym":
            from harnesses.adapters.reasoning_gym import build_tasks, parse_options

            dataset, _, raw = rest.partition(":")
            options = parse_options({"dataset": dataset, "size": args.tasks,
                                     "config": json.loads(raw) if raw else CANDIDATES.get(dataset, {})})
            out.append((spec, harness, [t for t in build_tasks(options) if t.split == "eval"][:args.tasks]))
        else:
            hc = next(h for h in cfg.harnesses if h.name == harness)
            out.append((spec, harness, spread([t for t in task_set(hc, cfg.data).select("eval")
                                               if t.meta.get("family") == rest], args.tasks)))
    return out


async def measure(args) -> dict[str, dict]:
    from agentrl_cli.model.resolve import resolve_model_path
    from agentrl_cli.runtime.rollout.sampler import Draw
    from agentrl_cli.run.training_run import training

    cfg = config(args)
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir, build=False)
    out: dict[str, dict] = {}
    async with training(cfg, Path(args.work) / "run", path, run_id="smollm2-baseline", trainer=False, progress=say) as run:
        limit = asyncio.Semaphore(cfg.rollout.eval_concurrency) if cfg.rollout.eval_concurrency > 0 else None
        for label, harness, tasks in families(args, cfg):
            start = time.perf_counter()
            r = (await run.evaluate({harness: tasks}))[harness]
            wall = time.perf_counter() - start
            out[label] = {"n": r["n"], "success": r["success"], "success_rate": r["success_rate"], "errors": r["errors"],
                          "wall_s": round(wall, 1)}
            say(f"{label}: {r['success']}/{r['n']} greedy successes in {wall:.0f}s")
            if args.samples:  # what a GRPO group sees: each task sampled `samples` times at the rollout temperature
                sampled = await run.controller.evaluate([t for t in tasks for _ in range(args.samples)],
                                                        temperature=cfg.inference.temperature, limit=limit)
                out[label].update(sampled_rate=round(sampled["success"] / max(1, sampled["n"]), 3), samples=args.samples)
                say(f"{label}: {sampled['success']}/{sampled['n']} successes sampled at temperature {cfg.inference.temperature:g}")
            for i, t in enumerate(tasks[:args.show]):  # what the model wrote, to read its failure mode
                result, reward, _ = await run.controller.play(Draw(t, f"show-{i}", 0, i), temperature=0.0, store=False)
                replies = " | ".join(a.text.strip().replace("\n", "\\n")[:160] for a in result.trajectory.actions)
                say(f"  {t.prompt[:80]!r} -> {t.answer!r}: {replies!r} (reward {reward.reward:.2f}, {reward.outcome})")
    return out


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("families", nargs="*", default=DEFAULT_FAMILIES)
    p.add_argument("--config", help="measure this config's harnesses, as stage 8 evaluates them")
    p.add_argument("--model", help="model.path (default: smollm2, or the config's)")
    p.add_argument("--cache-dir", default="/tmp/smol-cache", help="model.cache_dir")
    p.add_argument("--tasks", type=int, default=40, help="eval tasks per family")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--prompt", default="direct", help="reasoning-gym system prompt style (reasoning_gym.utils.SYSTEM_PROMPTS)")
    p.add_argument("--samples", type=int, default=0, help="also sample each task this many times at inference.temperature")
    p.add_argument("--show", type=int, default=0, help="print the replies to this many tasks of each family")
    args = p.parse_args()
    if not args.config and not args.model:
        args.model = "smollm2"
    args.work = tempfile.mkdtemp(prefix="agentrl-smollm2-baseline-")
    results = asyncio.run(measure(args))
    figures = {}
    for label, r in results.items():
        sampled = f", {r['sampled_rate']} sampled" if "sampled_rate" in r else ""
        figures[f"{label} greedy success"] = figure(round(r["success_rate"], 3), f"of {r['n']} tasks ({r['wall_s']} s{sampled})",
                                                    "> 0 and < 0.5", 0 < r["success_rate"] < 0.5)
    report(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
