"""One timed training run of the TRL comparison (`peer_trl.py`), in its own process so neither
system inherits the other's threads, memory or process group: `agentrl_run` (a `TrainingRun` with
the embedded defaults) and `trl_run` (TRL's `GRPOTrainer` on the same model, prompts, group size,
batch, sampling, learning rate, loss clip, reward and LoRA adapter (peft, same rank, alpha, dropout and
target modules) when the `Shape` has one). Each returns a dict of plain numbers:
the step end times, per-sample token counts of what was trained (whole sequence, the model's own
tokens, and the sequence with each distinct prompt of a step counted once), and the per-step
breakdown of where the time went: agentrl's from its step rows and its servers' phase counters
(`phase_steps`: `agentrl_cli/acceptance/phases.py` turns them into phases), TRL's from timers
around its generation, reward, input preparation, loss (forward), train step and optimizer step
(`trl_steps`; TRL's own `step_time` covers the train step whole).

    python benchmarks/peer_workers.py SYSTEM SCENARIO STEPS MODEL WORKDIR SHAPE_JSON [KEY=VALUE ...]
    (SHAPE_JSON: the `Shape` fields; prints one PEER_RESULT JSON line)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMPERATURE, LEARNING_RATE, SEED = 1.0, 1e-5, 7
TOOL_LATENCY_S = 0.3
MAX_TURNS = 4
# scenario -> (harness "module:Class" or built-in name, turn limit, tool latency)
SCENARIOS = {
    "single": ("benchmarks.peer_env:PeerArith", 1, 0.0),
    "multi": ("benchmarks.peer_env:PeerArithTools", MAX_TURNS, TOOL_LATENCY_S),
    "sandboxed": ("terminal_like", 1, 0.0),
    "tools_no_env": ("benchmarks.peer_env:PeerArithTools", 1, 0.0),  # sandboxed's prompts and tools, no environment
}


@dataclass(frozen=True)
class Shape:
    """The work of every step, the same on both sides: groups of `group_size` samples of
    `prompts_per_step` prompts in one micro-batch, at most `max_new_tokens` per model turn, and
    LoRA (`lora`: rank, alpha, dropout, target_modules, as `training.lora` takes them) or full
    fine-tuning (None)."""

    group_size: int = 8
    prompts_per_step: int = 8
    max_new_tokens: int = 32
    lora: dict | None = None

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.prompts_per_step


def prompt_plan(tasks_file: Path, steps: int, shape: Shape) -> list[dict]:
    """The prompts in the order agentrl's sampler draws them (seeded): TRL trains on this list."""
    from harnesses.task_sources import _from_file
    from agentrl_cli.runtime.rollout.sampler import TaskSampler

    tasks = [t for t in _from_file("peer", str(tasks_file), None, None).tasks if t.split == "train"]
    sampler = TaskSampler({"peer": tasks}, group_size=shape.group_size, seed=SEED)
    return [{"task_id": g[0].task.task_id, "prompt": g[0].task.prompt, "answer": g[0].task.answer, "meta": g[0].task.meta}
            for g in (sampler.next_group() for _ in range(steps * shape.prompts_per_step))]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agentrl_config(scenario: str, workdir: Path, tasks_file: Path, shape: Shape, extra: list[str] | None = None):
    from agentrl_cli.config import load_config

    harness, turns, latency = SCENARIOS[scenario]
    entry = {"name": harness, "tasks": str(tasks_file), "options": {"latency_s": latency} if harness.startswith("benchmarks") else {}}
    sets = [f"inference.port={_free_port()}", f"rollout.group_size={shape.group_size}", f"rollout.seed={SEED}",
            f"training.micro_batch_size={shape.samples_per_step}", "training.gradient_accumulation_steps=1",
            f"inference.max_new_tokens={shape.max_new_tokens}", f"inference.temperature={TEMPERATURE}",
            "training.lora=" + json.dumps(shape.lora),
            f"training.learning_rate={LEARNING_RATE}", "training.kl_coef=0.0", "training.precision=fp32",
            f"rollout.max_steps_per_trajectory={turns}", f"data.root={workdir / 'store'}",
            "harnesses=" + json.dumps([entry]), *(extra or [])]
    return load_config(None, sets, env={}).config


def agentrl_run(scenario: str, steps: int, model: Path, workdir: Path, shape: Shape, extra: list[str] | None = None) -> dict:
    from agentrl_cli.run.training_run import training

    from benchmarks.peer_env import write_arith_tasks

    workdir.mkdir(parents=True, exist_ok=True)
    cfg = agentrl_config(scenario, workdir, write_arith_tasks(workdir / "arith.jsonl"), shape, extra)
    trained: list[tuple[int, int, int]] = []  # (sequence, model, prompt-once tokens) of every trained sample
    ends: list[float] = []
    started: list[float] = []

    from agentrl_cli.acceptance.verify.server_load import ServerLoad

    async def go():
        async with training(cfg, workdir / "run", model, run_id="peer", phase="train") as run:
            load = ServerLoad(engine=run.client.engine).start(run.client.urls)
            step = run.backend.train_step

            def counted(samples):
                prompts = [list(s.token_ids[:list(s.loss_mask).index(1)] if 1 in s.loss_mask else s.token_ids) for s in samples]
                once = prompt_once(prompts, [len(s.token_ids) for s in samples])
                trained.extend((len(s.token_ids), int(sum(s.loss_mask)), o) for s, o in zip(samples, once))
                return step(samples)
            run.backend.train_step = counted
            def on_step(row):
                ends.append(time.perf_counter())
                load.mark()
            started.append(time.perf_counter())  # the rollout starts generating in run()
            try:
                return await run.run(steps, on_step=on_step), load.steps
            finally:
                load.stop()
    summary, server_steps = asyncio.run(go())
    rows = summary.metrics
    phase_steps = [{"row": {k: v for k, v in r.items() if k.startswith("time/") or k in PHASE_ROW_KEYS},
                    "window_s": window, "server": server} for r, (window, server) in zip(rows, server_steps)]
    return {"loop_start": started[0], "step_ends": ends, "trained": trained, "breakdown": [_breakdown(r) for r in rows],
            "phase_steps": phase_steps, "max_batch_size": cfg.inference.max_batch_size,
            "counters": {k: v for k, v in summary.counters.items() if isinstance(v, (int, float))},
            "timers": summary.timers, "syncs": summary.syncs, "config": {"weight_sync_interval_steps": cfg.rollout.weight_sync_interval_steps,
                                                 "checkpoint_interval_steps": cfg.training.checkpoint_interval_steps,
                                                 "mode": cfg.rollout.mode, "max_staleness": cfg.rollout.max_staleness,
                                                 "concurrency": cfg.rollout.concurrency}}


PHASE_ROW_KEYS = ("train/forward_s", "train/backward_s", "train/optimizer_s", "train/sequence_tokens")  # keys.TRAIN_*
BREAKDOWN = ("wait_s", "train_s", "sync_s", "checkpoint_s", "other_s", "step_s", "generate_s", "reward_s", "store_s",
             "env_s", "generated_episodes", "trained_episodes")


def _breakdown(row: dict) -> dict:
    """One step's times: on the trainer's path (wait, train, sync, checkpoint, the rest) and, running
    beside it, the rollout's (generation, reward, store writes, environment) summed over episodes."""
    out = {k: row.get(f"time/{k}") for k in ("wait_s", "train_s", "sync_s", "checkpoint_s", "other_s", "step_s",
                                             "generate_s", "reward_s", "store_s", "env_s")}
    if out["wait_s"] is None:
        out["wait_s"] = row.get("time/sampling_wait_s")
    out["generated_episodes"] = row.get("rollout/episodes_step")
    out["trained_episodes"] = row.get("train/samples")
    return out


# ---- TRL --------------------------------------------------------------------------------------------

def trl_lora(lora: dict | None):
    """peft's LoraConfig for TRL with the rank, alpha, dropout and targets agentrl's `training.lora` gets."""
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                      target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM")


def trl_run(scenario: str, steps: int, model: Path, workdir: Path, shape: Shape, threads: int = 0) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from agentrl_cli.runtime.reward.models import ScoreRequest, StepIn, TaskIn
    from agentrl_cli.runtime.reward.scorer import Scorer
    from benchmarks.peer_env import PeerArith, trl_run_shell, write_arith_tasks
    from harnesses.parsing import parse_answer

    harness, turns, latency = SCENARIOS[scenario]
    if not harness.startswith("benchmarks"):
        raise SystemExit(f"scenario {scenario!r} is agentrl-only")
    workdir.mkdir(parents=True, exist_ok=True)
    if threads:  # a sensitivity run: TRL with the thread count agentrl's trainer gets
        torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    plan = prompt_plan(write_arith_tasks(workdir / "arith.jsonl"), steps, shape)
    system = PeerArith().system_prompt()
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": p["prompt"]}],
                               "answer": str(p["answer"]), "task_id": p["task_id"]} for p in plan])
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    tools = [trl_run_shell(latency)] if scenario == "multi" else None
    if tools:
        tokenizer.response_template = qwen3_template  # the same Hermes <tool_call> convention as Qwen's
    scorer = Scorer()

    def reward(prompts, completions, answer, task_id, **_):
        out = []
        for i, (messages, ans, tid) in enumerate(zip(completions, answer, task_id)):
            actions = [m for m in messages if m["role"] == "assistant"]
            steps_in = [StepIn(action=m.get("content") or "") for m in actions]
            final = next((a for a in (parse_answer(s.action) for s in reversed(steps_in)) if a is not None), None)
            req = ScoreRequest(task=TaskIn(task_id=tid, harness="peer_arith", prompt="", answer=ans,
                                           meta={"family": "arith", "verify": "answer"}),
                               trajectory_id=f"trl-{tid}-{i}", steps=steps_in or [StepIn(action="")], final_answer=final)
            out.append(scorer.score(req).reward)
        return out

    args = GRPOConfig(output_dir=str(workdir / "trl"), per_device_train_batch_size=shape.samples_per_step,
                      num_generations=shape.group_size,
                      gradient_accumulation_steps=1, max_steps=steps, learning_rate=LEARNING_RATE, beta=0.0,
                      temperature=TEMPERATURE, epsilon=0.2, max_grad_norm=1.0, seed=SEED, shuffle_dataset=False,
                      max_completion_length=shape.max_new_tokens if tools is None else MAX_TURNS * 160,
                      generation_kwargs={"max_new_tokens": shape.max_new_tokens},
                      max_tool_calling_iterations=MAX_TURNS - 1, gradient_checkpointing=False, use_cpu=True,
                      bf16=False, fp16=False, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
                      dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0,
                      weight_decay=0.0, model_init_kwargs={"dtype": torch.float32})
    ends: list[float] = []
    trained: list[tuple[int, int, int]] = []
    started: list[float] = []
    steps_timed: list[dict] = []  # per step: seconds of each timed call, tokens (`trl_steps`)
    now: dict = {}  # the step being timed

    def timed(key: str, call, *a, **k):
        t = time.perf_counter()
        try:
            return call(*a, **k)
        finally:
            now[key] = now.get(key, 0.0) + time.perf_counter() - t

    class Timer(TrainerCallback):
        def on_train_begin(self, *_a, **_k):
            started.append(time.perf_counter())

        def on_optimizer_step(self, *_a, **_k):  # from the train step's end: gradient clipping and the step
            now["optimizer_s"] = now.get("optimizer_s", 0.0) + time.perf_counter() - now.pop("train_end", time.perf_counter())

        def on_step_end(self, *_a, **_k):
            ends.append(time.perf_counter())
            now.pop("train_end", None)
            steps_timed.append({**now, "step_s": ends[-1] - (ends[-2] if len(ends) > 1 else started[0])})
            now.clear()

    class Counted(GRPOTrainer):
        def _generate(self, prompts):
            return timed("generate_s", super()._generate, prompts)

        def _calculate_rewards(self, *a, **k):
            return timed("reward_s", super()._calculate_rewards, *a, **k)

        def _prepare_inputs(self, *a, **k):
            return timed("prepare_s", super()._prepare_inputs, *a, **k)

        def training_step(self, *a, **k):
            out = timed("train_step_s", super().training_step, *a, **k)
            now["train_end"] = time.perf_counter()
            return out

        def compute_loss(self, model, inputs, *a, **k):
            now["prompt_tokens"] = now.get("prompt_tokens", 0) + int(inputs["prompt_mask"].sum())
            now["completion_tokens"] = now.get("completion_tokens", 0) + int(inputs["completion_mask"].sum())
            now["samples"] = now.get("samples", 0) + int(inputs["prompt_mask"].shape[0])
            return timed("forward_s", self._counted_loss, model, inputs, *a, **k)

        def _counted_loss(self, model, inputs, *a, **k):
            prompt = inputs["prompt_mask"].sum(1)
            completion = inputs["completion_mask"]
            own = completion * inputs["tool_mask"] if inputs.get("tool_mask") is not None else completion
            sequence = (prompt + completion.sum(1)).tolist()
            prompts = [ids[m.bool()].tolist() for ids, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
            trained.extend(zip(sequence, own.sum(1).tolist(), prompt_once(prompts, sequence)))
            return super().compute_loss(model, inputs, *a, **k)

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    trainer = Counted(model=policy, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer,
                      tools=tools, callbacks=[Timer()], peft_config=trl_lora(shape.lora))
    trainer.train()
    return {"loop_start": started[0], "step_ends": ends, "trained": [tuple(int(x) for x in t) for t in trained],
            "trl_steps": steps_timed, "log": [{k: v for k, v in r.items() if isinstance(v, (int, float))} for r in trainer.state.log_history]}


def prompt_once(prompts: list[list[int]], sequence: list[int]) -> list[int]:
    """Tokens of each sample of one step when every distinct prompt of the step is counted once:
    its whole sequence for the first sample with that prompt, its sequence less the prompt for the others."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for prompt, n in zip(prompts, sequence):
        key = tuple(prompt)
        out.append(n - len(prompt) if key in seen else n)
        seen.add(key)
    return out


def summarize(result: dict) -> dict:
    """samples/s two ways, for both systems alike (model loading and server start-up excluded from both):
    `loop_samples_per_s`, every trained sample over the whole loop, from its start (agentrl: `run()`,
    where its rollout starts generating; TRL: `on_train_begin`) to the last step's end; and
    `samples_per_s`, the samples of the steps after the first over their span. The second leaves out
    the first step's warm-up, but also every sample agentrl generated ahead during the first step
    (up to `rollout_lead`: a short run is generated whole before its first step ends), so it
    measures little but agentrl's trainer when steps are few."""
    ends = result["step_ends"]
    trained = result["trained"]
    span = ends[-1] - ends[0] if len(ends) > 1 else float("nan")
    loop = ends[-1] - result["loop_start"] if ends else float("nan")
    per_step = len(trained) / max(len(ends), 1)
    return {"samples_per_s": per_step * (len(ends) - 1) / span if span == span and span > 0 else float("nan"),
            "loop_samples_per_s": len(trained) / loop if loop == loop and loop > 0 else float("nan"),
            "loop_s": loop,
            "steps": len(ends), "samples": len(trained),
            "sequence_tokens": statistics.fmean(t[0] for t in trained) if trained else float("nan"),
            "model_tokens": statistics.fmean(t[1] for t in trained) if trained else float("nan"),
            "prompt_once_tokens": statistics.fmean(t[2] for t in trained) if trained else float("nan")}


def main() -> int:
    system, scenario, steps, model, workdir, shape_json = sys.argv[1:7]
    extra = sys.argv[7:]
    shape = Shape(**json.loads(shape_json))
    if system == "agentrl":
        out = agentrl_run(scenario, int(steps), Path(model), Path(workdir), shape, extra)
    else:
        threads = [int(x.split("=", 1)[1]) for x in extra if x.startswith("threads=")]
        out = trl_run(scenario, int(steps), Path(model), Path(workdir), shape, threads[0] if threads else 0)
    out["summary"] = summarize(out)
    print("PEER_RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
