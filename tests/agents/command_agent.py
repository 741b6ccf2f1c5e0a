"""An agent run as a command inside the sandbox: standard library only (the sandbox has the host's
/usr python3, not the run's virtualenv), speaking the OpenAI HTTP API at $OPENAI_BASE_URL with
$OPENAI_API_KEY, the task's prompt on stdin, the final answer on its last line of stdout.

With a port as its argument it first tries to reach 127.0.0.1:PORT directly (the inference server,
bypassing the gateway) and writes what happened to reach.txt, which the harness collects."""

import json
import os
import socket
import sys
import urllib.request


def chat(messages: list) -> str:
    body = json.dumps({"model": "policy", "messages": messages, "max_tokens": 12}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                     headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]["message"].get("content") or ""


if len(sys.argv) > 1:
    probe = socket.socket()
    probe.settimeout(2)
    try:
        probe.connect(("127.0.0.1", int(sys.argv[1])))
        reached = "reached"
    except OSError:
        reached = "unreachable"
    with open("reach.txt", "w") as f:
        f.write(f"{sys.argv[1]} {reached}\n")
task = json.loads(os.environ["AGENT_TASK"])
messages = [{"role": "user", "content": sys.stdin.read()}]
reply = chat(messages)
messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Your final answer, briefly:"}]
answer = chat(messages)
print(f"task {task['task_id']}:", file=sys.stderr)
print(answer.replace("\n", " "))
