"""The embedded HF server over HTTP on loopback: SGLang's /generate shapes, batching that does not
change results, log-probs that match a plain forward pass, weight updates (waiting, aborting,
rolling back), pause/continue, abort, concurrency, bad requests, the API key and /metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl_cli.engines.inference import HFEngine, create_app, loading
from agentrl_cli.model.tiny import build_random
from agentrl_cli.core.serving import ServerThread

pytestmark = pytest.mark.integration

PROMPTS = [[72, 101], [108, 108, 111, 32, 119], [1, 2, 3], [200, 17, 5, 9, 11, 13, 40], [33],
           [90, 91, 92, 93], [10, 20, 30, 40, 50, 60, 70, 80, 90], [64, 65, 66, 67, 68, 69]]


# Untied, larger random weights: with the defaults a random model mostly repeats its last input
# token whatever the seed, which would make "outputs differ" and "batching changes nothing" vacuous.
RANDOM = dict(tie_word_embeddings=False, initializer_range=0.2)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    return build_random(root / "m", seed=0, **RANDOM), build_random(root / "m2", seed=1, **RANDOM)


@pytest.fixture(scope="module")
def reference(model_dirs):
    return AutoModelForCausalLM.from_pretrained(model_dirs[0], dtype=torch.float32).eval()


class Served:
    def __init__(self, model_dir, **app_kwargs) -> None:
        self.engine = HFEngine(model_dir, weight_version="v0")
        self.server = ServerThread(create_app(self.engine, **app_kwargs), name="hf server").start()
        self.url = self.server.url

    def post(self, path, body=None, **kwargs):
        return httpx.post(f"{self.url}{path}", json=body if body is not None else {}, timeout=120, **kwargs)

    def get(self, path, **kwargs):
        return httpx.get(f"{self.url}{path}", timeout=60, **kwargs)

    def generate(self, input_ids, **sampling):
        body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, **sampling}, "return_logprob": True}
        response = self.post("/generate", body)
        assert response.status_code == 200, response.text
        return response.json()

    def wait_for(self, condition) -> None:
        deadline = time.monotonic() + 60
        while not condition(self.engine.snapshot()):
            assert time.monotonic() < deadline, "the engine never reached the expected state"
            time.sleep(0.005)

    def wait_running(self, count: int = 1) -> None:
        self.wait_for(lambda snap: snap["num_running_reqs"] >= count)

    def close(self) -> None:
        self.server.stop()
        self.engine.close()


@pytest.fixture(scope="module")
def served(model_dirs):
    s = Served(model_dirs[0])
    yield s
    s.close()


@pytest.fixture
def fresh(model_dirs):
    """A server of its own, for tests that change weights or pause."""
    s = Served(model_dirs[0])
    yield s
    s.close()


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        box["value"] = fn(*args, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def forward_logprobs(model, prompt, output, temperature=1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(1, torch.tensor(output)[:, None]).squeeze(1)


def test_generate_round_trips_the_sglang_example_shape(served):
    body = {"input_ids": [104, 105, 10], "sampling_params": {"temperature": 0.7, "max_new_tokens": 4},
            "return_logprob": True}
    out = served.post("/generate", body).json()
    assert list(out) == ["text", "output_ids", "meta_info"]
    meta = out["meta_info"]
    assert list(meta) == ["id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions",
                          "input_token_logprobs", "output_token_logprobs", "completion_tokens", "cached_tokens",
                          "e2e_latency", "response_sent_to_client_ts"]
    assert meta["input_token_logprobs"] == [[None, 10, None]]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(lp <= 0 and text is None for lp, _, text in meta["output_token_logprobs"])
    assert meta["prompt_tokens"] == 3 and meta["weight_version"] == "v0" and meta["total_retractions"] == 0
    if meta["finish_reason"]["type"] == "length":
        assert meta["finish_reason"] == {"type": "length", "length": 4} and meta["completion_tokens"] == 4


def test_stop_token_id_finishes_with_the_matched_id_and_is_trimmed_from_text(served):
    free = served.generate(PROMPTS[1], max_new_tokens=8, ignore_eos=True)
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    stop = free["output_ids"][3]
    first = free["output_ids"].index(stop)
    out = served.generate(PROMPTS[1], max_new_tokens=8, stop_token_ids=[stop])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == free["output_ids"][:first + 1]  # output_ids keep the stop token
    assert out["meta_info"]["completion_tokens"] == first + 1
    untrimmed = served.post("/generate", {"input_ids": PROMPTS[1], "sampling_params": {
        "temperature": 0, "max_new_tokens": 8, "stop_token_ids": [stop], "no_stop_trim": True,
        "skip_special_tokens": False}}).json()
    tok = served.engine.tokenizer
    assert out["text"] == tok.decode(out["output_ids"][:-1])
    assert untrimmed["text"] == tok.decode(out["output_ids"])


def test_batch_input_gives_a_list_with_one_entry_per_prompt(served):
    out = served.post("/generate", {"input_ids": PROMPTS[:3], "sampling_params": {"max_new_tokens": 2},
                                    "rid": "b"}).json()
    assert isinstance(out, list) and [o["meta_info"]["id"] for o in out] == ["b_0", "b_1", "b_2"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [len(p) for p in PROMPTS[:3]]
    samples = httpx.put(f"{served.url}/generate", timeout=60, json={
        "text": "hi", "sampling_params": {"n": 2, "max_new_tokens": 2}}).json()  # PUT and text work too
    assert isinstance(samples, list) and len(samples) == 2
    assert all(o["meta_info"]["prompt_tokens"] == 2 for o in samples)


@pytest.fixture(scope="module")
def alone(served):
    """Greedy outputs of PROMPTS, each generated in a batch of its own."""
    return [served.generate(p, max_new_tokens=10, ignore_eos=True)["output_ids"] for p in PROMPTS]


def test_batched_greedy_generation_equals_one_at_a_time(served, alone):
    batched = served.post("/generate", {"input_ids": PROMPTS, "sampling_params": {
        "temperature": 0, "max_new_tokens": 10, "ignore_eos": True}}).json()
    assert [o["output_ids"] for o in batched] == alone
    assert 8 in served.engine.snapshot()["recent_batch_sizes"]  # they really shared one batch


def test_rows_finishing_early_do_not_disturb_the_others(served, alone):
    lengths = [3, 10, 1, 7, 10, 2, 5, 10]
    batched = served.post("/generate", {"input_ids": PROMPTS, "sampling_params": [
        {"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lengths]}).json()
    assert [o["output_ids"] for o in batched] == [a[:n] for a, n in zip(alone, lengths)]


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}])
def test_returned_logprobs_match_a_full_forward_pass(served, reference, sampling):
    body = {"input_ids": PROMPTS, "sampling_params": {**sampling, "max_new_tokens": 8, "ignore_eos": True},
            "return_logprob": True}
    temperature = sampling["temperature"] or 1.0
    for prompt, out in zip(PROMPTS, served.post("/generate", body).json()):
        got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        expected = forward_logprobs(reference, prompt, out["output_ids"], temperature)
        assert (got - expected).abs().max().item() < 1e-4


def test_whole_prompt_logprobs_with_logprob_start_len_zero(served, reference):
    prompt = PROMPTS[6]
    out = served.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                                    "return_logprob": True, "logprob_start_len": 0}).json()
    entries = out["meta_info"]["input_token_logprobs"]
    assert entries[0] == [None, prompt[0], None] and [t for _, t, _ in entries] == prompt
    expected = forward_logprobs(reference, prompt[:1], prompt[1:])
    assert (torch.tensor([lp for lp, _, _ in entries[1:]]) - expected).abs().max().item() < 1e-4


def test_sampling_seed_makes_sampling_reproducible(served):
    def sample(seed):
        return served.generate(PROMPTS[2], temperature=1.0, max_new_tokens=12, ignore_eos=True,
                               sampling_seed=seed)["output_ids"]

    assert sample(1234) == sample(1234)
    assert len({tuple(sample(s)) for s in (1, 2, 3)}) > 1


def test_weight_update_changes_output_and_version_everywhere(fresh, model_dirs):
    before = fresh.generate(PROMPTS[3], max_new_tokens=8, ignore_eos=True)
    response = fresh.post("/update_weights_from_disk", {"model_path": str(model_dirs[1]), "weight_version": "v1"})
    assert response.status_code == 200
    assert response.json() == {"success": True, "num_paused_requests": 0,
                               "message": "Succeeded to update model weights. Weight version updated to v1."}
    after = fresh.generate(PROMPTS[3], max_new_tokens=8, ignore_eos=True)
    assert after["output_ids"] != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "v1"
    assert fresh.get("/model_info").json()["weight_version"] == "v1"
    assert fresh.get("/get_weight_version").json() == {"weight_version": "v1"}
    assert fresh.get("/server_info").json()["weight_version"] == "v1"


def test_request_in_flight_during_an_update_finishes_on_the_old_weights(fresh, model_dirs):
    old = fresh.generate(PROMPTS[0], max_new_tokens=96, ignore_eos=True)["output_ids"]
    thread, long = in_background(fresh.generate, PROMPTS[0], max_new_tokens=96, ignore_eos=True)
    fresh.wait_running()
    update = fresh.post("/update_weights_from_disk", {"model_path": str(model_dirs[1]), "weight_version": "v1"})
    thread.join(60)
    assert update.json()["success"] is True
    assert long["value"]["meta_info"]["weight_version"] == "v0"
    assert long["value"]["output_ids"] == old
    assert fresh.generate(PROMPTS[0], max_new_tokens=8)["meta_info"]["weight_version"] == "v1"


def test_update_with_abort_all_requests_returns_partial_aborted_results(fresh, model_dirs):
    old = fresh.generate(PROMPTS[0], max_new_tokens=16, ignore_eos=True)["output_ids"]
    thread, long = in_background(fresh.post, "/generate", {
        "input_ids": PROMPTS[0], "return_logprob": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 1900, "ignore_eos": True}})
    fresh.wait_running()
    update = fresh.post("/update_weights_from_disk", {"model_path": str(model_dirs[1]), "weight_version": "v1",
                                                      "abort_all_requests": True})
    thread.join(60)
    assert update.json()["success"] is True
    response = long["value"]
    assert response.status_code == 200
    out = response.json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    assert len(out["output_ids"]) < 1900 and len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert meta["weight_version"] == "v0"
    n = min(len(old), len(out["output_ids"]))
    assert out["output_ids"][:n] == old[:n]  # the partial tokens came from the old weights


def test_update_weight_version_relabels_without_reloading(fresh):
    before = fresh.generate(PROMPTS[4], max_new_tokens=4, ignore_eos=True)["output_ids"]
    response = fresh.post("/update_weight_version", {"new_version": "v7"})
    assert response.json() == {"success": True, "message": "Weight version updated to v7", "new_version": "v7"}
    after = fresh.generate(PROMPTS[4], max_new_tokens=4, ignore_eos=True)
    assert after["meta_info"]["weight_version"] == "v7" and after["output_ids"] == before


def test_failed_update_rolls_back_and_keeps_serving(fresh, tmp_path):
    before = fresh.generate(PROMPTS[4], max_new_tokens=6, ignore_eos=True)["output_ids"]
    response = fresh.post("/update_weights_from_disk", {"model_path": str(tmp_path / "missing"),
                                                        "weight_version": "v9"})
    assert response.status_code == 400
    body = response.json()
    assert body["success"] is False and body["num_paused_requests"] == 0
    assert body["message"].startswith("Failed to update weights: ")
    assert body["message"].endswith("\nRolling back to original weights.")
    after = fresh.generate(PROMPTS[4], max_new_tokens=6, ignore_eos=True)
    assert after["output_ids"] == before and after["meta_info"]["weight_version"] == "v0"
    assert fresh.get("/get_weight_version").json() == {"weight_version": "v0"}


def test_parallel_updates_of_two_engines_load_correct_weights(tmp_path):
    # transformers' loader patches process-wide state; parallel loads once produced untied lm_heads
    old, new = build_random(tmp_path / "a", seed=3), build_random(tmp_path / "b", seed=4)  # tied weights
    engines = [HFEngine(old) for _ in range(3)]
    try:
        threads = [in_background(e.update_weights_from_disk, new, "v1") for e in engines]
        for thread, _ in threads:
            thread.join(60)
        assert all(box["value"][0] for _, box in threads)
        model = AutoModelForCausalLM.from_pretrained(new).eval()
        for engine in engines:
            out = engine.submit(PROMPTS[3], {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}).result(60)
            got = torch.tensor(out["output_logprobs"])
            assert (got - forward_logprobs(model, PROMPTS[3], out["output_ids"])).abs().max().item() < 1e-4
    finally:
        for engine in engines:
            engine.close()


def test_pause_blocks_generate_until_continue(fresh):
    assert fresh.post("/pause_generation", {}).json() == {"message": "Generation paused successfully.",
                                                          "status": "ok"}
    thread, box = in_background(fresh.generate, PROMPTS[2], max_new_tokens=3)
    fresh.wait_for(lambda snap: snap["num_queue_reqs"] == 1)
    time.sleep(0.3)  # room to run if pausing did not work; not a timing assertion
    assert "value" not in box and fresh.engine.snapshot()["num_queue_reqs"] == 1
    assert fresh.get("/flush_cache").status_code == 200  # a request held by the pause is not in flight
    assert fresh.post("/continue_generation", {}).json()["status"] == "ok"
    thread.join(60)
    assert box["value"]["meta_info"]["completion_tokens"] >= 1


def test_retracted_request_restarts_on_the_new_weights_without_mixing(fresh, model_dirs):
    # long enough that the tiny model (about 0.45 ms a token here) is still decoding when paused
    thread, box = in_background(fresh.generate, PROMPTS[5], max_new_tokens=1500, ignore_eos=True)
    fresh.wait_running()
    assert fresh.post("/pause_generation", {"mode": "retract"}).status_code == 200
    assert fresh.post("/update_weights_from_disk", {"model_path": str(model_dirs[1]),
                                                    "weight_version": "v1"}).json()["success"] is True
    fresh.post("/continue_generation", {})
    thread.join(120)
    out = box["value"]
    assert out["meta_info"]["weight_version"] == "v1" and out["meta_info"]["total_retractions"] == 1
    assert out["output_ids"] == fresh.generate(PROMPTS[5], max_new_tokens=1500, ignore_eos=True)["output_ids"]


def test_abort_request_by_rid_prefix_and_flush_cache_refuses_while_busy(fresh):
    body = {"input_ids": [PROMPTS[0], PROMPTS[1]], "rid": "job", "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 1900, "ignore_eos": True}}
    thread, box = in_background(fresh.post, "/generate", body)
    fresh.wait_running(2)
    assert fresh.get("/flush_cache").status_code == 400
    assert fresh.post("/abort_request", {"rid": "job_0"}).status_code == 200  # live rid: prefix-matches job_0 only
    assert fresh.post("/abort_request", {"rid": "job_1"}).status_code == 200
    thread.join(60)
    outs = box["value"].json()
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort", "abort"]
    assert fresh.get("/flush_cache").status_code == 200
    assert fresh.post("/abort_request", {"rid": ""}).status_code == 200  # nothing live: a no-op


def test_256_concurrent_requests_all_complete(served):
    async def main():
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(base_url=served.url, timeout=120, limits=limits) as client:
            async def one(i):
                prompt = PROMPTS[i % len(PROMPTS)] + [i % 200]
                return await client.post("/generate", json={"input_ids": prompt, "return_logprob": True,
                                                            "sampling_params": {"max_new_tokens": 4}})
            return await asyncio.gather(*(one(i) for i in range(256)))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 256
    for r in responses:
        meta = r.json()["meta_info"]
        assert 1 <= meta["completion_tokens"] <= 4 and len(meta["output_token_logprobs"]) == meta["completion_tokens"]


@pytest.mark.parametrize("body, fragment", [
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [5] * 2048}, "The input (2048 tokens) is longer than the model's context length (2048"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2046}}, "Requested token count exceeds"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"top_p": 2}}, "top_p"),
    ({"input_ids": ["a", "b"]}, "input_ids"),
    ({"input_ids": [1], "sampling_params": {"frobnicate": 1}}, "frobnicate"),
    ({"input_ids": [1], "image_data": "http://example.invalid/cat.png"}, "image_data is not supported"),
    ({"input_ids": [[1], [2]], "stream": True}, "stream"),
])
def test_bad_requests_get_400_naming_the_problem_and_the_server_keeps_serving(served, body, fragment):
    response = served.post("/generate", body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert served.generate([1, 2], max_new_tokens=1)["meta_info"]["completion_tokens"] == 1


def test_gpu_only_weight_updates_are_refused(served):
    for path in ("/update_weights_from_tensor",):
        response = served.post(path, {})
        assert response.status_code == 400
        body = response.json()
        assert body["success"] is False and "use update_weights_from_disk" in body["message"]


def test_busy_seconds_count_the_time_spent_in_batches_and_only_that(fresh):
    def busy() -> float:
        return fresh.get("/server_info").json()["internal_states"][0]["busy_seconds_total"]

    idle_before = busy()
    time.sleep(0.2)
    assert busy() == idle_before == 0.0  # no batch ran: an idle server is not busy
    t0 = time.monotonic()
    fresh.generate(PROMPTS[0], max_new_tokens=16, ignore_eos=True)
    elapsed = time.monotonic() - t0
    after = busy()
    assert 0.0 < after <= elapsed
    time.sleep(0.2)
    assert busy() == after  # idle again: the counter stands still


def test_phase_counters_account_for_every_prompt_and_generated_token(fresh):
    """Prefill and decode, from the server's own counters: prefilled + cached tokens are the prompt
    tokens it saw, decoded tokens the ones it generated; rows per decode step within the batch size;
    both phases' seconds within its busy time."""
    lengths = [3, 9, 5, 12, 7, 4, 16, 2]  # rows finish at different steps: the batch shrinks as it decodes
    threads = [in_background(fresh.generate, p, max_new_tokens=n, ignore_eos=True)[0] for p, n in zip(PROMPTS, lengths)]
    for t in threads:
        t.join(120)
    fresh.generate(PROMPTS[3] + [5, 6], max_new_tokens=4, ignore_eos=True)  # its prompt's prefix may come from the cache
    state = fresh.get("/server_info").json()["internal_states"][0]
    snap = fresh.engine.snapshot()
    assert state["prefill_tokens_total"] + snap["cached_tokens_total"] == snap["prompt_tokens_total"] == sum(map(len, PROMPTS)) + 9
    assert state["decode_tokens_total"] == snap["generation_tokens_total"] == sum(lengths) + 4
    assert 1 <= state["decode_rows_total"] / state["decode_steps_total"] <= fresh.engine.max_batch_size
    assert state["decode_steps_total"] < state["decode_tokens_total"]  # rows decode together
    assert 0 < state["prefill_seconds_total"] + state["decode_seconds_total"] <= state["busy_seconds_total"]


def test_info_and_health_endpoints(served):
    assert served.get("/health").status_code == 200
    assert served.get("/health_generate").status_code == 200
    info = served.get("/server_info").json()
    assert {k: info[k] for k in ("tp_size", "dp_size", "status", "context_length", "max_batch_size")} == {
        "tp_size": 1, "dp_size": 1, "status": "ready", "context_length": 2048, "max_batch_size": 64}
    assert info["version"].startswith("agentrl-hf-") and info["served_model_name"] == info["model_path"]
    assert served.get("/get_server_info").json()["model_path"] == info["model_path"]
    model = served.get("/get_model_info").json()
    assert model["is_generation"] is True and model["architectures"] == ["LlamaForCausalLM"]
    flushed = served.get("/flush_cache")
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")


def test_api_key_guards_everything_but_health_and_metrics(served):
    app = create_app(served.engine, api_key="sekret", served_model_name="tiny")
    server = ServerThread(app, name="hf server with key").start()
    try:
        url, ok = server.url, {"Authorization": "Bearer sekret"}
        body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
        no_key = httpx.post(f"{url}/generate", json=body)
        assert no_key.status_code == 401 and no_key.json() == {"error": "Unauthorized"}
        assert httpx.post(f"{url}/generate", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{url}/model_info").status_code == 401
        assert httpx.post(f"{url}/generate", json=body, headers=ok, timeout=60).status_code == 200
        assert httpx.get(f"{url}/model_info", headers=ok).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/health_generate", timeout=60).status_code == 200
        metrics = httpx.get(f"{url}/metrics")
        assert metrics.status_code == 200 and 'model_name="tiny"' in metrics.text
    finally:
        server.stop()


def test_metrics_use_sglang_names(served):
    served.generate([5, 6], max_new_tokens=2, ignore_eos=True)
    text = served.get("/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:num_aborted_requests_total", "sglang:e2e_request_latency_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_count"):
        assert f"{name}{{" in text, name
    counts = [line for line in text.splitlines() if line.startswith("sglang:num_requests_total{")]
    assert float(counts[0].rsplit(" ", 1)[1]) >= 1


def test_get_weights_by_name_reports_the_live_weights_and_follows_an_update(tmp_path):
    """SGLang's sync check: the first rows of a parameter, from the weights now in use."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl_cli.engines.inference.client import InferenceClient
    from agentrl_cli.engines.inference.engine import HFEngine
    from agentrl_cli.engines.inference.hf_server import create_app
    from agentrl_cli.model.tiny import build_random
    from agentrl_cli.core.serving import ServerThread

    a, b = build_random(tmp_path / "a", seed=1), build_random(tmp_path / "b", seed=2)
    engine = HFEngine(a, batch_window_ms=1)
    server = ServerThread(create_app(engine), name="hf").start()
    name = "model.layers.0.self_attn.q_proj.weight"
    try:
        async def go():
            client = InferenceClient(server.url)
            first = (await client.get_weights_by_name(name, 3))[server.url]
            await client.update_weights_from_disk(str(b), "1")
            second = (await client.get_weights_by_name(name, 3))[server.url]
            await client.close()
            return first, second
        first, second = asyncio.run(go())
        for path, got in ((a, first), (b, second)):
            ref = dict(AutoModelForCausalLM.from_pretrained(path).named_parameters())[name][:3]
            assert torch.allclose(torch.tensor(got), ref.detach())
        assert httpx.post(server.url + "/get_weights_by_name", json={"name": "nope"}).status_code == 400
    finally:
        server.stop()
        engine.close()


def test_an_export_of_the_same_architecture_loads_into_a_copy_and_another_one_fully(tmp_path):
    old, new = build_random(tmp_path / "a", seed=3), build_random(tmp_path / "b", seed=4)
    other = build_random(tmp_path / "c", seed=4, num_hidden_layers=1)
    engine = HFEngine(old)
    try:
        copied = loading.into_copy(str(new), engine._model, engine.dtype, engine._copy_of_serving)
        assert copied is not None and copied is not engine._model
        assert copied.lm_head.weight.data_ptr() == copied.model.embed_tokens.weight.data_ptr()  # still tied
        assert loading.into_copy(str(other), engine._model, engine.dtype, engine._copy_of_serving) is None  # another config: the full load
        for path, version in ((new, "v1"), (other, "v2")):
            assert engine.update_weights_from_disk(path, version)[0]
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            out = engine.submit(PROMPTS[3], {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}).result(60)
            got = torch.tensor(out["output_logprobs"])
            assert (got - forward_logprobs(model, PROMPTS[3], out["output_ids"])).abs().max().item() < 1e-4
            assert engine.weight_version == version
    finally:
        engine.close()


def test_a_streamed_generate_sends_the_new_tokens_as_they_come_and_ends_like_the_whole_answer(served):
    """`stream: true`: events in SGLang's incremental shape whose ids and log-probs, concatenated,
    are the answer not streamed; `completion_tokens` counts all so far; `finish_reason` on the last."""
    import json

    whole = served.generate([1, 2, 3], max_new_tokens=12, ignore_eos=True)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True},
            "return_logprob": True, "stream": True}
    chunks = []
    with httpx.stream("POST", f"{served.url}/generate", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    ids = [t for c in chunks for t in c["output_ids"]]
    lps = [lp for c in chunks for lp, _, _ in c["meta_info"]["output_token_logprobs"]]
    assert ids == whole["output_ids"] and lps == pytest.approx([lp for lp, _, _ in whole["meta_info"]["output_token_logprobs"]])
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == \
        [sum(len(c["output_ids"]) for c in chunks[:i + 1]) for i in range(len(chunks))]


def test_a_streamed_request_retracted_after_sending_tokens_is_aborted_with_them(served):
    """A retraction restarts a request from scratch; a streamed one has sent tokens that cannot be
    taken back, so it ends aborted with exactly the ids it streamed (a gateway goes on from them)."""
    import json

    body = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True},
            "return_logprob": True, "stream": True}
    engine = served.engine

    # once a row has a token the batch waits at its checkpoint until the retraction has been asked for:
    # the tiny model decodes 64 tokens in tens of milliseconds, which a retraction sent after reading
    # the first chunk could miss
    def checkpoint(active):
        deadline = time.monotonic() + 60
        while engine.paused is None and any(r.output_ids for r in active) and time.monotonic() < deadline:
            time.sleep(0.001)
        return type(engine).checkpoint(engine, active)

    chunks = []
    engine.checkpoint = checkpoint  # BatchRun calls its hooks' (the engine's) checkpoint every step
    try:
        with httpx.stream("POST", f"{served.url}/generate", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:  # tokens have left: now retract the running batch
                    assert served.post("/pause_generation", {"mode": "retract"}).status_code == 200
    finally:
        engine.__dict__.pop("checkpoint", None)
        served.post("/continue_generation")
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and "cannot restart" in last["finish_reason"]["message"]
    streamed = [t for c in chunks for t in c["output_ids"]]
    assert 1 <= len(streamed) == last["completion_tokens"] < 64
