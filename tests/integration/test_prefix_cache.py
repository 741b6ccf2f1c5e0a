"""The embedded engine's prefix cache and in-place KV growth: a request that extends an earlier one
prefills only its new tokens, and every token and log-prob is the one it gets without the cache."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl_cli.engines.inference.engine import HFEngine
from agentrl_cli.engines.inference.prefix_cache import PrefixCache
from agentrl_cli.model.tiny import build_random

pytestmark = pytest.mark.integration
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random(tmp_path_factory.mktemp("prefix") / "m", seed=4, tie_word_embeddings=False, initializer_range=0.2)


@pytest.fixture(scope="module")
def engines(model_dir):
    cached = HFEngine(model_dir, batch_window_ms=1, max_batch_size=8, prefix_cache_tokens=100_000)
    plain = HFEngine(model_dir, batch_window_ms=1, max_batch_size=8, prefix_cache_tokens=0)
    yield cached, plain
    cached.close()
    plain.close()


def _kv(n: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), -fill))]


def _run(engine: HFEngine, prompts: list[list[int]], logprob: bool = False) -> list[dict]:
    futures = [engine.submit(p, GREEDY, logprob, f"r{i}") for i, p in enumerate(prompts)]
    return [f.result(timeout=120) for f in futures]


def test_lookup_returns_the_longest_common_prefix_and_never_the_last_token():
    cache = PrefixCache(max_tokens=1000, min_match=4)
    cache.insert(list(range(10)), _kv(10, 1.0))
    cache.insert(list(range(6)) + [99, 98], _kv(8, 2.0))
    hit = cache.lookup(list(range(8)) + [50])
    assert hit.length == 8 and hit.layers[0][0].shape == (2, 8, 4) and float(hit.layers[0][0][0, 0, 0]) == 1.0
    assert cache.lookup(list(range(6)) + [99, 98, 97]).length == 8  # matched whole: handed over, removed
    assert cache.lookup(list(range(6)) + [99, 98, 97]).length == 6  # now only the shared 6 of the first
    assert cache.lookup(list(range(10))).length == 9  # the last token is computed, never cached
    assert cache.lookup([7, 7, 7, 7, 7, 7]) is None
    assert cache.lookup([0, 1, 2, 50, 50, 50]) is None  # 3 shared tokens < min_match


def test_entries_beyond_the_token_budget_are_evicted_least_recently_used_first():
    cache = PrefixCache(max_tokens=25, min_match=4)
    for start in (100, 200, 300):
        cache.insert(list(range(start, start + 10)), _kv(10, 1.0))
    assert cache.tokens == 20 and len(cache) == 2  # the oldest (100..109) went when the third came
    assert cache.lookup(list(range(100, 111))) is None
    assert cache.lookup(list(range(200, 206)) + [0]).length == 6
    cache.clear()
    assert cache.tokens == 0 and cache.lookup(list(range(200, 211))) is None
    assert PrefixCache(0).lookup(list(range(50))) is None  # disabled


def test_an_agents_next_turn_reuses_its_cache_and_decodes_exactly_as_without_it(engines):
    cached, plain = engines
    rng = random.Random(0)
    prompts = [[rng.randrange(0, 256) for _ in range(40 + 23 * i)] for i in range(4)]
    for turn in range(3):
        got, want = _run(cached, prompts, True), _run(plain, prompts, True)
        for g, w, p in zip(got, want, prompts):
            assert g["output_ids"] == w["output_ids"]
            assert max(abs(a - b) for a, b in zip(g["output_logprobs"], w["output_logprobs"])) < 1e-4
            # turn 1: nothing cached; then all but the environment's reply was fed in the last turn
            assert g["cached_tokens"] == (0 if turn == 0 else len(p) - 9), (turn, g["cached_tokens"], len(p))
            assert w["cached_tokens"] == 0
        prompts = [p + g["output_ids"] + [rng.randrange(0, 256) for _ in range(8)] for p, g in zip(prompts, got)]
    # a batch mixing hits and new prompts: the hits prefill on top of their cache, the rest whole
    mixed = prompts[:2] + [[rng.randrange(0, 256) for _ in range(90)]]
    got, want = _run(cached, mixed), _run(plain, mixed)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    assert [g["cached_tokens"] > 0 for g in got] == [True, True, False]
    assert cached.snapshot()["cached_tokens_total"] >= sum(g["cached_tokens"] for g in got)


def test_whole_prompt_logprobs_bypass_the_cache(engines):
    cached, plain = engines
    prompt = list(range(30, 90))
    first = _run(cached, [prompt])[0]
    follow = prompt + first["output_ids"] + [3, 4, 5]
    got = cached.submit(follow, GREEDY, True, "lp", logprob_start_len=0).result(timeout=120)
    want = plain.submit(follow, GREEDY, True, "lp", logprob_start_len=0).result(timeout=120)
    assert got["cached_tokens"] == 0 and len(got["input_logprobs"]) == len(follow)
    assert max(abs(a - b) for a, b in zip(got["input_logprobs"][1:], want["input_logprobs"][1:])) < 1e-4


def test_a_weight_change_and_flush_cache_empty_the_cache(engines, model_dir):
    cached, _ = engines
    prompt = list(range(100, 160))
    first = _run(cached, [prompt])[0]
    assert cached.prefix_cache.tokens > 0
    assert cached.flush_cache() and cached.prefix_cache.tokens == 0
    assert _run(cached, [prompt + first["output_ids"] + [1]])[0]["cached_tokens"] == 0
    _run(cached, [prompt])
    assert cached.prefix_cache.tokens > 0
    ok, message = cached.update_weights_from_disk(model_dir, weight_version="2")
    assert ok, message
    assert cached.prefix_cache.tokens == 0  # the KV was computed by the weights just replaced
    assert _run(cached, [prompt + first["output_ids"] + [1]])[0]["cached_tokens"] == 0


def test_the_in_place_kv_cache_holds_what_concatenating_would():
    from agentrl_cli.engines.inference.kv_cache import GrowingLayer, append_rows, swap_remove_order, trim_front

    class Cache:  # the two calls the batch makes on a transformers cache
        def __init__(self, layer):
            self.layers = [layer]

        def batch_select_indices(self, idx):
            self.layers[0].batch_select_indices(idx)

    gen = torch.Generator().manual_seed(0)
    kv = lambda rows, n: (torch.randn(rows, 2, n, 3, generator=gen), torch.randn(rows, 2, n, 3, generator=gen))  # noqa: E731
    layer = GrowingLayer()
    cache = Cache(layer)
    ref_k, ref_v = kv(5, 7)
    layer.update(ref_k, ref_v)
    for step in range(40):
        k, v = kv(ref_k.shape[0], 1)
        got_k, got_v = layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], 2), torch.cat([ref_v, v], 2)
        assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v), step
        if step % 7 == 3 and ref_k.shape[0] > 2:  # two rows leave, the last ones take their places
            order = swap_remove_order(ref_k.shape[0], [i for i in range(ref_k.shape[0]) if i not in (0, 2)])
            cache.batch_select_indices(torch.tensor(order))
            ref_k, ref_v = ref_k[order], ref_v[order]
        if step % 5 == 1 or step % 9 == 0:  # rows join, wider than the batch every other time
            width = ref_k.shape[2] + (9 if step % 10 == 1 else 3 if step % 9 == 0 else -3)
            jk, jv = kv(3, width)
            append_rows(cache, [(jk, jv)])
            pad = lambda t: torch.nn.functional.pad(t, (0, 0, max(width, ref_k.shape[2]) - t.shape[2], 0))  # noqa: E731
            ref_k, ref_v = torch.cat([pad(ref_k), pad(jk)]), torch.cat([pad(ref_v), pad(jv)])
        if step % 9 == 8:
            trim_front(cache, 4)  # then a wider join widens the view again over these columns
            ref_k, ref_v = ref_k[:, :, 4:], ref_v[:, :, 4:]
        assert torch.equal(layer.keys, ref_k) and torch.equal(layer.values, ref_v), step


def test_prompts_of_one_batch_share_the_prefill_of_their_common_prefixes_and_decode_as_alone(model_dir):
    """A harness's system prompt and a group's samples of one prompt: the batch prefills each shared
    prefix once (a radix tree over its prompts), and every row decodes what it decodes alone."""
    rng = random.Random(7)
    system = [rng.randrange(0, 256) for _ in range(30)]
    tasks = [[rng.randrange(0, 256) for _ in range(20)] for _ in range(3)]
    other = [rng.randrange(0, 256) for _ in range(25)]
    prompts = [system + t for t in tasks for _ in range(3)] + [other]  # 3 groups of 3 samples, and a stranger
    sampling = [{**GREEDY, "temperature": 0.8, "sampling_seed": i} if i % 2 else GREEDY for i in range(len(prompts))]
    engine = HFEngine(model_dir, batch_window_ms=1, max_batch_size=16, prefix_cache_tokens=0)
    try:
        alone = [engine.submit(p, s, True, f"a{i}").result(timeout=120) for i, (p, s) in enumerate(zip(prompts, sampling))]
        before = engine.stats.snapshot()["prefill_tokens_total"]
        futures = engine.submit_many([dict(input_ids=p, sampling=s, return_logprob=True, rid=f"b{i}")
                                      for i, (p, s) in enumerate(zip(prompts, sampling))])
        together = [f.result(timeout=120) for f in futures]
        prefilled = engine.stats.snapshot()["prefill_tokens_total"] - before
        assert engine.stats.snapshot()["recent_batch_sizes"][-1] == len(prompts)  # one batch
    finally:
        engine.close()
    for got, want in zip(together, alone):
        assert got["output_ids"] == want["output_ids"]
        assert max(abs(a - b) for a, b in zip(got["output_logprobs"], want["output_logprobs"])) < 1e-4
        assert got["cached_tokens"] == 0  # nothing came from the prefix cache (it is off)
    # the system prompt once, each task's 19 tokens after it once, each sample's last token, the stranger whole
    assert prefilled == 30 + 3 * 19 + 9 * 1 + 25 < sum(map(len, prompts))
