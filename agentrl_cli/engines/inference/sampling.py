"""Per-request generation settings and the batched token sampler of the embedded engine.

`GenParams` turns a validated SGLang `sampling_params` dict into what decoding needs (greedy
detection, stop sets, the seed of the request's own `torch.Generator`). `BatchSampler` picks the
next token for every row of a batch and returns SGLang's log-probs: `log_softmax(logits / T)` of
the sampled token, after penalties and before top-k/top-p/min-p truncation (greedy: plain
`log_softmax`). `check_finished` applies SGLang's stopping rules in SGLang's order.

HTTP validation belongs in `protocol.py`; batching, the KV cache and scheduling in `batch.py` and
`engine.py`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from agentrl_cli.engines.inference import decode_kernels

GREEDY_BELOW = 1e-6  # SGLang: temperature < 1e-6 means greedy (top_k=1, temperature=1)


@dataclass(frozen=True)
class GenParams:
    """Normalised sampling settings of one request (SGLang names and defaults)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()  # stop_token_ids and EOS ids; empty when ignore_eos
    stop_str_max_tokens: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @classmethod
    def from_sampling(cls, sampling: dict, *, prompt_len: int, context_length: int, eos_ids: set[int],
                      tokenizer) -> "GenParams":
        """`sampling` uses SGLang's keys; missing keys take SGLang's defaults. `max_new_tokens=None`
        means "up to the context": the engine clamps it to `context_length - prompt_len - 1`."""
        limit = max(context_length - prompt_len - 1, 1)
        max_new = sampling.get("max_new_tokens", 128)
        max_new = limit if max_new is None else min(int(max_new), limit)
        stop = sampling.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
        stop_ids = set() if sampling.get("ignore_eos") else {*(sampling.get("stop_token_ids") or ()), *eos_ids}
        seed = sampling.get("sampling_seed")
        return cls(
            max_new_tokens=max_new,
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k", -1)),
            min_p=float(sampling.get("min_p", 0.0)),
            frequency_penalty=float(sampling.get("frequency_penalty", 0.0)),
            presence_penalty=float(sampling.get("presence_penalty", 0.0)),
            min_new_tokens=int(sampling.get("min_new_tokens", 0)),
            stop=stop,
            stop_ids=frozenset(stop_ids),
            stop_str_max_tokens=max((len(tokenizer.encode(s, add_special_tokens=False)) for s in stop), default=0),
            seed=secrets.randbits(63) if seed is None else int(seed),
        )


def check_finished(params: GenParams, output_ids: list[int], tokenizer) -> dict | None:
    """SGLang's `Req.check_finished`: length, then stop token ids / EOS, then stop strings."""
    if len(output_ids) >= params.max_new_tokens:
        return {"type": "length", "length": params.max_new_tokens}
    if output_ids[-1] in params.stop_ids:
        return {"type": "stop", "matched": output_ids[-1]}
    if params.stop:
        tail = tokenizer.decode(output_ids[-(params.stop_str_max_tokens + 1):])
        for s in params.stop:
            if s in tail:
                return {"type": "stop", "matched": s}
    return None


class BatchSampler:
    """Vectorised sampling for the rows of one batch; `select` keeps rows when others finish. Its
    tensors live on `device`, the logits' (each row's random stream stays on the CPU)."""

    def __init__(self, params: list[GenParams], vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.params = list(params)
        self.vocab = vocab_size
        self.device = device = torch.device(device)
        f = lambda name: torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=device)  # noqa: E731
        self.greedy = torch.tensor([p.greedy for p in params], device=device)
        self.temperature = torch.where(self.greedy, torch.ones(len(params), dtype=torch.float32, device=device), f("temperature"))
        self.top_p, self.min_p = f("top_p"), f("min_p")
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], device=device)
        self.freq, self.pres = f("frequency_penalty"), f("presence_penalty")
        self.penalised = bool((self.freq != 0).any() or (self.pres != 0).any())
        self.counts = torch.zeros((len(params), vocab_size), dtype=torch.float32, device=device) if self.penalised else None
        self.generators = [_Uniforms(p.seed) for p in params]
        # rows with no top-k / top-p / min-p truncation sample from the unsorted distribution
        self.plain = (self.top_k >= vocab_size) & (self.top_p >= 1.0) & (self.min_p <= 0.0)
        self.banned = torch.zeros((len(params), vocab_size), dtype=torch.bool, device=device)
        for i, p in enumerate(params):
            if p.min_new_tokens > 0:
                self.banned[i, [t for t in p.stop_ids if t < vocab_size]] = True

    def select(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.params = [self.params[i] for i in keep]
        self.generators = [self.generators[i] for i in keep]
        for name in ("greedy", "plain", "temperature", "top_p", "min_p", "top_k", "freq", "pres", "banned"):
            setattr(self, name, getattr(self, name)[idx])
        if self.counts is not None:
            self.counts = self.counts[idx]

    def extend(self, other: "BatchSampler") -> None:
        """Append the rows of `other` (requests joining a running batch)."""
        self.params += other.params
        self.generators += other.generators
        for name in ("greedy", "plain", "temperature", "top_p", "min_p", "top_k", "freq", "pres", "banned"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        if self.counts is not None or other.counts is not None:
            mine = self.counts if self.counts is not None else torch.zeros((len(self.params) - len(other.params), self.vocab),
                                                                           device=self.device)
            theirs = other.counts if other.counts is not None else torch.zeros((len(other.params), self.vocab), device=self.device)
            self.counts = torch.cat([mine, theirs])
            self.penalised = True

    def scaled_logits(self, logits: torch.Tensor, produced: list[int]) -> torch.Tensor:
        """Logits after penalties and min_new_tokens masking, divided by the temperature."""
        logits = logits.float()
        if self.counts is not None:
            logits = logits - self.freq[:, None] * self.counts - self.pres[:, None] * (self.counts > 0)
        early = torch.tensor([n < p.min_new_tokens for n, p in zip(produced, self.params)], device=logits.device)
        if early.any():
            logits = logits.masked_fill(self.banned & early[:, None], float("-inf"))
        return logits / self.temperature[:, None]

    def sample(self, logits: torch.Tensor, produced: list[int]) -> tuple[list[int], list[float]]:
        """Next token and its log-prob for each row; `produced[i]` = tokens row i has output so far.
        The log-prob is `scaled[token] - logsumexp(scaled)` (log_softmax at the one token: the full
        log-softmax, its clamp and the greedy argmax over every row were a third of a 64-row step's
        sampling), clamped at float32's lowest as SGLang's."""
        scaled = self.scaled_logits(logits, produced)
        native = self._native(scaled)
        if native is not None:
            tokens, logprobs = native
            if self.counts is not None:
                self.counts[torch.arange(len(tokens)), tokens] += 1
            return tokens.tolist(), logprobs.tolist()
        lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
        if bool(self.greedy.all()):
            tokens = scaled.argmax(dim=-1)
        else:
            tokens = self._draw(scaled, lse)
            if self.greedy.any():
                tokens = torch.where(self.greedy, scaled.argmax(dim=-1), tokens)
        if self.counts is not None:
            self.counts[torch.arange(len(tokens), device=tokens.device), tokens] += 1
        logprobs = (scaled.gather(1, tokens[:, None]) - lse).squeeze(1).clamp(min=torch.finfo(torch.float32).min)
        return tokens.tolist(), logprobs.tolist()

    def _native(self, scaled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(tokens, log-probs) from the native draw (`decode_kernels.sample_rows`: the same inverse-CDF
        draw and log-prob in three passes over each row) when every row samples without truncation
        from float32 logits on the CPU; None otherwise (then the tensor operations below)."""
        if (scaled.device.type != "cpu" or scaled.dtype != torch.float32 or bool(self.greedy.any())
                or not bool(self.plain.all())):
            return None
        lib = decode_kernels.kernel()
        if lib is None:
            return None
        u = torch.tensor([g.next() for g in self.generators], dtype=torch.float32)
        return decode_kernels.sample_rows(scaled.contiguous(), u, lib)

    def _draw(self, scaled: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF sampling for every row (greedy rows' draws are discarded by `sample`), one
        uniform per sampled row from the row's own seeded stream: over the plain distribution when the
        row truncates nothing, else over its top-k / top-p / min-p filtered one. Which path a row takes
        depends only on its own parameters, never on its batch-mates."""
        probs = scaled.sub(lse).exp_()  # one new [rows, vocab] tensor, reused by the CDF below
        u = torch.tensor([0.0 if p.greedy else g.next() for p, g in zip(self.params, self.generators)],
                         dtype=torch.float32, device=scaled.device)
        plain = self.plain | self.greedy  # a greedy row takes the cheap path; its draw is not used
        if bool(plain.all()):
            return self._inverse_cdf(probs, u)
        out = torch.empty(len(u), dtype=torch.long, device=scaled.device)
        cut = ~plain
        out[cut] = self._draw_truncated(probs[cut], cut.nonzero().flatten().tolist(), u[cut])
        if plain.any():
            out[plain] = self._inverse_cdf(probs[plain], u[plain])
        return out

    @staticmethod
    def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The first token whose cumulative probability passes `u` of the row's total (overwrites `probs`)."""
        cdf = torch.cumsum(probs, -1, out=probs)
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].contiguous(), right=True)
        return pick.clamp_(max=cdf.shape[-1] - 1).squeeze(1)

    def _draw_truncated(self, probs: torch.Tensor, rows: list[int], u: torch.Tensor) -> torch.Tensor:
        sorted_p, sorted_idx = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(sorted_p.shape[-1], device=sorted_p.device)[None, :]
        keep = ranks < self.top_k[rows][:, None]
        keep &= (sorted_p.cumsum(-1) - sorted_p) <= self.top_p[rows][:, None]
        keep &= sorted_p >= self.min_p[rows][:, None] * sorted_p[:, :1]
        keep[:, 0] = True
        cdf = (sorted_p * keep).cumsum(-1)
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].contiguous(), right=True)
        pick = torch.minimum(pick, keep.sum(-1, keepdim=True) - 1)
        return sorted_idx.gather(1, pick).squeeze(1)


class _Uniforms:
    """A request's own stream of uniform draws (seeded), drawn in chunks to keep per-step cost low."""

    CHUNK = 64

    def __init__(self, seed: int) -> None:
        self._gen = torch.Generator().manual_seed(seed)
        self._buf: list[float] = []
        self._pos = 0

    def next(self) -> float:
        if self._pos >= len(self._buf):
            self._buf, self._pos = torch.rand(self.CHUNK, generator=self._gen).tolist(), 0
        self._pos += 1
        return self._buf[self._pos - 1]


def prompt_logprobs(logits: torch.Tensor, input_ids: list[int], temperature: float) -> list[float | None]:
    """`input_token_logprobs` values for a whole prompt: null first, then log P(token | prefix).
    `logits` are the prefill logits of the prompt's own positions (no padding)."""
    scale = 1.0 if temperature < GREEDY_BELOW else temperature
    lp = torch.log_softmax(logits[:-1].float() / scale, dim=-1).clamp(min=torch.finfo(torch.float32).min)
    picked = lp.gather(1, torch.tensor(input_ids[1:], dtype=torch.long, device=lp.device)[:, None]).squeeze(1)
    return [None, *picked.tolist()]


def context_error(input_len: int, max_new_tokens: int | None, context_length: int) -> str | None:
    """SGLang's `_validate_one_request` messages for prompts that do not fit the context."""
    if input_len >= context_length:
        return f"The input ({input_len} tokens) is longer than the model's context length ({context_length} tokens)."
    if max_new_tokens is not None and input_len + max_new_tokens >= context_length:
        return (f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                f"You requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit.")
    return None
