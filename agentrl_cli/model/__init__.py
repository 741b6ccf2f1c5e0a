"""The policy model: the built-in tiny model (byte-level BPE tokenizer, chat template with tool calls,
a small Llama-architecture network) and resolving `model.path` to a Hugging Face model directory."""
