"""The chat template of the built-in model (Jinja, as `tokenizer.chat_template`): system, user,
assistant and tool messages, tool specs listed compactly, assistant tool calls rendered in the
Hermes style that the harnesses parse:

    <|im_start|>assistant
    <tool_call>
    {"name": "run_shell", "arguments": {"command": "ls"}}
    </tool_call><|im_end|>

Tool results come back as a user turn wrapped in <tool_response> (the Qwen2.5 convention).
"""

CHAT_TEMPLATE = (
    "{% if messages and messages[0].role == 'system' %}{% set system = messages[0].content %}"
    "{% set rest = messages[1:] %}{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}{{ '\\n' }}# Tools{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{{ '\\n' }}- {{ f.name }}({{ (f.parameters.properties.keys() | list) | join(', ') }}): {{ f.description }}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% for m in rest %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content if m.content else '' }}"
    "{% if m.tool_calls %}{% for call in m.tool_calls %}{% set c = call.function if call.function is defined else call %}"
    "{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}<tool_call>\n{\"name\": \"{{ c.name }}\", \"arguments\": "
    "{{ c.arguments if c.arguments is string else (c.arguments | tojson) }}}\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
