"""The embedded server in vLLM's dialect (`inference.dialect: vllm`) against the client path a vLLM
deployment takes (`EmbeddedVLLMEngine`: vLLM's routes, bodies and answers): generation with token
ids and log-probs equal to the SGLang dialect's on the same engine, the distributed weight transfer
in vLLM's four phases and the load from disk (`collective_rpc` reload_weights, then the version),
both leaving exactly the trainer's weights; pause `keep` holding a request across a weight update;
LoRA adapters under /v1/; a field vLLM's GenerateRequest does not have refused by name; and the
real `agentrl serve inference --dialect vllm` process answering vLLM's routes."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from agentrl_cli.config.models import TrainingConfig
from agentrl_cli.core.serving import ServerThread
from agentrl_cli.engines.embedded import EmbeddedEngine
from agentrl_cli.engines.embedded_vllm import EmbeddedVLLMEngine
from agentrl_cli.engines.inference import HFEngine, create_app
from agentrl_cli.engines.inference.client import InferenceClient, InferenceError, SamplingParams
from agentrl_cli.engines.registry import engine_named
from agentrl_cli.learner.deepspeed_backend import DeepSpeedBackend
from agentrl_cli.model.tiny import build_random
from agentrl_cli.weightsync.disk import DiskTransport
from agentrl_cli.weightsync.distributed import DistributedTransport
from agentrl_cli.weightsync.publisher import WeightPublisher
from tests.conftest import free_port
from tests.integration.test_weight_sync import assert_server_has_trainer_weights, perturb

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_random(tmp_path_factory.mktemp("vd") / "tiny", seed=11, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def served(model_dir):
    """One engine behind both dialects: vLLM's app and SGLang's."""
    engine = HFEngine(model_dir, weight_version="0", batch_window_ms=5)
    vllm_app, sglang_app = create_app(engine, dialect="vllm"), create_app(engine)
    vllm, sglang = ServerThread(vllm_app, name="vllm dialect").start(), ServerThread(sglang_app, name="sglang dialect").start()
    yield vllm.url, sglang.url, engine
    vllm.stop()
    sglang.stop()
    vllm_app.state.weight_groups.close()
    engine.close()


@pytest.fixture(scope="module")
def backend(model_dir):
    b = DeepSpeedBackend(model_dir, TrainingConfig(micro_batch_size=2, learning_rate=1e-3))
    yield b
    b.close()


def client(url: str, engine=None) -> InferenceClient:
    return InferenceClient(url, engine=engine or EmbeddedVLLMEngine(), timeout_s=60, max_retries=0)


def test_the_dialect_is_chosen_by_config_and_a_production_engine_keeps_its_own():
    assert isinstance(engine_named("hf", "vllm"), EmbeddedVLLMEngine)
    assert type(engine_named("hf", "")) is EmbeddedEngine and engine_named("vllm").dialect == "vllm"
    from agentrl_cli.core.errors import ConfigError
    with pytest.raises(ConfigError) as info:
        engine_named("sglang", "vllm")
    assert "inference.dialect" in info.value.message and "hf" in info.value.hint


def test_generation_in_vllms_dialect_equals_sglangs_on_the_same_engine(served):
    vllm_url, sglang_url, _ = served
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)

    async def go():
        a, b = client(vllm_url), client(sglang_url, EmbeddedEngine())
        try:
            return await a.generate([5, 6, 7, 8], sampling), await b.generate([5, 6, 7, 8], sampling)
        finally:
            await a.close()
            await b.close()

    ours, theirs = asyncio.run(go())
    assert ours.output_ids == theirs.output_ids and len(ours.output_ids) == 6
    assert ours.output_logprobs == pytest.approx(theirs.output_logprobs, abs=1e-5)
    assert ours.finish_reason == "length" and ours.prompt_tokens == 4 and ours.weight_version == theirs.weight_version


def test_a_field_vllms_generate_request_lacks_is_refused_by_name(served):
    vllm_url, _, _ = served
    r = httpx.post(vllm_url + "/inference/v1/generate", timeout=30,
                   json={"token_idz": [1, 2], "sampling_params": {"max_tokens": 2}})
    assert r.status_code == 400 and "token_idz" in r.text
    r = httpx.post(vllm_url + "/inference/v1/generate", timeout=30,
                   json={"token_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "max_new_tokens" in r.text and "max_tokens" in r.text


def test_distributed_transfer_in_four_phases_leaves_the_trainers_weights(served, backend):
    vllm_url, _, engine = served
    perturb(backend, seed=1)

    async def go():
        c = client(vllm_url)
        sync = WeightPublisher(DistributedTransport(c, backend="gloo", timeout_s=60), c)
        try:
            first = await sync.sync(backend, 11)
            perturb(backend, seed=2)
            second = await sync.sync(backend, 12)
            return first, second
        finally:
            await sync.close()
            await c.close()

    first, second = asyncio.run(go())
    assert first["version"] == 11 and second["version"] == 12 and second["transport"] == "distributed"
    assert second["verified_tensors"] == 0  # vLLM has no route to read a parameter back: the version is checked
    assert engine.weight_version == "12"
    assert_server_has_trainer_weights(engine, backend)
    assert httpx.get(vllm_url + "/weight_info").json() == {"weight_version": "12"}


def test_disk_load_through_reload_weights_then_the_version(served, backend, tmp_path):
    vllm_url, _, engine = served
    perturb(backend, seed=3)

    async def go():
        c = client(vllm_url)
        sync = WeightPublisher(DiskTransport(c, tmp_path / "weights"), c)
        try:
            return await sync.sync(backend, 21)
        finally:
            await sync.close()
            await c.close()

    entry = asyncio.run(go())
    assert entry["transport"] == "disk" and engine.weight_version == "21" and engine.paused is None
    assert_server_has_trainer_weights(engine, backend)


def test_a_failed_load_still_resumes_and_names_the_step(served, tmp_path):
    vllm_url, _, engine = served

    async def go():
        c = client(vllm_url)
        try:
            await c.update_weights_from_disk(str(tmp_path / "missing"), "99")
        finally:
            await c.close()

    with pytest.raises(InferenceError) as info:
        asyncio.run(go())
    assert "disk weight update" in info.value.message
    assert engine.paused is None and engine.weight_version != "99"  # the resume went out after the failure


def test_pause_keep_holds_a_request_until_resume(served):
    vllm_url, _, _ = served

    async def go():
        c = client(vllm_url)
        try:
            await c.pause_generation("keep")
            task = asyncio.create_task(c.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0)))
            await asyncio.sleep(1.0)
            held = not task.done()
            await c.continue_generation()
            return held, await asyncio.wait_for(task, 60)
        finally:
            await c.close()

    held, g = asyncio.run(go())
    assert held and len(g.output_ids) == 4


def test_adapters_load_generate_by_model_name_and_unload(served, model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    vllm_url, _, _ = served
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(tmp_path / "adapter")

    async def go():
        c = client(vllm_url)
        try:
            loaded = await c.load_lora_adapter("policy", str(tmp_path / "adapter"))
            c.use_adapter("policy")
            g = await c.generate([1, 2, 3], SamplingParams(max_new_tokens=3, temperature=0.0))
            await c.unload_lora_adapter("policy")
            try:
                await c.generate([1, 2, 3], SamplingParams(max_new_tokens=3))
            except InferenceError as exc:
                return loaded, g, exc
            return loaded, g, None
        finally:
            await c.close()

    loaded, g, missing = asyncio.run(go())
    assert len(g.output_ids) == 3
    assert all(a["success"] and a["message"] == "Success: LoRA adapter 'policy' added successfully." for a in loaded.values())
    assert missing is not None and "does not exist" in missing.message


def test_agentrl_serve_inference_speaks_vllms_dialect(model_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", "hf", "--dialect", "vllm",
                             "--model", str(model_dir), "--port", str(port), "--weight-version", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=5) as http:
            import time
            deadline = time.monotonic() + 180  # a loaded 2-core CI box can take minutes to load the model
            while True:
                try:
                    if http.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    pytest.fail(proc.stdout.read())
                if time.monotonic() > deadline:
                    pytest.fail("`agentrl serve inference --dialect vllm` not healthy within 180 s")
                time.sleep(0.1)
            answer = http.post(url + "/inference/v1/generate", timeout=60,
                               json={"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2, "logprobs": 0}}).json()
            assert len(answer["choices"][0]["token_ids"]) == 2 and len(answer["choices"][0]["logprobs"]["content"]) == 2
            assert http.get(url + "/weight_info").json() == {"weight_version": "5"}
            assert "vllm:num_requests_waiting" in http.get(url + "/metrics").text
            assert http.post(url + "/generate", json={"input_ids": [1]}).status_code == 404  # SGLang's route is not served
            info = http.get(url + "/server_info", params={"config_format": "json"}).json()["vllm_config"]
            assert info["model_config"]["max_model_len"] > 0
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_dialect_serve_does_not_take_exits_2(model_dir):
    proc = subprocess.run([sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", "hf", "--dialect", "tgi",
                           "--model", str(model_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--dialect" in proc.stderr and "vllm" in proc.stderr


def test_the_gateways_chat_runs_through_vllms_dialect(served, model_dir):
    """An OpenAI SDK agent through the recording gateway, its model calls going to vLLM's generate route."""
    import openai
    from transformers import AutoTokenizer

    from agentrl_cli.engines.gateway.app import create_app as gateway_app
    from agentrl_cli.engines.gateway.backend import ClientBackend
    from agentrl_cli.engines.gateway.service import Gateway

    vllm_url, _, _ = served
    c = InferenceClient([vllm_url], engine=EmbeddedVLLMEngine(), timeout_s=120)
    gw = Gateway(ClientBackend(c, AutoTokenizer.from_pretrained(str(model_dir)), model_name="tiny", context_length=2048))
    srv = ServerThread(gateway_app(gw, admin_key="admin-key-for-tests"), name="gateway").start()
    admin = {"Authorization": "Bearer admin-key-for-tests"}
    try:
        session = httpx.post(srv.url + "/sessions", json={"meta": {}}, headers=admin, timeout=30).json()
        sdk = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], timeout=60)
        messages = [{"role": "user", "content": "Say something."}]
        first = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=1, logprobs=True)
        messages += [first.choices[0].message, {"role": "user", "content": "And again."}]
        sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=2)
        record = httpx.get(srv.url + f"/sessions/{session['session_id']}", headers=admin, timeout=30).json()
    finally:
        if c._session_loop is not None:
            asyncio.run_coroutine_threadsafe(c.close(), c._session_loop).result(10)
        srv.stop()
    assert record["counters"]["calls"] == 2 and len(record["segments"]) == 1
    segment = record["segments"][0]
    assert sum(segment["loss_mask"]) > 0 and len(segment["logprobs"]) == len(segment["token_ids"])


def test_vllms_router_spreads_generations_over_servers_in_vllms_dialect(model_dir, tmp_path):
    """vllm-router (the command VLLMEngine launches) in front of two embedded servers speaking vLLM's
    protocol: the client's generate goes through it to both."""
    from agentrl_cli.config import load_config
    from agentrl_cli.engines.vllm import VLLMEngine

    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "agentrl_cli", "serve", "inference", "--engine", "hf", "--dialect", "vllm",
                               "--model", str(model_dir), "--port", str(p)], stdout=(tmp_path / f"{p}.log").open("w"),
                              stderr=subprocess.STDOUT, cwd=tmp_path) for p in ports]
    inf = load_config(None, ["inference.engine=vllm", f"inference.python={sys.executable}"], env={}).config.inference
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        wait_up(workers, procs)
        router = start_router(VLLMEngine(), inf, workers, procs, tmp_path)

        async def go():
            c = client(router)
            try:
                return await asyncio.gather(*(c.generate([1, 2, i], SamplingParams(max_new_tokens=2)) for i in range(3, 11)))
            finally:
                await c.close()

        gens = asyncio.run(go())
        assert all(len(g.output_ids) == 2 and len(g.output_logprobs) == 2 for g in gens)
        served = [float(httpx.get(w + "/metrics").text.split("vllm:request_success_total{")[1].split("}")[1].split()[0])
                  for w in workers]
        assert all(n > 0 for n in served) and sum(served) >= 8, served
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


def start_router(engine, inf, workers: list[str], procs: list, tmp_path, tries: int = 3) -> str:
    """The engine's router in front of `workers`, on a port whose next one (its Prometheus port) is
    free too. Ports are chosen free, then bound by another process: a router that loses that race
    (its log says the address is in use) is started again on fresh ports, and any other exit fails."""
    for attempt in range(tries):
        port = free_port()
        while not port_free(port + 1):
            port = free_port()
        log = tmp_path / f"router-{attempt}.log"
        proc = subprocess.Popen(engine.router_launch(inf, workers, port).cmd, stdout=log.open("w"),
                                stderr=subprocess.STDOUT, cwd=tmp_path)
        procs.append(proc)
        try:
            wait_up([f"http://127.0.0.1:{port}"], [proc], log=log)
            return f"http://127.0.0.1:{port}"
        except pytest.fail.Exception:
            if proc.poll() is None or "Address already in use" not in log.read_text() or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_up(urls: list[str], procs, deadline_s: float = 90.0, log=None) -> None:
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            tail = "\n".join(log.read_text().splitlines()[-5:]) if log is not None else "its log is in the test's tmp_path"
            pytest.fail(f"{dead[0].args[:6]} exited with {dead[0].returncode}: {tail}")
        try:
            if all(httpx.get(u + "/health", timeout=2).status_code == 200 for u in urls):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"not healthy within {deadline_s} s: {urls}")


def test_an_aborted_generation_hands_back_its_tokens_and_is_resumed(served):
    """/abort_requests mid-generation: vLLM's answer hands the request back (finish reason abort, with
    the tokens generated so far), and the rollout's resume path finishes it to the full length."""
    from collections import Counter

    from agentrl_cli.engines.resume import ResumePolicy, generate_resumable

    vllm_url, _, engine = served
    # long enough that the tiny model (about 0.45 ms a token here) is still decoding when paused
    sampling = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)

    async def go():
        c = client(vllm_url)
        counters: Counter = Counter()
        try:
            task = asyncio.create_task(generate_resumable(c, [1, 2, 3], sampling, ResumePolicy(), counters))
            while not engine.snapshot()["num_running_reqs"] and not task.done():
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # a few tokens in: the answer carries them
            await asyncio.to_thread(engine.pause, "in_place")  # held mid-generation, so the abort finds it running
            async with httpx.AsyncClient() as http:
                aborted = (await http.post(vllm_url + "/abort_requests", json={})).json()
            engine.resume()
            return aborted, await asyncio.wait_for(task, 120), counters
        finally:
            await c.close()

    aborted, gen, counters = asyncio.run(go())
    assert aborted == {"status": "aborted", "aborted": 1}
    assert len(gen.output_ids) == 1500 and len(gen.output_logprobs) == 1500
    # handed back and sent again (continued from its partial tokens when some had been generated)
    assert counters["aborted_generations"] == 1 and counters["lost_generations"] == 0
