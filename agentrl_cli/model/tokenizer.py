"""A byte-level tokenizer as an ordinary Hugging Face fast tokenizer: 256 byte tokens, no merges,
and the chat-format tokens. `<tool_call>` and `</tool_call>` are added but not special, so they
survive `skip_special_tokens` in decoded text (as in Qwen-family tokenizers)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from agentrl_cli.model.chat_template import CHAT_TEMPLATE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"


def build_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: _byte_of(c)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None,
                                   additional_special_tokens=SPECIAL[1:2], clean_up_tokenization_spaces=False,
                                   model_max_length=2048)
    fast.add_tokens(PLAIN_ADDED)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


_BYTE_TO_CHAR: dict[int, str] | None = None


def _byte_of(ch: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's bytes_to_unicode, inverted)."""
    global _BYTE_TO_CHAR
    if _BYTE_TO_CHAR is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_TO_CHAR = {b: chr(c) for b, c in zip(bs, cs)}
    inverse = {c: b for b, c in _BYTE_TO_CHAR.items()}
    return inverse[ch]
