"""The embedded engine's lean decode step (decode_step.py) computes what the model's own forward
computes: its logits against the module forward's over the same cache, and the engine's tokens and
log-probs with it against the engine's without it, over left padding, rows leaving and rows joining,
with attention as one native call per layer (decode_kernels) and as two matrix multiplies, for Llama (tied and untied head, grouped-query heads) and Qwen2 (q/k/v biases)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl_cli.engines.inference import decode_kernels
from agentrl_cli.engines.inference.decode_step import LlamaDecode, decode_for
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.kv_cache import new_cache
from agentrl_cli.model.tiny import build_random, init_model, save_model_dir

pytestmark = pytest.mark.integration


def _qwen2_dir(path):
    _, tokenizer = init_model(0)
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=(len(tokenizer) + 7) // 8 * 8, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero: make them count
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.3)
    return save_model_dir(model, tokenizer, path, {"kind": "random", "arch": "qwen2"})


MODELS = {
    "llama-tied": lambda p: build_random(p, seed=4, initializer_range=0.2),
    "llama-gqa-untied": lambda p: build_random(p, seed=5, num_key_value_heads=2, tie_word_embeddings=False,
                                               initializer_range=0.2),
    "qwen2-bias": _qwen2_dir,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_dir(request, tmp_path_factory):
    return MODELS[request.param](tmp_path_factory.mktemp("decode") / request.param)


@pytest.mark.parametrize("native", [True, False], ids=["native-attention", "matmul-attention"])
def test_the_lean_step_gives_the_module_forwards_logits_over_a_left_padded_cache(model_dir, native):
    engine = HFEngine(model_dir, max_batch_size=4, batch_window_ms=1)
    try:
        model = engine._model
        lean = LlamaDecode(model, native=native)
        assert isinstance(decode_for(model), LlamaDecode) and decode_for(model).native
        assert (decode_kernels.kernel() is not None) or not native  # this machine has a C compiler: the kernel is built
        rng = random.Random(0)
        prompts = [[rng.randrange(3, 200) for _ in range(n)] for n in (5, 11, 17)]
        width = max(map(len, prompts))
        ids = torch.full((3, width), engine.pad_id)
        mask = torch.zeros((3, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            caches = [new_cache(model.config), new_cache(model.config)]
            for cache in caches:
                model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
            last = pos[:, -1]
            for step in range(4):
                tokens = torch.tensor([rng.randrange(3, 200) for _ in range(3)])
                mask = torch.cat([mask, mask.new_ones((3, 1))], dim=1)
                last = last + 1
                want = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None],
                             cache=caches[0], use_cache=True).logits[:, -1]
                got = lean.step(tokens, mask, last, caches[1])
                assert got.shape == want.shape
                assert float((got - want).abs().max()) < 1e-4, step
                assert float(want.abs().max()) > 0.1  # not trivially zero
    finally:
        engine.close()


def _generate(engine: HFEngine, prompts, sampling, late=()):
    futures = [engine.submit(p, sampling[i], True, f"r{i}") for i, p in enumerate(prompts)]
    futures += [engine.submit(p, sampling[0], True, f"late{i}") for i, p in enumerate(late)]
    return [f.result(timeout=120) for f in futures]


def test_the_engine_decodes_the_same_tokens_and_log_probs_with_and_without_it(model_dir):
    lean = HFEngine(model_dir, max_batch_size=8, batch_window_ms=1)
    module = HFEngine(model_dir, max_batch_size=8, batch_window_ms=1, lean_decode=False)
    try:
        rng = random.Random(1)
        prompts = [[rng.randrange(3, 200) for _ in range(4 + 9 * i)] for i in range(5)]
        # rows leave at different steps (max_new_tokens), greedy and seeded sampling side by side
        sampling = [{"max_new_tokens": 6 + 5 * i, "ignore_eos": True, "temperature": 0.0 if i % 2 else 0.9,
                     "sampling_seed": 10 + i} for i in range(5)]
        late = [[rng.randrange(3, 200) for _ in range(7)] for _ in range(2)]
        got, want = _generate(lean, prompts, sampling, late), _generate(module, prompts, sampling, late)
        for g, w in zip(got, want):
            assert g["output_ids"] == w["output_ids"]
            assert max(abs(a - b) for a, b in zip(g["output_logprobs"], w["output_logprobs"])) < 1e-4
        assert lean.stats.snapshot()["decode_steps_total"] > 0
    finally:
        lean.close()
        module.close()


def test_the_native_attention_matches_the_matrix_multiplies_over_strided_views_and_masked_rows(monkeypatch, tmp_path):
    """Row by row against softmax(q k^T) v, over views into wider buffers (as the cache's), a row
    with padding in the middle and one with nothing to attend (all zero); without a C compiler the
    kernel is not built and the decode step keeps the matrix multiplies."""
    fn = decode_kernels.kernel()
    assert fn is not None
    gen = torch.Generator().manual_seed(0)
    rows, heads, kv_heads = 5, 9, 3
    for dim in (64, 24):  # vector path (a multiple of 16 floats), scalar path
        kbuf, vbuf = torch.randn(rows + 2, kv_heads, 40, dim, generator=gen), torch.randn(rows + 2, kv_heads, 40, dim, generator=gen)
        keys, values = kbuf[:rows, :, 3:30], vbuf[:rows, :, 3:30]
        q = torch.randn(rows, heads, dim, generator=gen)
        mask = torch.rand(rows, 27, generator=gen) > 0.3
        mask[:, -1], mask[2] = True, False
        got = decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn)
        want = torch.zeros_like(q)
        for r in range(rows):
            for h in range(heads):
                if mask[r].any():
                    scores = (keys[r, h // 3] @ q[r, h] * dim ** -0.5).masked_fill(~mask[r], float("-inf"))
                    want[r, h] = torch.softmax(scores, -1) @ values[r, h // 3]
        assert float((got - want).abs().max()) < 1e-5 and float(want.abs().max()) > 0.1, dim
    assert not decode_kernels.usable(q.double(), keys.double(), values.double())
    with pytest.raises(ValueError, match="do not fit"):  # never read past a tensor's end
        decode_kernels.attend(q, keys, values, mask[:, :-1], dim ** -0.5, fn)

    monkeypatch.setenv("PATH", str(tmp_path))  # no cc
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(decode_kernels, "_loaded", {})
    assert decode_kernels.kernel() is None


def test_a_model_it_does_not_know_goes_through_the_module_forward():
    class Other(torch.nn.Module):
        config = object()

    assert decode_for(Other()) is None


def test_the_inference_benchmark_takes_a_decode_step_apart(tmp_path):
    from benchmarks.inference import step_breakdown

    engine = HFEngine(build_random(tmp_path / "m", seed=2, num_key_value_heads=2), max_batch_size=4)
    try:
        ms = step_breakdown(engine._model, batch=4, columns=20, reps=3)
    finally:
        engine.close()
    assert set(ms) == {"step", "step_tensor_ops", "linears", "attention", "attention_matmul", "sampling", "rest"}
    assert all(ms[k] > 0 for k in ("step", "linears", "attention", "attention_matmul", "sampling"))
    assert abs(ms["step"] - ms["linears"] - ms["attention"] - ms["rest"]) < 1e-9


def test_the_native_draw_picks_the_tensor_draws_tokens_and_log_probs():
    """BatchSampler's native draw (decode_kernels.sample_rows) against its tensor operations, row by
    row from the same seeded streams, over 20 steps of 16 rows: the same tokens, log-probs to float
    rounding, also with presence penalties and with tokens banned until min_new_tokens (-inf logits)."""
    from agentrl_cli.engines.inference.sampling import BatchSampler, GenParams

    assert decode_kernels.kernel() is not None
    gen = torch.Generator().manual_seed(1)
    vocab = 5000
    for extra in ({}, {"presence_penalty": 0.5, "min_new_tokens": 3, "stop_ids": frozenset({7, 9})}):
        params = [GenParams(max_new_tokens=20, temperature=0.3 + 0.1 * i, seed=40 + i, **extra) for i in range(16)]
        native, tensor = BatchSampler(params, vocab), BatchSampler(params, vocab)
        tensor._native = lambda scaled: None
        for step in range(20):
            logits = torch.randn(16, vocab, generator=gen) * 4
            got, want = native.sample(logits, [step] * 16), tensor.sample(logits, [step] * 16)
            assert got[0] == want[0], step
            assert max(abs(a - b) for a, b in zip(got[1], want[1])) < 1e-4
            if extra and step < 3:
                assert not {7, 9} & set(got[0])  # banned until min_new_tokens
