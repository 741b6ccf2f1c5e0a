"""Inference engines and what speaks to them: the client (retries, rotation, resume), the launcher,
the embedded engine, the OpenAI-compatible layer, the recording gateway, the partial-generation
resume and the distributed weight group."""
