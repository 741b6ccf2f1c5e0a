"""SGLang's HTTP protocol as the embedded server speaks it: validation of `/generate` and control
request bodies (pydantic models of the fields we support, SGLang's defaults and range rules, a
400 naming every field we do not support), and response shaping (finish_reason dicts, meta_info in
SGLang's key order, `[logprob, token_id, text|null]` triples, compact JSON with non-finite floats
written as null). No FastAPI and no engine here: `hf_server.py` wires this to `engine.py`.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError, model_validator

from agentrl_cli.engines.inference.sampling import context_error

Number = StrictFloat | StrictInt
UNSUPPORTED_SUFFIX = "is not supported by the embedded server"
# /generate fields SGLang has and we do not; a request setting one to a non-empty value gets a 400
UNSUPPORTED_TOP_LEVEL = ("image_data", "video_data", "audio_data", "input_embeds", "lora_id",
                         "custom_logit_processor", "return_hidden_states", "return_routed_experts", "session_params",
                         "token_ids_logprob", "bootstrap_host", "bootstrap_port", "bootstrap_room", "return_entropy",
                         "return_bytes", "background")
UNSUPPORTED_SAMPLING = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex", "custom_params", "logit_bias")
LOAD_FORMATS = (None, "auto", "safetensors", "pt")
EXPECTED = {"stop": "a string or a list of strings", "stop_token_ids": "a list of integer token ids",
            "rid": "a string or a list of strings", "sampling_params": "an object or a list of objects",
            "weight_version": "a string",
            "lora_path": "the name of a loaded LoRA adapter (POST /load_lora_adapter), null, or a list of those "
                         "(one per prompt)"}


class ProtocolError(ValueError):
    """A request the server refuses with HTTP 400; `str(exc)` is the message for the client."""


class SamplingParamsIn(BaseModel):
    """SGLang's SamplingParams fields and defaults; unknown keys are refused (SGLang answers 500)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _seed_alias(self) -> "SamplingParamsIn":
        if self.seed is not None:
            if self.sampling_seed is not None and self.sampling_seed != self.seed:
                raise ValueError("seed and sampling_seed disagree; give one of them")
            self.sampling_seed, self.seed = self.seed, None
        return self

    max_new_tokens: StrictInt | None = 128
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_new_tokens: StrictInt = 0
    n: StrictInt = 1
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    stream_interval: StrictInt | None = None
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = None  # accepted as an alias of sampling_seed (SGLang itself has no `seed` key)
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    structural_tag: Any = None
    stop_regex: Any = None
    custom_params: Any = None
    logit_bias: Any = None


class UpdateWeightsFromDiskIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: StrictStr
    load_format: StrictStr | None = None
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | StrictInt | None = None
    is_async: StrictBool = False
    torch_empty_cache: StrictBool = False
    keep_pause: StrictBool = False
    recapture_cuda_graph: StrictBool = False
    token_step: StrictInt = 0
    flush_cache: StrictBool = True


class UpdateWeightVersionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    new_version: StrictStr | StrictInt
    abort_all_requests: StrictBool = True


class LoadLoRAAdapterIn(BaseModel):
    """SGLang's LoadLoRAAdapterReqInput (`pinned` only places adapters in GPU slots: accepted, no effect here)."""

    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr
    lora_path: StrictStr
    pinned: StrictBool = False


class UnloadLoRAAdapterIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr


class PauseIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: Literal["abort", "retract", "in_place"] = "abort"


class AbortIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: StrictStr = ""
    abort_all: StrictBool = False


@dataclass
class WorkItem:
    """One sequence to generate: a prompt (and, with n > 1, one of its samples)."""

    input_ids: list[int]
    sampling: dict
    rid: str
    return_logprob: bool
    logprob_start_len: int
    lora_path: str | None = None  # the LoRA adapter that decodes it; None: the base weights


@dataclass
class ParsedGenerate:
    items: list[WorkItem]
    as_list: bool  # a batch or n > 1: the response is a JSON list
    return_text_in_logprobs: bool
    stream: bool = False  # one prompt, n = 1: answered as server-sent events (`stream_chunk`)


def describe_validation(exc: ValidationError, prefix: str = "") -> str:
    """One line per offending field, naming it the way the client wrote it."""
    seen, parts = set(), []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        if field in seen:
            continue
        seen.add(field)
        name = f"{prefix}{field}"
        if err["type"] == "extra_forbidden":
            parts.append(f"{name}: unknown key (SGLang has no such parameter)")
        elif err["type"] == "missing":
            parts.append(f"{name}: required field missing")
        else:
            expected = EXPECTED.get(field, err["msg"].lower().removeprefix("input should be "))
            parts.append(f"{name}: expected {expected}, got {err['input']!r}")
    return "; ".join(parts)


def parse_model(cls: type[BaseModel], body: Any, prefix: str = ""):
    if not isinstance(body, dict):
        raise ProtocolError(f"{prefix.rstrip('.') or 'the request body'} must be a JSON object")
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(describe_validation(exc, prefix)) from None


def _unset(value: Any) -> bool:
    if isinstance(value, list):
        return all(_unset(v) for v in value)
    return value is None or value is False or value == "" or value == {}


def _check_sampling(raw: Any, where: str) -> SamplingParamsIn:
    sp = parse_model(SamplingParamsIn, raw, f"{where}.")
    for key in UNSUPPORTED_SAMPLING:
        if not _unset(getattr(sp, key)):
            raise ProtocolError(f"{where}.{key} {UNSUPPORTED_SUFFIX}")
    rules = [
        (sp.max_new_tokens is None or sp.max_new_tokens > 0, "max_new_tokens must be a positive integer"),
        (all(math.isfinite(getattr(sp, k)) for k in ("temperature", "top_p", "min_p", "frequency_penalty",
                                                      "presence_penalty", "repetition_penalty")),
         "float parameters must be finite numbers"),
        (sp.temperature >= 0, "temperature must be non-negative"),
        (0 < sp.top_p <= 1, "top_p must be in (0, 1]"),
        (sp.top_k == -1 or sp.top_k >= 1, "top_k must be -1 (disable), or at least 1"),
        (0 <= sp.min_p <= 1, "min_p must be in [0, 1]"),
        (-2 <= sp.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
        (-2 <= sp.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
        (0 <= sp.repetition_penalty <= 2, "repetition_penalty must be in [0, 2]"),
        (sp.min_new_tokens >= 0 and (sp.max_new_tokens is None or sp.min_new_tokens <= sp.max_new_tokens),
         "min_new_tokens must be in [0, max_new_tokens]"),
        (sp.n >= 1, "n must be at least 1"),
        (not isinstance(sp.stop, list) or all(sp.stop), "stop must not contain empty strings"),
        (sp.stop != "", "stop must not be an empty string"),
    ]
    for ok, message in rules:
        if not ok:
            raise ProtocolError(f"{where}.{message}")
    if sp.repetition_penalty != 1.0:
        raise ProtocolError(f"{where}.repetition_penalty other than 1.0 {UNSUPPORTED_SUFFIX}")
    return sp


def _prompts(body: dict, tokenizer, vocab_size: int) -> tuple[list[list[int]], bool]:
    ids = body.get("input_ids")
    if ids is not None:
        is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
        if isinstance(ids, list) and ids and all(isinstance(p, list) for p in ids):
            prompts, batch = ids, True
        elif isinstance(ids, list):
            prompts, batch = [ids], False
        else:
            prompts, batch = None, False
        if prompts is None or not all(is_int(t) for p in prompts for t in p):
            raise ProtocolError("input_ids must be a list of integer token ids, or a list of such lists")
    elif body.get("text") is not None:
        text = body["text"]
        if isinstance(text, str):
            text, batch = [text], False
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            batch = True
        else:
            raise ProtocolError("text must be a string or a non-empty list of strings")
        prompts = [tokenizer.encode(t) for t in text]
    else:
        raise ProtocolError("Either text or input_ids should be provided.")
    for i, p in enumerate(prompts):
        where = f"input_ids[{i}]" if batch else "input_ids"
        if not p:
            raise ProtocolError(f"{where} is empty: give at least one token id")
        bad = next((t for t in p if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ProtocolError(f"{where} contains token id {bad}, outside the vocabulary (0..{vocab_size - 1})")
    return prompts, batch


def _per_prompt(body: dict, key: str, default: Any, count: int, batch: bool) -> list:
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, list) and (batch or key == "sampling_params" or key == "rid"):
        if len(value) != count:
            raise ProtocolError(f"{key} has {len(value)} entries but the batch has {count} prompts")
        return value
    return [value] * count


def parse_generate(body: Any, tokenizer, vocab_size: int, context_length: int) -> ParsedGenerate:
    """Validate a `/generate` body and expand it into work items (prompt-major, then samples)."""
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    for key in UNSUPPORTED_TOP_LEVEL:
        if not _unset(body.get(key)):
            raise ProtocolError(f"{key} {UNSUPPORTED_SUFFIX}")
    stream = body.get("stream")
    if stream not in (None, False, True):
        raise ProtocolError(f"stream: expected a boolean, got {stream!r}")
    top = body.get("top_logprobs_num")
    if any(v not in (None, 0) or isinstance(v, bool) for v in (top if isinstance(top, list) else [top])):
        raise ProtocolError(f"top_logprobs_num > 0 {UNSUPPORTED_SUFFIX}; use 0")
    text_in_lp = body.get("return_text_in_logprobs", False)
    if not isinstance(text_in_lp, bool):
        raise ProtocolError(f"return_text_in_logprobs: expected a boolean, got {text_in_lp!r}")
    prompts, batch = _prompts(body, tokenizer, vocab_size)
    count = len(prompts)
    samplings = _per_prompt(body, "sampling_params", {}, count, batch)
    rids = _per_prompt(body, "rid", None, count, batch)
    logprobs = _per_prompt(body, "return_logprob", False, count, batch)
    starts = _per_prompt(body, "logprob_start_len", -1, count, batch)
    loras = _loras(body.get("lora_path"), count)
    items, as_list = [], batch
    for i, (ids, raw, rid, want_lp, start, lora) in enumerate(zip(prompts, samplings, rids, logprobs, starts, loras)):
        where = f"sampling_params[{i}]" if batch else "sampling_params"
        sp = _check_sampling(raw, where)
        if not isinstance(want_lp, bool):
            raise ProtocolError(f"return_logprob: expected a boolean, got {want_lp!r}")
        if start not in (-1, 0) or isinstance(start, bool):
            raise ProtocolError(f"logprob_start_len={start!r} {UNSUPPORTED_SUFFIX}; use -1 (output only) or 0")
        if rid is not None and not isinstance(rid, str):
            raise ProtocolError(f"rid: expected {EXPECTED['rid']}, got {rid!r}")
        problem = context_error(len(ids), raw.get("max_new_tokens"), context_length)
        if problem:
            raise ProtocolError(problem)
        if rid is not None and batch and isinstance(body.get("rid"), str):
            rid = f"{rid}_{i}"
        sampling = sp.model_dump(exclude={"n", *UNSUPPORTED_SAMPLING})
        if "max_new_tokens" not in raw:
            sampling["max_new_tokens"] = 128
        as_list = as_list or sp.n > 1
        for k in range(sp.n):
            sample = dict(sampling)
            if sp.n > 1 and sp.sampling_seed is not None:
                sample["sampling_seed"] = sp.sampling_seed + k
            items.append(WorkItem(ids, sample, uuid.uuid4().hex if sp.n > 1 or rid is None else rid,
                                  want_lp, start, lora))
    if stream and (as_list or len(items) != 1):
        raise ProtocolError(f"stream=true with a batch or n > 1 {UNSUPPORTED_SUFFIX}; stream one prompt with n=1, or "
                            "send stream=false")
    return ParsedGenerate(items, as_list, text_in_lp, bool(stream))


def _loras(value: Any, count: int) -> list[str | None]:
    """`lora_path` per prompt: one name (or null) for every prompt, or a list with one per prompt
    (SGLang's form; a single prompt may send a one-element list)."""
    if isinstance(value, list):
        if len(value) != count:
            raise ProtocolError(f"lora_path has {len(value)} entries but the request has {count} prompt(s)")
        names = value
    else:
        names = [value] * count
    for name in names:
        if name == "" or (name is not None and not isinstance(name, str)):
            raise ProtocolError(f"lora_path: expected {EXPECTED['lora_path']}, got {value!r}")
    return names


def output_text(output_ids: list[int], finish_reason: dict | None, tokenizer, *, skip_special_tokens: bool = True,
                no_stop_trim: bool = False) -> str:
    """SGLang's `trim_matched_stop`: drop a matched stop token, cut before a matched stop string."""
    matched = (finish_reason or {}).get("matched")
    ids = output_ids
    if not no_stop_trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    if not no_stop_trim and isinstance(matched, str):
        pos = text.find(matched)
        text = text[:pos] if pos != -1 else text
    return text


def _triples(values: list, token_ids: list[int], tokenizer, with_text: bool) -> list[list]:
    texts = [tokenizer.decode([t]) for t in token_ids] if with_text else [None] * len(token_ids)
    return [[v, t, s] for v, t, s in zip(values, token_ids, texts)]


def build_output(item: WorkItem, result: dict, tokenizer, return_text_in_logprobs: bool = False) -> dict:
    """One `/generate` response object, keys in SGLang's order."""
    reason = result["finish_reason"]
    if result.get("waiting_abort"):
        meta = {"id": item.rid, "finish_reason": reason, "weight_version": result["weight_version"]}
        if item.return_logprob:
            meta.update(input_token_logprobs=[], output_token_logprobs=[])
        meta.update(completion_tokens=0, e2e_latency=result["e2e_latency"])
        return {"text": "", "output_ids": [], "meta_info": meta}
    ids = result["output_ids"]
    text = output_text(ids, reason, tokenizer, skip_special_tokens=item.sampling.get("skip_special_tokens", True),
                       no_stop_trim=item.sampling.get("no_stop_trim", False))
    meta = {"id": item.rid, "finish_reason": reason, "prompt_tokens": result["prompt_tokens"],
            "weight_version": result["weight_version"], "total_retractions": result["retractions"]}
    if item.return_logprob:
        prompt = item.input_ids
        if result.get("input_logprobs") is not None:
            inputs = _triples(result["input_logprobs"], prompt, tokenizer, return_text_in_logprobs)
        else:
            inputs = _triples([None], prompt[-1:], tokenizer, return_text_in_logprobs)
        meta["input_token_logprobs"] = inputs
        meta["output_token_logprobs"] = _triples(result["output_logprobs"], ids, tokenizer, return_text_in_logprobs)
    meta.update(completion_tokens=result["completion_tokens"], cached_tokens=result.get("cached_tokens", 0),
                e2e_latency=result["e2e_latency"],
                response_sent_to_client_ts=time.time())
    return {"text": text, "output_ids": ids, "meta_info": meta}


def stream_chunk(item: WorkItem, ids: list[int], logprobs: list[float], text: str, done: int, version: str,
                 result: dict | None, return_text_in_logprobs: bool, tokenizer) -> dict:
    """One `/generate` stream chunk as SGLang writes it with `--incremental-streaming-output`: the new
    ids, their text and log-prob triples; `completion_tokens` counts all so far; `finish_reason` is
    null until the last chunk (`result` given), which adds the final meta_info fields."""
    if result is not None and result.get("waiting_abort"):
        return build_output(item, result, tokenizer, return_text_in_logprobs)
    meta = {"id": item.rid, "finish_reason": None if result is None else result["finish_reason"],
            "prompt_tokens": len(item.input_ids), "weight_version": version,
            "total_retractions": 0 if result is None else result["retractions"]}
    if item.return_logprob:
        meta["output_token_logprobs"] = _triples(logprobs, ids, tokenizer, return_text_in_logprobs)
    meta.update(completion_tokens=done, cached_tokens=0 if result is None else result.get("cached_tokens", 0))
    if result is not None:
        meta.update(e2e_latency=result["e2e_latency"], response_sent_to_client_ts=time.time())
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def finite(obj: Any) -> Any:
    """Replace NaN and ±inf by None, recursively (JSON has no non-finite numbers)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any) -> bytes:
    """Compact JSON as SGLang writes it."""
    return json.dumps(finite(obj), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def error_body(message: str) -> dict:
    return {"error": {"message": message}}
