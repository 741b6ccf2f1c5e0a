"""The built-in model's warm-start recipe: which harnesses demonstrate, on how many practice tasks,
for how many SFT steps. Constants only, so the tokenizer, the builder and the tests share them."""

WARM_START_HARNESSES = ("terminal_like", "code_sandbox_like")  # tool_api_like stays unseen: the held-out harness
SFT_STEPS = 2000
PRACTICE_PER_FAMILY = 500  # practice tasks per family, the warm start's only demonstrations
