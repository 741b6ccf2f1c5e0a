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


@pytest.mark.parametrize("path", ["fused", "native", "tensor"])
def test_the_lean_step_gives_the_module_forwards_logits_over_a_left_padded_cache(model_dir, path):
    engine = HFEngine(model_dir, max_batch_size=4, batch_window_ms=1)
    try:
        model = engine._model
        lean = LlamaDecode(model, native=path != "tensor", fused=path == "fused")
        assert isinstance(decode_for(model), LlamaDecode) and decode_for(model).native and decode_for(model).fused
        assert (decode_kernels.kernel() is not None) or path == "tensor"  # this machine has a C compiler: the kernel is built
        assert (decode_kernels.blas_sgemm() is not None) or path != "fused"  # and torch has MKL's sgemm_
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
                assert lean.path == path
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


@pytest.mark.parametrize("past", [0, 6])
def test_a_prefill_in_one_native_call_gives_the_module_forwards_logits_and_cache(model_dir, past):
    """`LlamaDecode.prefill`: left-padded prompts fed at once (on nothing cached, or on 6 cached
    columns), each token attending up to its own column: the last token's logits as the module
    forward's, and decode steps after it as the module's over its own cache."""
    engine = HFEngine(model_dir, max_batch_size=4, batch_window_ms=1)
    try:
        model = engine._model
        lean = LlamaDecode(model)
        rng = random.Random(4)
        lengths = (3, 9, 14)
        width = max(lengths)
        ids = torch.full((3, width), engine.pad_id)
        mask = torch.zeros((3, past + width), dtype=torch.long)
        mask[:, :past] = 1
        for i, n in enumerate(lengths):
            ids[i, width - n:] = torch.tensor([rng.randrange(3, 200) for _ in range(n)])
            mask[i, past + width - n:] = 1
        pos = (mask[:, past:].cumsum(-1) - 1).clamp(min=0) + past
        with torch.inference_mode():
            caches = [new_cache(model.config), new_cache(model.config)]
            if past:
                head = torch.tensor([[rng.randrange(3, 200) for _ in range(past)]] * 3)
                for cache in caches:
                    model(input_ids=head, attention_mask=torch.ones_like(head), cache=cache, use_cache=True)
            want = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=caches[0], use_cache=True).logits[:, -1]
            got = lean.prefill(ids, mask, pos, caches[1])
            assert got is not None and float((got - want).abs().max()) < 1e-4
            last = pos[:, -1]
            for step in range(3):
                tokens = torch.tensor([rng.randrange(3, 200) for _ in range(3)])
                mask = torch.cat([mask, mask.new_ones((3, 1))], dim=1)
                last = last + 1
                want = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None], cache=caches[0],
                             use_cache=True).logits[:, -1]
                assert float((lean.step(tokens, mask, last, caches[1]) - want).abs().max()) < 1e-4, step
        assert LlamaDecode(model, fused=False).prefill(ids, mask[:, :past + width], pos, new_cache(model.config)) is None
    finally:
        engine.close()


def test_the_fused_step_follows_parameters_changed_in_place_or_replaced(tmp_path):
    """The fused step keeps the layers' parameter pointers between steps: a weight copied into in place
    and a parameter replaced by a new tensor (or a non-contiguous one, which it refuses) are both
    what the next step computes with, as the module forward does."""
    engine = HFEngine(build_random(tmp_path / "m", seed=6, num_key_value_heads=2, initializer_range=0.2), max_batch_size=4)
    try:
        model = engine._model
        lean = LlamaDecode(model)
        ids = torch.tensor([[5, 9, 11, 40], [7, 8, 3, 2]])
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            caches = [new_cache(model.config), new_cache(model.config)]
            for cache in caches:
                model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            pos = torch.tensor([4, 4])
            mlp = model.model.layers[0].mlp
            changes = [lambda: mlp.down_proj.weight.mul_(-1.5),
                       lambda: setattr(mlp.up_proj, "weight", torch.nn.Parameter(torch.randn_like(mlp.up_proj.weight))),
                       lambda: setattr(mlp.gate_proj, "weight", torch.nn.Parameter(torch.randn(mlp.gate_proj.weight.shape[::-1]).t()))]
            for step, change in enumerate([lambda: None, *changes]):
                change()
                tokens = torch.tensor([3 + step, 20 + step])
                mask = torch.cat([mask, mask.new_ones((2, 1))], dim=1)
                want = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos[:, None] + step, cache=caches[0],
                             use_cache=True).logits[:, -1]
                got = lean.step(tokens, mask, pos + step, caches[1])
                assert lean.path == ("native" if step == 3 else "fused"), step  # a transposed weight: not fused
                assert float((got - want).abs().max()) < 1e-4, step
    finally:
        engine.close()


def test_rows_sharing_a_prefix_read_it_from_their_source_row():
    """`shared` (source row, lo, hi): a row's columns [lo, hi) are read from its source row. Over true
    copies the output is the same as each row reading its own; with a row's copy spoiled, that row's
    output still follows the source (so the kernel does read the source); bad rows are refused."""
    fn = decode_kernels.kernel()
    gen = torch.Generator().manual_seed(2)
    rows, heads, kv_heads, cols = 5, 6, 2, 21
    for dim in (64, 24):  # vector path, scalar path
        kbuf, vbuf = torch.randn(rows, kv_heads, cols + 4, dim, generator=gen), torch.randn(rows, kv_heads, cols + 4, dim, generator=gen)
        keys, values = kbuf[:, :, 2:2 + cols], vbuf[:, :, 2:2 + cols]
        for r in (1, 3):  # rows 1 and 3 hold copies of row 0's columns 4..11
            keys[r, :, 4:12], values[r, :, 4:12] = keys[0, :, 4:12], values[0, :, 4:12]
        q = torch.randn(rows, heads, dim, generator=gen)
        mask = torch.ones(rows, cols, dtype=torch.bool)
        mask[:, :2] = False  # left padding
        shared = torch.tensor([[0, 4, 12], [0, 4, 12], [2, 0, 0], [0, 4, 12], [4, 0, 0]], dtype=torch.int32)
        own = decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn)
        assert torch.equal(decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn, shared=shared), own), dim
        keys[3, :, 4:12], values[3, :, 4:12] = 0.0, 0.0  # row 3's copy spoiled: read from row 0 all the same
        spoiled = decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn, shared=shared)
        assert torch.equal(spoiled, own) and not torch.equal(decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn), own)
    for bad in ([[5, 0, 1]] + [[0, 0, 0]] * 4, [[0, 3, 2]] * 5, [[0, 0, cols + 1]] * 5):
        with pytest.raises(ValueError, match="shared"):
            decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn, shared=torch.tensor(bad, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        decode_kernels.attend(q, keys, values, mask, dim ** -0.5, fn, shared=shared.long())


def test_rows_on_one_prefix_decode_what_they_decode_reading_their_own_copies(model_dir, monkeypatch):
    """Prompts on a shared prefix (prefilled once, copied into each row) decode the same tokens and
    log-probs when the step reads the prefix from one row (`BatchRun._shared_rows`) as when every row
    reads its own copy, through rows leaving at different steps, late rows joining (on the prefix
    too) and the padding trimmed; and as the module forward does."""
    from agentrl_cli.engines.inference import batch

    rng = random.Random(3)
    head = [rng.randrange(3, 200) for _ in range(20)]  # over MIN_MATCH (16): prefilled once
    prompts = [head + [rng.randrange(3, 200) for _ in range(1 + 3 * i)] for i in range(5)]
    late = [head + [rng.randrange(3, 200) for _ in range(2 + i)] for i in range(3)]
    sampling = [{"max_new_tokens": 5 + 4 * i, "ignore_eos": True, "temperature": 0.0 if i % 2 else 0.9,
                 "sampling_seed": 20 + i} for i in range(5)]
    used = []
    real = batch.BatchRun._shared_rows

    def spy(self):
        out = real(self)
        used.append(out is not None and bool((out[:, 0] != torch.arange(len(out))).any()))
        return out

    results = {}
    for name, kw in (("shared", {}), ("own", {}), ("module", {"lean_decode": False})):
        # 6 rows at most: the late rows join as others leave
        monkeypatch.setattr(batch.BatchRun, "_shared_rows", spy if name == "shared" else lambda self: None)
        engine = HFEngine(model_dir, max_batch_size=6, batch_window_ms=1, **kw)
        try:
            results[name] = _generate(engine, prompts, sampling, late)
        finally:
            engine.close()
        if name == "shared":
            assert any(used)  # rows did read the prefix from another row
    for s, o, m in zip(results["shared"], results["own"], results["module"]):
        assert s["output_ids"] == o["output_ids"] == m["output_ids"]
        assert s["output_logprobs"] == o["output_logprobs"]  # the same values read: the same floats
        assert max(abs(a - b) for a, b in zip(s["output_logprobs"], m["output_logprobs"])) < 1e-4


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
    assert set(ms) == {"step", "step_tensor_ops", "step_per_op", "step_shared_prefix", "linears", "attention", "attention_matmul",
                       "sampling", "rest"}
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
