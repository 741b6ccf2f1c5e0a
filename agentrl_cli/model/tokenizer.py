"""The built-in model's tokenizer, an ordinary Hugging Face fast tokenizer: byte-level BPE over
pieces split so that what an agent copies stays one token wherever it appears.

Pre-tokenization splits text into numbers of up to three digits (never with a space, so `67` in a
tool's output and in `ANSWER: 67` is the same token), words with an optional leading space,
punctuation runs that take one space on each side (`" + "`, `": "`) and single whitespace
characters. BPE merges inside those pieces come from `templates/tiny/tokenizer.json`, trained by
`train_tokenizer` on the warm-start harnesses' system prompts, tool specs and training-split
demonstrations plus every number from 0 to 999 (`python -m agentrl_cli.model.tokenizer`
regenerates it; a test keeps it in step). Any byte sequence still encodes: merges only shorten.
`<tool_call>` and `</tool_call>` are added but not special, so they survive `skip_special_tokens`
in decoded text (as in Qwen-family tokenizers). Ids 0..255 are the bytes in byte order.

Why not plain bytes (recipe 2 and before): copying a number or a word from the context is then a
one-token lookup; over single bytes the built-in model never learned it, and sequences are about
3.5 times longer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import templates
from agentrl_cli.model.chat_template import CHAT_TEMPLATE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
PIECES = r"\d{1,3}| ?[A-Za-z]+| ?[^\sA-Za-z\d]+ ?|\s"
VOCAB_SIZE = 2048
TOKENIZER_FILE = Path(templates.__file__).parent / "tiny" / "tokenizer.json"


def _pre_tokenizer():
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PIECES), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE fitted to `texts` and every number 0..999 (each of which becomes one token)."""
    tok = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    numbers = [" ".join(str(n) for n in range(1000))] * 8
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(numbers + list(texts), trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(tok.to_str())["model"]["merges"]]
    return _assemble(merges)


def _assemble(merges: list[tuple[str, str]]) -> Tokenizer:
    """The tokenizer with ids 0..255 the bytes in byte order (as a plain byte-level tokenizer has
    them), then one id per merge in merge order."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return tok


def build_tokenizer(path: Path = TOKENIZER_FILE) -> PreTrainedTokenizerFast:
    tok = Tokenizer.from_file(str(path))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None,
                                   additional_special_tokens=SPECIAL[1:2], clean_up_tokenization_spaces=False,
                                   model_max_length=2048)
    fast.add_tokens(PLAIN_ADDED)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def corpus() -> list[str]:
    """The text the tokenizer is fitted to: what the warm-start harnesses show and what their
    scripted solutions write, training split only (the held-out harness and the eval split stay unseen)."""
    from harnesses.oracle import oracle_action, terse_action
    from harnesses.registry import resolve
    from harnesses.tasks import load_tasks

    from agentrl_cli.model.recipe import WARM_START_HARNESSES

    texts = []
    for name in WARM_START_HARNESSES:
        harness = resolve(name)()
        try:
            texts.append(harness.system_prompt())
            texts += [f"- {t['function']['name']}: {t['function']['description']}" for t in harness.tools()]
            for task in load_tasks(name, "train"):
                texts += [task.prompt, *(task.meta.get("files") or {}).values()]
                for policy in (oracle_action, terse_action):
                    texts += [a for turn in range(2) if (a := policy(task, turn))]
        finally:
            harness.close()
    return texts


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


if __name__ == "__main__":
    TOKENIZER_FILE.parent.mkdir(parents=True, exist_ok=True)
    train_tokenizer(corpus()).save(str(TOKENIZER_FILE), pretty=False)
    print(f"wrote {TOKENIZER_FILE} ({build_tokenizer().vocab_size} tokens)")
