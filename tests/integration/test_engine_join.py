"""Requests that arrive while a batch is decoding join it between steps, and their tokens and
log-probs are the ones they would get alone."""

from __future__ import annotations

import functools
import time

import pytest

from agentrl_cli.engines.inference.decode_step import LlamaDecode
from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.model.tiny import build_random

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random(tmp_path_factory.mktemp("join") / "m", seed=9, tie_word_embeddings=False, initializer_range=0.2)


def _alone(engine: HFEngine, ids: list[int], n: int) -> dict:
    return engine.submit(ids, {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}, True, "alone").result(timeout=120)


def test_late_arrivals_join_the_running_batch_and_decode_as_if_alone(model_dir):
    engine = HFEngine(model_dir, batch_window_ms=1, max_batch_size=8)
    try:
        prompts = [[5, 6, 7, 8, 9], [40, 41], [100, 101, 102, 103, 104, 105, 106, 107, 108]]
        # the long one long enough that the tiny model (about 0.45 ms a token here) still decodes it when the others end
        reference = [_alone(engine, p, n) for p, n in zip(prompts, (1000, 6, 9))]
        long = engine.submit(prompts[0], {"max_new_tokens": 1000, "temperature": 0.0, "ignore_eos": True}, True, "long")
        deadline = time.monotonic() + 30
        while not engine._running and time.monotonic() < deadline:
            time.sleep(0.001)
        late = [engine.submit(p, {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}, True, f"late{i}")
                for i, (p, n) in enumerate(zip(prompts[1:], (6, 9)))]
        late_results = [f.result(timeout=120) for f in late]
        assert not long.done(), "the late requests had to wait for the long one: they did not join its batch"
        results = [long.result(timeout=120)] + late_results
        for got, want in zip(results, reference):
            assert got["output_ids"] == want["output_ids"]
            assert max(abs(a - b) for a, b in zip(got["output_logprobs"], want["output_logprobs"])) < 1e-4
    finally:
        engine.close()


@pytest.mark.parametrize("lean", [True, False], ids=["lean-decode", "module-decode"])
def test_a_batch_narrows_again_when_its_longest_row_leaves(model_dir, lean, monkeypatch):
    # regression: the KV cache and mask of a batch kept alive by joins only widened, so after a long
    # prompt joined and left, every later step still attended over its padding
    engine = HFEngine(model_dir, batch_window_ms=1, max_batch_size=8, lean_decode=lean)
    widths: list[int] = []
    forward, step = engine._model.forward, LlamaDecode.step

    @functools.wraps(forward)
    def recording(*args, **kwargs):
        widths.append(kwargs["attention_mask"].shape[1])
        return forward(*args, **kwargs)

    def recording_step(self, tokens, mask, positions, cache, **kw):
        widths.append(mask.shape[1])
        return step(self, tokens, mask, positions, cache, **kw)
    try:
        reference = _alone(engine, [5, 6, 7, 8, 9], 1000)  # still decoding when the wide one has ended
        engine._model.forward = recording
        monkeypatch.setattr(LlamaDecode, "step", recording_step)
        long = engine.submit([5, 6, 7, 8, 9], {"max_new_tokens": 1000, "temperature": 0.0, "ignore_eos": True}, True, "long")
        deadline = time.monotonic() + 30
        while not engine._running and time.monotonic() < deadline:
            time.sleep(0.001)
        wide = engine.submit([i % 200 + 1 for i in range(400)], {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}, True, "wide")
        wide.result(timeout=120)
        assert not long.done(), "the wide request did not join the long one's batch"
        got = long.result(timeout=120)
    finally:
        engine.close()
    assert max(widths) >= 400  # the wide row was in the batch
    assert widths[-1] <= 5 + 1000  # the last step attends over the long row's own tokens only
    assert got["output_ids"] == reference["output_ids"]
    assert max(abs(a - b) for a, b in zip(got["output_logprobs"], reference["output_logprobs"])) < 1e-4


def test_the_engine_decodes_on_the_device_it_is_given_and_cpu_is_the_default(model_dir):
    sampling = {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 3, "ignore_eos": True, "top_k": 5}
    results = []
    for kwargs in ({}, {"device": "cpu"}):
        engine = HFEngine(model_dir, batch_window_ms=1, **kwargs)
        try:
            assert engine.device.type == "cpu" and next(engine._model.parameters()).device.type == "cpu"
            results.append(engine.submit([5, 6, 7], sampling, True).result(timeout=120))
        finally:
            engine.close()
    assert results[0]["output_ids"] == results[1]["output_ids"]
    assert results[0]["output_logprobs"] == results[1]["output_logprobs"]


def test_a_cuda_engine_without_cuda_is_refused_with_the_fix(model_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cpu'"):
        HFEngine(model_dir, device="cuda")
