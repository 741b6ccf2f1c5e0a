"""Stage 1's measuring code without ranks: sizes, the nccl-tests bus factor, how a hang is judged,
and the storage probe on this machine's disk (real files, small sizes)."""

from __future__ import annotations


import pytest

from agentrl_cli.ops.bench import allreduce as ar
from agentrl_cli.ops.bench import storage


def test_sizes_parse_with_binary_suffixes_and_bad_ones_are_named():
    assert [ar.parse_size(s) for s in ("4096", "64K", "4M", "1g", "2MiB")] == [4096, 65536, 4 << 20, 1 << 30, 2 << 20]
    with pytest.raises(ValueError, match="'lots'"):
        ar.parse_size("lots")
    with pytest.raises(ValueError, match="below one float32"):
        ar.parse_size("2")
    assert ar.sizes_up_to(4 << 20) == (4096, 65536, 1 << 20, 4 << 20)
    assert ar.sizes_up_to(100_000) == (4096, 65536, 100_000)


def test_bus_factor_is_the_nccl_tests_convention():
    assert ar.bus_factor(2) == 1.0
    assert ar.bus_factor(8) == pytest.approx(1.75)
    assert ar.bus_factor(1) == 0.0


def test_a_hang_is_one_failing_check_naming_the_missing_rank():
    result = ar.AllreduceResult(ok=False, world_size=4, backend="gloo", timed_out=True, elapsed_s=20.0,
                                missing_ranks=[3], stuck={0: "joined"}, error="never joined: rank 3")
    checks = ar.checks(result, 0.05)
    assert [c.status for c in checks] == ["fail"]
    assert checks[0].measured["missing_ranks"] == [3] and "rank 3" in checks[0].detail and checks[0].hint


def test_one_rank_cannot_judge_bus_bandwidth():
    row = {"bytes": 4096, "count": 1024, "iters": 5, "time_us": 10.0, "algbw_gbps": 0.4, "busbw_gbps": 0.0, "correct": True}
    checks = ar.checks(ar.AllreduceResult(ok=True, world_size=1, backend="gloo", rows=[row]), 0.05)
    assert [c.status for c in checks] == ["pass", "pass", "skip"]


def test_bandwidth_below_the_threshold_fails_with_a_hint():
    row = {"bytes": 4 << 20, "count": 1 << 20, "iters": 5, "time_us": 1e5, "algbw_gbps": 0.04, "busbw_gbps": 0.04, "correct": True}
    bw = ar.checks(ar.AllreduceResult(ok=True, world_size=2, backend="gloo", rows=[row]), 0.05)[-1]
    assert bw.name == "all-reduce bus bandwidth" and bw.status == "fail" and "allreduce_min_gbps" in bw.hint


def test_stage_spec_follows_the_config():
    from agentrl_cli.config import load_config

    cfg = load_config(None, ["stages.allreduce_max_mb=1", "stages.allreduce_timeout_s=30"]).config
    spec = ar.spec_from_config(cfg)
    assert (spec.ranks, spec.backend, spec.sizes, spec.deadline_s) == (2, "gloo", (4096, 65536, 1 << 20), 30.0)
    gpu = ar.spec_from_config(load_config(None, ["cluster.gpus_per_node=8"]).config)
    assert (gpu.ranks, gpu.backend) == (8, "nccl")


def test_storage_probe_measures_and_cleans_up(tmp_path):
    res = storage.measure_storage(tmp_path, size_mb=4, files=50)
    assert res.error == "" and res.write_mbps > 0 and res.small_files_per_s > 0 and res.free_bytes > 0
    assert list(tmp_path.iterdir()) == []
    checks = storage.checks(res, 0.0, 0.0, need_bytes=1, need_detail="1 byte")
    assert [c.status for c in checks] == ["pass", "pass", "pass"]


def test_unwritable_checkpoint_dir_is_a_failing_check_with_a_hint(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = storage.measure_storage(blocker / "checkpoints", size_mb=1, files=10)
    checks = storage.checks(res, 50, 200)
    assert len(checks) == 1 and checks[0].status == "fail" and "Not a directory" in checks[0].detail
    assert "observe.runs_dir" in checks[0].hint


def test_too_little_free_space_fails(tmp_path):
    res = storage.measure_storage(tmp_path, size_mb=1, files=10)
    free = [c for c in storage.checks(res, 0, 0, need_bytes=res.free_bytes * 10, need_detail="a lot")
            if c.name == "free space for checkpoints"][0]
    assert free.status == "fail" and free.hint


def test_checkpoint_bytes_formula():
    assert storage.checkpoint_bytes(1000, "fp32") == 1000 * 12
    assert storage.checkpoint_bytes(1000, "bf16") == 1000 * 14


# ---- benchmarks/learner.py and its delayed harness: the pure parts ----------------------------------

def _learner_run(eval_final, mismatch_kl, *, lag=2.0, steps=4, evals=True):
    from benchmarks import learner

    rows = [{"step": 0, "version": 0, "eval/h/success_rate": 0.3, "eval/h/episodes": 8}] if evals else []
    rows += [{"step": i, "train/loss": 0.1, "train/mismatch_kl": mismatch_kl, "train/policy_lag": lag,
              "reward/mean": 0.5 + i / 10, "time/train_s": 2.0, "rollout/dropped_stale": i} for i in range(1, steps + 1)]
    if evals:
        rows.append({"step": steps, "version": steps, "eval/h/success_rate": eval_final, "eval/h/episodes": 8})
    return {**learner.summarize(rows, steps), "wall_s": 60.0}


def test_delayed_harness_delays_the_seeded_share_of_training_tasks_only():
    from benchmarks.delayed_harness import DelayedTerminalLike, is_delayed

    tasks = DelayedTerminalLike.task_set().tasks
    train = [t for t in tasks if t.split == "train"]
    delayed = [t.task_id for t in train if is_delayed(7, t.task_id, 0.25)]
    assert 0.15 < len(delayed) / len(train) < 0.35  # 360 tasks: a quarter, give or take the hash's draw
    assert delayed == [t.task_id for t in train if is_delayed(7, t.task_id, 0.25)]  # a function of (seed, task)
    assert delayed != [t.task_id for t in train if is_delayed(8, t.task_id, 0.25)]
    h = DelayedTerminalLike(delay_s=1.5, delayed_fraction=0.25, delay_seed=7)
    assert {h.delay_for(t) for t in train if t.task_id in delayed} == {1.5}
    assert {h.delay_for(t) for t in train if t.task_id not in delayed} == {0.0}
    assert {h.delay_for(t) for t in tasks if t.split == "eval"} == {0.0}
    with pytest.raises(ValueError, match="delayed_fraction"):
        DelayedTerminalLike(delayed_fraction=1.5)


def test_learner_run_config_takes_the_arm_seed_staleness_and_delayed_harness(tmp_path):
    from agentrl_cli.config import load_config
    from benchmarks import learner

    cfg = load_config(None, learner.run_sets("tis", 2, tmp_path, 12345, 2.0, 0.25), env={}).config
    assert (cfg.training.correction, cfg.rollout.mode, cfg.rollout.max_staleness) == ("tis", "async", 3)
    assert (cfg.rollout.seed, cfg.training.seed, cfg.inference.port) == (2, 2, 12345)
    assert cfg.harnesses[0].name == learner.HARNESS and cfg.harnesses[0].options["delay_seed"] == 2
    tasks = learner.eval_tasks(cfg, 3)[learner.HARNESS]
    assert len(tasks) == 12 and {t.split for t in tasks} == {"eval"}  # 3 of each of terminal_like's 4 families


def test_learner_speed_arms_differ_only_in_the_rollout_mode_and_judge_async_against_sync_by_seed(tmp_path):
    from agentrl_cli.config import load_config
    from benchmarks import learner

    sync, asyn = (load_config(None, learner.speed_sets(a, 3, tmp_path, 12345), env={}).config for a in ("sync", "async"))
    assert (sync.rollout.mode, sync.training.correction) == ("sync", "none")
    assert (asyn.rollout.mode, asyn.rollout.max_staleness, asyn.training.correction) == ("async", 1, "tis")
    assert sync.training.learning_rate == asyn.training.learning_rate and sync.rollout.seed == asyn.rollout.seed == 3
    assert [h.name for h in sync.harnesses] == [h.name for h in asyn.harnesses] == ["terminal_like"]
    runs = {"sync": [_learner_run(0.5, 0.0), _learner_run(0.6, 0.0)], "async": [_learner_run(0.45, 0.001), _learner_run(0.6, 0.001)]}
    figs = learner.speed_figures(runs, [1, 2], 4)
    assert figs["async_minus_sync_eval_success"]["value"] == pytest.approx(-0.025)
    assert figs["async_no_worse"]["value"] is True  # -0.025 is within one seed SD (0.035)
    runs["async"] = [_learner_run(0.2, 0.001), _learner_run(0.25, 0.001)]
    worse = learner.speed_figures(runs, [1, 2], 4)["async_no_worse"]
    assert worse["value"] is False and "worse beyond noise" in worse["unit"]


def test_learner_summary_reads_metrics_rows():
    run = _learner_run(0.6, 2e-4, steps=4)
    assert (run["steps"], run["finite_losses"], run["eval_start"], run["eval_final"]) == (4, True, 0.3, 0.6)
    assert run["mismatch_kl"] == pytest.approx(2e-4) and run["policy_lag"] == 2.0 and run["dropped_stale"] == 4
    assert run["reward_late"] == pytest.approx(0.85)  # steps 3 and 4
    assert run["is_ess"] is None  # `none` reports no importance weights


def test_learner_recommends_a_correction_only_when_not_worse_and_less_off_policy():
    from benchmarks import learner

    none = [_learner_run(0.5, 4e-4), _learner_run(0.6, 4e-4)]
    better = [_learner_run(0.55, 3e-4), _learner_run(0.6, 3e-4)]
    worse = [_learner_run(0.4, 3e-4), _learner_run(0.6, 3e-4)]
    more_kl = [_learner_run(0.7, 5e-4), _learner_run(0.7, 5e-4)]
    assert learner.recommend({"none": none, "tis": better})[0] == "tis"
    assert learner.recommend({"none": none, "tis": worse, "decoupled": more_kl})[0] == "none"
    assert learner.recommend({"tis": better})[0] == "none"
    figs = learner.figures({"none": none, "tis": better}, [1, 2], 4)
    assert figs["tis_minus_none_eval_success"]["value"] == pytest.approx(0.025)
    assert figs["tis_minus_none_mismatch_kl"]["value"] == pytest.approx(-0.1)  # in thousandths
    assert figs["runs_complete"]["met"] is True and figs["off_policy"]["met"] is True
    assert figs["tis_eval_success"]["target"] is None  # the comparison is reported, not judged


def test_learner_judges_incomplete_and_on_policy_runs():
    from benchmarks import learner

    figs = learner.figures({"none": [_learner_run(0.5, 1e-4, lag=0.5), _learner_run(0.5, 1e-4, evals=False)]}, [1, 2], 4)
    assert figs["runs_complete"]["met"] is False and figs["runs_complete"]["value"] == 1
    assert figs["off_policy"]["met"] is False and figs["off_policy"]["value"] == 0.5


# ---- benchmarks/peer_trl.py and benchmarks/gemm.py: the GEMM measurement, the model-FLOP count, settings

def _tiny_llama(tmp_path):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True)
    config.save_pretrained(tmp_path)
    return config


def test_model_flops_count_every_linear_and_peft_adapter_weights(tmp_path):
    """N from the config's meta model equals the real model's nn.Linear weights (tied head included);
    N_A equals the weights peft adds for the same rank and targets."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from benchmarks import gemm

    config = _tiny_llama(tmp_path)
    shapes = gemm.linear_shapes(tmp_path)
    real = AutoModelForCausalLM.from_config(config)
    n = sum(m.weight.numel() for m in real.modules() if isinstance(m, torch.nn.Linear))
    targets = ["q_proj", "v_proj", "down_proj"]
    peft_model = get_peft_model(real, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    n_a = sum(p.numel() for name, p in peft_model.named_parameters() if "lora_" in name)
    full, lora = gemm.model_flops(shapes), gemm.model_flops(shapes, 4, targets)
    assert full["matmul_weights"] == lora["matmul_weights"] == n and full["adapter_weights"] == 0
    assert lora["adapter_weights"] == n_a > 0
    assert (full["per_generated_token"], full["per_trained_token"]) == (2 * n, 6 * n)
    assert (lora["per_generated_token"], lora["per_trained_token"]) == (2 * (n + n_a), 4 * n + 6 * n_a)
    assert gemm.sample_flops(full, sequence_tokens=10, model_tokens=4) == 4 * 2 * n + 10 * 6 * n


def test_gemm_measurement_times_real_matmuls_and_restores_threads():
    import torch

    from benchmarks import gemm

    before = torch.get_num_threads()
    out = gemm.measure_gemm(size=64, seconds=0.05, threads=1)
    assert out["threads"] == 1 and torch.get_num_threads() == before
    assert out["calls"] >= 3 and 0 < out["gflops"] <= out["best_gflops"]


def test_peer_share_of_gemm_uses_the_higher_measurement_and_each_runs_tokens():
    from benchmarks import gemm, peer_trl

    flops = gemm.model_flops([("a", 10, 10)])  # N = 100: 200 per generated token, 600 per trained token
    runs = [{"summary": {"loop_samples_per_s": 2.0, "samples_per_s": 9.0, "sequence_tokens": 10.0, "model_tokens": 4.0,
                         "prompt_once_tokens": 5.0}},
            {"summary": {"loop_samples_per_s": 1.0, "samples_per_s": 9.0, "sequence_tokens": 20.0, "model_tokens": 4.0,
                         "prompt_once_tokens": 5.0}}]
    assert peer_trl.achieved_flops(runs, flops) == pytest.approx((2 * 6800 + 12800) / 2)
    m = {"size": 8, "threads": 2, "calls": 3, "gflops": 1.0, "best_gflops": 1.5, "when": "before trl"}
    denominator, fig = peer_trl.gemm_figures([m, {**m, "gflops": 2.0, "when": "after"}, {**m, "gflops": 1.5}])
    assert denominator == 2e9 and fig["value"] == 2.0 and "before trl 1.0" in fig["unit"] and "after 2.0" in fig["unit"]
    figs = peer_trl.flop_figures(runs, flops, 1e4, "single_agentrl")
    assert figs["single_agentrl_share_of_gemm"]["value"] == pytest.approx(100 * 13200 / 1e4)
    # prompts once: 2 x (800 + 3000) and 1 x (800 + 3000)
    assert figs["single_agentrl_share_of_gemm_prompt_once"]["value"] == pytest.approx(100 * (7600 + 3800) / 2 / 1e4)


def test_peer_same_work_allows_sampling_noise_in_lengths_but_not_a_different_workload():
    from benchmarks import peer_trl

    def run(lengths: list[int], prompt: int = 40) -> dict:  # (sequence, model's own, prompt once) per sample
        trained = [(prompt + n, n, n + prompt // 4) for n in lengths]
        return {"summary": {"samples": len(trained)}, "trained": trained}

    noisy = [20, 32, 12, 32, 25, 32, 8, 32]  # sampled reply lengths: means 24.1 against 26.9 below, ~11% apart
    same = peer_trl._same_work([run(noisy)], [run([32, 30, 12, 32, 32, 32, 15, 30])], "trl")
    assert same["met"] and same["value"]["model_tokens"]["diff"] > 0.05, same  # within noise: not a different workload
    longer = peer_trl._same_work([run([32] * 64)], [run([30] * 64)], "trl")  # every reply 2 tokens longer: no noise
    assert not longer["met"] and longer["value"]["model_tokens"]["allowed"] == peer_trl.TOKEN_TOLERANCE
    fewer = peer_trl._same_work([run(noisy[:6])], [run(noisy)], "trl")
    assert not fewer["met"] and fewer["value"]["samples"]["diff"] == 0.25  # samples must be equal


def test_peer_settings_take_flags_over_the_models_defaults_and_name_bad_input(tmp_path):
    from benchmarks import peer_trl

    def settings(*argv):
        return peer_trl.settings(peer_trl.build_parser().parse_args(list(argv)))

    small = settings("--model", "smollm2")
    assert (small["group_size"], small["prompts_per_step"], small["lora_rank"], small["scenarios"]) == (4, 2, 8, "single")
    assert settings("--model", "smollm2", "--lora-rank", "0", "--steps", "5")["lora_rank"] == 0
    tiny = settings()
    assert (tiny["group_size"], tiny["max_new_tokens"], tiny["lora_rank"], tiny["steps"]) == (8, 32, 0, 10)
    shape = peer_trl.shape_of(small)
    assert shape.samples_per_step == 8 and shape.lora["rank"] == 8 and "q_proj" in shape.lora["target_modules"]
    assert peer_trl.shape_of(tiny).lora is None
    with pytest.raises(peer_trl.BenchUsage, match="--group-size 0"):
        settings("--group-size", "0")
    with pytest.raises(peer_trl.BenchUsage, match="no config.json"):
        peer_trl.resolve_model(str(tmp_path))


def test_trl_gets_the_same_lora_adapter_as_agentrl():
    from benchmarks import peer_trl, peer_workers

    lora = peer_trl.shape_of(peer_trl.settings(peer_trl.build_parser().parse_args(["--model", "smollm2"]))).lora
    cfg = peer_workers.trl_lora(lora)
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (lora["rank"], lora["alpha"], lora["dropout"])
    assert set(cfg.target_modules) == set(lora["target_modules"]) and peer_workers.trl_lora(None) is None


def test_peer_samples_per_s_counts_the_whole_loop_and_the_steps_after_the_first():
    from benchmarks.peer_workers import summarize

    # 3 steps of 2 samples; the loop starts at 0, the first step ends at 10 (samples generated ahead), then 2 s a step
    out = summarize({"loop_start": 0.0, "step_ends": [10.0, 12.0, 14.0], "trained": [(100, 30, 100), (110, 32, 40)] * 3})
    assert out["loop_samples_per_s"] == pytest.approx(6 / 14) and out["loop_s"] == 14.0
    assert out["samples_per_s"] == pytest.approx(4 / 4)
    assert (out["samples"], out["sequence_tokens"], out["model_tokens"], out["prompt_once_tokens"]) == (6, 105, 31, 70)


def test_prompt_once_counts_each_distinct_prompt_of_a_step_once():
    from benchmarks.peer_workers import prompt_once

    prompts = [[1, 2, 3], [1, 2, 3], [4, 5], [1, 2, 3], [4, 5]]
    assert prompt_once(prompts, [10, 12, 7, 3, 9]) == [10, 9, 7, 0, 7]


def test_the_gemm_bound_decode_rate_times_every_multiply_of_the_model_at_the_batch():
    from benchmarks import gemm

    shapes = [("q", 32, 32), ("up", 32, 96), ("down", 96, 32), ("lm_head", 32, 200)]
    one, wide = gemm.decode_bound(shapes, 1, seconds=0.05, threads=1), gemm.decode_bound(shapes, 16, seconds=0.05, threads=1)
    for bound, batch in ((one, 1), (wide, 16)):
        assert bound["batch"] == batch and bound["steps"] >= 3 and bound["threads"] == 1
        assert bound["tokens_per_s"] == pytest.approx(batch / bound["step_s"])
        assert bound["gflops"] == pytest.approx(2 * (32 * 32 + 32 * 96 + 96 * 32 + 32 * 200) * batch / bound["step_s"] / 1e9)
        # both weight layouts timed; the bound is the faster one's
        assert set(bound["layout_step_s"]) == {"out_in", "in_out"}
        assert bound["step_s"] == min(bound["layout_step_s"].values()) == bound["layout_step_s"][bound["layout"]]


def test_the_batch_bound_adds_the_prompts_prefill_to_the_decode_steps_that_follow_it():
    from benchmarks import gemm

    shapes = [("model.layers.0.q", 32, 32), ("model.layers.0.up", 32, 96), ("lm_head", 32, 200)]
    assert gemm.output_head(shapes) == "lm_head"
    assert gemm.output_head([("a", 8, 8), ("out", 8, 300)]) == "out"  # no lm_head: the widest output
    pre = gemm.prefill_bound(shapes, 40, 4, seconds=0.05, threads=1)
    assert pre["prompt_tokens"] == 40 and pre["prompts"] == 4 and pre["steps"] >= 3
    assert pre["prefill_s"] == min(pre["layout_step_s"].values())
    # the body at one row a prompt token, the output head only at each prompt's last position
    assert pre["gflops"] == pytest.approx(2 * ((32 * 32 + 32 * 96) * 40 + 32 * 200 * 4) / pre["prefill_s"] / 1e9)
    decode = {"step_s": 0.01}
    bound = gemm.batch_bound(decode, {"prompts": 4, "prefill_s": 0.02}, tokens=4 * 8)
    # each request's first token from its prefill; the other 7 a request from 7 decode steps of all 4 rows
    assert bound["seconds"] == pytest.approx(0.02 + 7 * 0.01)
    assert bound["tokens_per_s"] == pytest.approx(32 / 0.09) and bound["prefill_share"] == pytest.approx(0.02 / 0.09)
    # below the decode steps' bound alone (32 tokens at 4 a step of 10 ms) whenever the prefill costs more than a step
    assert bound["tokens_per_s"] < 4 / decode["step_s"]


def test_trl_phases_come_from_its_timers_and_add_up_to_the_step():
    from agentrl_cli.acceptance.phases import Rates
    from benchmarks import peer_trl

    timed = {"step_s": 10.0, "generate_s": 3.0, "reward_s": 0.5, "prepare_s": 4.0, "forward_s": 2.0,
             "train_step_s": 8.5, "optimizer_s": 1.0, "prompt_tokens": 4, "completion_tokens": 6, "samples": 2}
    rates = Rates(1000.0, {"per_generated_token": 100, "per_trained_token": 300}, lambda rows: 3.0 * rows)
    step = peer_trl.trl_step_phases(timed, rates)
    path = step["path"]
    assert {k: p["s"] for k, p in path.items()} == {"generation": 3.0, "scoring": 0.5, "generation_rest": 0.5, "forward": 2.0,
                                                    "backward": 2.5, "optimizer": 1.0, "other": 0.5}
    assert sum(p["s"] for p in path.values()) == step["step_s"]
    assert path["generation"]["bound_s"] == pytest.approx(0.4 + 0.6)  # 4 prompt tokens x 100 FLOP; 6 tokens at the flat rate
    assert path["generation"]["bound_at_rows_s"] == pytest.approx(0.4 + 1.0)  # 6 tokens at 6 tokens/s (2 rows)
    assert path["forward"]["bound_s"] == 1.0 and path["backward"]["bound_s"] == 2.0  # 10 tokens x 100, x 200 FLOP
    assert "bound_s" not in path["optimizer"]
    mean = peer_trl.trl_phases([{"trl_steps": [timed, {**timed, "step_s": 12.0, "other": 0}]}], rates)
    assert mean["step_s"] == 11.0 and mean["path"]["other"]["s"] == 1.5
