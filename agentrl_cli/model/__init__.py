"""The policy model: the built-in tiny model (byte-level BPE tokenizer, chat template with tool calls,
a small Llama-architecture network), importing other models (GGUF files, packages that ship one,
Hugging Face directories), a model's own chat conventions (template, tools, stop tokens, token-exact
turns) and resolving `model.path` to a Hugging Face model directory."""
