"""Inference engines and what speaks to them. The seam: `engine.py` (the `InferenceEngine` Protocol
everything else asks), `registry.py` (`inference.engine` -> class), one module per engine
(`embedded.py`, `sglang.py`) and SGLang's wire format they share (`sglang_dialect.py`; requests and
answers in `generation.py`). Beside it: the client (retries, rotation, resume), the launcher, the
embedded engine's server (`inference/`), the OpenAI-compatible layer, the recording gateway, the
partial-generation resume and the distributed weight group. Adding an engine: docs/engines.md."""
