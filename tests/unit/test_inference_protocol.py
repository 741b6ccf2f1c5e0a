"""The embedded server's SGLang protocol layer and sampler, without a server: request validation,
response shapes, stop rules, and the log-prob semantics of the sampler."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentrl_cli.engines.inference.protocol import (ProtocolError, WorkItem, build_output, dumps, output_text,
                                            parse_generate)
from agentrl_cli.engines.inference.sampling import BatchSampler, GenParams, check_finished, context_error
from agentrl_cli.model.tokenizer import build_tokenizer

VOCAB, CONTEXT = 264, 64


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def parse(tok, body, context=CONTEXT):
    return parse_generate(body, tok, VOCAB, context)


def test_single_prompt_gets_sglang_defaults_and_an_object_response(tok):
    parsed = parse(tok, {"input_ids": [1, 2, 3]})
    assert not parsed.as_list and len(parsed.items) == 1
    item = parsed.items[0]
    assert item.input_ids == [1, 2, 3] and item.logprob_start_len == -1 and item.return_logprob is False
    assert item.sampling["max_new_tokens"] == 128 and item.sampling["temperature"] == 1.0
    assert item.sampling["top_p"] == 1.0 and item.sampling["top_k"] == -1
    assert len(item.rid) == 32  # a uuid4 hex, as SGLang


def test_batch_with_a_string_rid_gets_indexed_rids_and_a_list_response(tok):
    parsed = parse(tok, {"input_ids": [[1], [2, 3]], "rid": "job", "return_logprob": True})
    assert parsed.as_list
    assert [i.rid for i in parsed.items] == ["job_0", "job_1"]
    assert [i.input_ids for i in parsed.items] == [[1], [2, 3]]
    assert all(i.return_logprob for i in parsed.items)


def test_input_ids_win_over_text_and_text_is_tokenized(tok):
    assert parse(tok, {"input_ids": [7], "text": "hello"}).items[0].input_ids == [7]
    assert parse(tok, {"text": "hi"}).items[0].input_ids == tok.encode("hi")
    assert len(parse(tok, {"text": ["a", "b"]}).items) == 2


def test_n_samples_expand_prompt_major_with_fresh_rids_and_distinct_seeds(tok):
    parsed = parse(tok, {"input_ids": [[1], [2]], "rid": "r",
                         "sampling_params": [{"n": 2, "sampling_seed": 5}, {"n": 2}]})
    assert [i.input_ids for i in parsed.items] == [[1], [1], [2], [2]]
    assert len({i.rid for i in parsed.items}) == 4 and not any(i.rid.startswith("r_") for i in parsed.items)
    assert [parsed.items[0].sampling["sampling_seed"], parsed.items[1].sampling["sampling_seed"]] == [5, 6]
    assert parse(tok, {"input_ids": [1], "sampling_params": {"n": 3}}).as_list


def test_unknown_top_level_keys_and_unset_unsupported_fields_are_accepted(tok):
    body = {"input_ids": [1], "no_such_field": 1, "image_data": None, "return_hidden_states": False,
            "stream": False, "lora_path": None, "log_metrics": True, "top_logprobs_num": 0}
    assert parse(tok, body).items[0].input_ids == [1]


@pytest.mark.parametrize("body, fragment", [
    ({"input_ids": []}, "input_ids is empty"),
    ({"input_ids": [[1], []]}, "input_ids[1] is empty"),
    ({"input_ids": ["a", "b"]}, "input_ids must be a list of integer token ids"),
    ({"input_ids": [True]}, "input_ids must be a list of integer token ids"),
    ({"input_ids": [VOCAB]}, f"token id {VOCAB}, outside the vocabulary"),
    ({}, "Either text or input_ids should be provided."),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be a positive integer"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens must be a positive integer"),
    ({"input_ids": [1], "sampling_params": {"top_p": 2}}, "top_p must be in (0, 1]"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k must be -1"),
    ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature must be non-negative"),
    ({"input_ids": [1], "sampling_params": {"temperature": "0.5"}}, "sampling_params.temperature: expected"),
    ({"input_ids": [1], "sampling_params": {"temperature": math.nan}}, "finite"),
    ({"input_ids": [1], "sampling_params": {"stop": [1]}}, "sampling_params.stop: expected a string or a list"),
    ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "sampling_params.bogus: unknown key"),
    ({"input_ids": [1], "sampling_params": {"json_schema": "{}"}},
     "sampling_params.json_schema is not supported by the embedded server"),
    ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "sampling_params.regex is not supported"),
    ({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.1}},
     "repetition_penalty other than 1.0 is not supported"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params has 1 entries but the batch has 2"),
    ({"input_ids": [1], "image_data": "http://x/y.png"}, "image_data is not supported by the embedded server"),
    ({"input_ids": [1], "lora_id": "0f3a"}, "lora_id is not supported"),
    ({"input_ids": [[1], [2]], "lora_path": ["a"]}, "lora_path has 1 entries but the request has 2 prompt(s)"),
    ({"input_ids": [1], "lora_path": 7}, "lora_path: expected the name of a loaded LoRA adapter"),
    ({"input_ids": [1], "return_hidden_states": True}, "return_hidden_states is not supported"),
    ({"input_ids": [[1], [2]], "stream": True}, "stream=true with a batch or n > 1 is not supported"),
    ({"input_ids": [1], "stream": True, "sampling_params": {"n": 2}}, "stream=true with a batch or n > 1"),
    ({"input_ids": [1], "top_logprobs_num": 5}, "top_logprobs_num > 0 is not supported"),
    ({"input_ids": [1], "logprob_start_len": 3}, "logprob_start_len=3 is not supported"),
    ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob: expected a boolean"),
    ({"input_ids": list(range(CONTEXT))}, f"The input ({CONTEXT} tokens) is longer than the model's context length"),
])
def test_bad_generate_requests_are_refused_naming_the_problem(tok, body, fragment):
    with pytest.raises(ProtocolError) as info:
        parse(tok, body)
    assert fragment in str(info.value)


def test_context_messages_are_sglangs_and_the_total_check_needs_max_new_tokens(tok):
    assert context_error(10, None, 10) == "The input (10 tokens) is longer than the model's context length (10 tokens)."
    assert context_error(6, 4, 10) == (
        "Requested token count exceeds the model's maximum context length of 10 tokens. You requested a total of "
        "10 tokens: 6 tokens from the input messages and 4 tokens for the completion. Please reduce the number of "
        "tokens in the input messages or the completion to fit within the limit.")
    assert context_error(6, 3, 10) is None
    # without max_new_tokens SGLang skips the total check and clamps the default 128 later
    assert parse(tok, {"input_ids": list(range(60))}).items[0].input_ids == list(range(60))
    with pytest.raises(ProtocolError, match="Requested token count exceeds"):
        parse(tok, {"input_ids": list(range(60)), "sampling_params": {"max_new_tokens": 4}})


def test_text_trimming_follows_sglang(tok):
    ids = tok.encode("hello") + [tok.eos_token_id]
    assert output_text(ids, {"type": "stop", "matched": tok.eos_token_id}, tok) == "hello"
    assert output_text(ids, {"type": "stop", "matched": tok.eos_token_id}, tok, skip_special_tokens=False) == "hello"
    assert output_text(ids, {"type": "stop", "matched": tok.eos_token_id}, tok, no_stop_trim=True,
                       skip_special_tokens=False) == "hello<|im_end|>"
    abc = tok.encode("abcSTOPx")
    assert output_text(abc, {"type": "stop", "matched": "STOP"}, tok) == "abc"
    assert output_text(abc, {"type": "stop", "matched": "STOP"}, tok, no_stop_trim=True) == "abcSTOPx"
    assert output_text(abc, {"type": "length", "length": 8}, tok) == "abcSTOPx"


def result(**over):
    base = {"output_ids": [104, 105], "output_logprobs": [-0.5, -1.5], "input_logprobs": None,
            "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 3, "completion_tokens": 2,
            "weight_version": "v3", "retractions": 0, "e2e_latency": 0.1}
    return {**base, **over}


def test_meta_info_keys_follow_sglang_order_with_logprob_triples(tok):
    item = WorkItem([1, 2, 3], {"skip_special_tokens": True}, "rid-1", True, -1)
    out = build_output(item, result(), tok)
    assert list(out) == ["text", "output_ids", "meta_info"]
    assert list(out["meta_info"]) == ["id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions",
                                      "input_token_logprobs", "output_token_logprobs", "completion_tokens",
                                      "cached_tokens", "e2e_latency", "response_sent_to_client_ts"]
    assert out["meta_info"]["input_token_logprobs"] == [[None, 3, None]]
    assert out["meta_info"]["output_token_logprobs"] == [[-0.5, 104, None], [-1.5, 105, None]]
    assert out["text"] == "hi" and out["meta_info"]["weight_version"] == "v3"
    plain = build_output(WorkItem([1], {}, "r", False, -1), result(), tok)["meta_info"]
    assert "input_token_logprobs" not in plain and list(plain)[5] == "completion_tokens"


def test_whole_prompt_logprobs_and_token_texts(tok):
    item = WorkItem([104, 105], {}, "r", True, 0)
    out = build_output(item, result(input_logprobs=[None, -2.0]), tok, return_text_in_logprobs=True)
    assert out["meta_info"]["input_token_logprobs"] == [[None, 104, "h"], [-2.0, 105, "i"]]
    assert out["meta_info"]["output_token_logprobs"][0] == [-0.5, 104, "h"]


def test_abort_in_waiting_queue_has_sglangs_short_shape(tok):
    reason = {"type": "abort", "message": "Abort in waiting queue"}
    out = build_output(WorkItem([1], {}, "r", True, -1),
                       result(output_ids=[], output_logprobs=[], finish_reason=reason, waiting_abort=True), tok)
    assert out["text"] == "" and out["output_ids"] == []
    assert list(out["meta_info"]) == ["id", "finish_reason", "weight_version", "input_token_logprobs",
                                      "output_token_logprobs", "completion_tokens", "e2e_latency"]
    assert out["meta_info"]["output_token_logprobs"] == [] and "prompt_tokens" not in out["meta_info"]


def test_json_is_compact_with_non_finite_floats_as_null():
    text = dumps({"a": [1.5, math.nan, -math.inf], "t": "é"}).decode()
    assert text == '{"a":[1.5,null,null],"t":"é"}'
    assert json.loads(text)["a"][1] is None


def params(tok, **sampling) -> GenParams:
    return GenParams.from_sampling(sampling, prompt_len=3, context_length=CONTEXT, eos_ids={tok.eos_token_id},
                                   tokenizer=tok)


def test_stop_rules_apply_in_sglang_order(tok):
    eos = tok.eos_token_id
    assert check_finished(params(tok, max_new_tokens=2), [5, eos], tok) == {"type": "length", "length": 2}
    assert check_finished(params(tok, max_new_tokens=5), [5, eos], tok) == {"type": "stop", "matched": eos}
    assert check_finished(params(tok, max_new_tokens=5, stop_token_ids=[7]), [7], tok) == {"type": "stop", "matched": 7}
    assert check_finished(params(tok, max_new_tokens=5, ignore_eos=True, stop_token_ids=[7]), [7, eos], tok) is None
    ids = tok.encode("xxEND")
    assert check_finished(params(tok, max_new_tokens=50, stop=["END"]), ids, tok) == {"type": "stop", "matched": "END"}
    assert check_finished(params(tok, max_new_tokens=50, stop="ZZ"), ids, tok) is None
    assert params(tok, max_new_tokens=None).max_new_tokens == CONTEXT - 3 - 1  # None: up to the context


def test_sampler_logprobs_are_taken_before_truncation():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    rows = [GenParams(max_new_tokens=4, temperature=0.0),
            GenParams(max_new_tokens=4, temperature=0.7, top_k=3, top_p=0.5, seed=1),
            GenParams(max_new_tokens=4, temperature=1.3, min_p=0.2, seed=2)]
    tokens, logprobs = BatchSampler(rows, 50).sample(logits, [0, 0, 0])
    assert tokens[0] == int(logits[0].argmax())
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[tokens[0]]), abs=1e-6)
    assert tokens[1] in logits[1].topk(3).indices.tolist()
    for row, temp in ((1, 0.7), (2, 1.3)):
        expected = float(torch.log_softmax(logits[row] / temp, -1)[tokens[row]])
        assert logprobs[row] == pytest.approx(expected, abs=1e-6)


def test_sampler_is_reproducible_per_seed_and_top_k_one_is_greedy():
    logits = torch.randn(4, 30)

    def draw(seed, top_k=-1):
        sampler = BatchSampler([GenParams(max_new_tokens=8, temperature=1.0, top_k=top_k, seed=seed)] * 4, 30)
        return [sampler.sample(logits, [0] * 4)[0] for _ in range(5)]

    assert draw(11) == draw(11)
    assert draw(11) != draw(12)
    assert all(step == logits.argmax(-1).tolist() for step in draw(3, top_k=1))
