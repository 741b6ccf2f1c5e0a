"""The in-sandbox supervisor: runs as the sandbox's main process and executes commands on request.

It is started by the host inside bubblewrap (`python3 -I -S` on bytecode compiled from this file)
and runs one command per request; `supervisor.c` is the same supervisor compiled, which the host
runs instead where it has a C compiler (see `supervisors.py`). Standard library C modules only (no `json`, `selectors` or `signal`, whose imports pull in
`re` and `enum` and would more than double the start-up of every sandbox): requests come from the
trusted host as `marshal` frames, answers go back as one JSON line each, which the host parses with
`json` (the host never decodes anything else from inside the sandbox). Each command runs in its own
session with the per-command limits (CPU time, optional address space), a wall-clock deadline that
kills its whole process group, and an output cap with a truncation flag. The host enforces the same
deadline from outside and destroys the sandbox if the supervisor stops answering, so nothing here
needs to be trusted for isolation.

Request:  b"<length>\n" + marshal.dumps({"id": 1, "op": "exec", "argv": [...], "cwd": "/work",
          "env": {...}, "stdin": "...", "timeout": 30.0, "output_limit": 1048576, "cpu_time": 10,
          "address_space": None})   or   {"id": 2, "op": "ping"}
Response: {"id": 1, "exit_code": 0, "signal": null, "stdout": "...", "stderr": "...",
           "truncated": false, "timed_out": false, "duration_s": 0.01, "cpu_s": 0.0, "max_rss_kb": 0,
           "error": null}
"""

import _signal
import marshal
import os
import resource
import select
import sys
import time

READ_CHUNK = 65536
DRAIN_AFTER_EXIT_S = 0.05  # background children may keep pipes open: stop when quiet this long after exit
MAX_DRAIN_AFTER_EXIT_S = 1.0  # ... and in any case this long after exit


def _child(argv, cwd, env, cpu_time, address_space, fds):
    stdin_r, out_w, err_w = fds
    try:
        os.setsid()
        os.dup2(stdin_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        if cpu_time:
            resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_time), int(cpu_time) + 1))
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (int(address_space), int(address_space)))
        try:
            with open("/proc/self/oom_score_adj", "w") as f:  # the command, not the supervisor, dies first
                f.write("1000")
        except OSError:
            pass
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 - report and leave
        try:
            os.write(2, f"sandbox: cannot run {argv[0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)


def run_exec(req):
    argv = req.get("argv") or []
    if not argv or not all(isinstance(a, str) for a in argv):
        return {"error": "argv must be a non-empty list of strings"}
    timeout = float(req.get("timeout") or 30.0)
    limit = int(req.get("output_limit") or 1 << 20)
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    stdin_data = (req.get("stdin") or "").encode()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        for fd in (in_w, out_r, err_r):
            os.close(fd)
        _child(argv, req.get("cwd") or "/work", env, req.get("cpu_time"), req.get("address_space"), (in_r, out_w, err_w))
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    try:
        if stdin_data:
            os.set_blocking(in_w, False)
            try:
                os.write(in_w, stdin_data[:65536])
            except OSError:
                pass
    finally:
        os.close(in_w)
    buffers = {out_r: bytearray(), err_r: bytearray()}
    poll = select.poll()
    for fd in buffers:
        os.set_blocking(fd, False)
        poll.register(fd, select.POLLIN)
    open_fds = set(buffers)
    truncated = timed_out = False
    status = rusage = None
    deadline = t0 + timeout
    exited_at = None
    while open_fds:
        now = time.monotonic()
        if status is None:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            if done:
                status, rusage, exited_at = st, ru, now
        if status is None and now >= deadline:
            timed_out = True
            _kill_group(pid)
            break
        if exited_at is not None and now - exited_at > MAX_DRAIN_AFTER_EXIT_S:
            break
        wait = min(0.05, max(0.0, deadline - now)) if status is None else DRAIN_AFTER_EXIT_S
        events = poll.poll(wait * 1000)
        if not events and status is not None:
            break  # quiet after exit: only background children still hold the pipes
        for fd, _ in events:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                poll.unregister(fd)
                open_fds.discard(fd)
                continue
            room = limit - len(buffers[out_r]) - len(buffers[err_r])
            buffers[fd] += chunk[:max(room, 0)]
            if len(chunk) > room:
                truncated = True
                _kill_group(pid)
                open_fds.clear()
                break
    for fd in buffers:
        os.close(fd)
    for _ in range(50 if not (timed_out or truncated) else 0):  # pipes closed: it is exiting, do not kill it
        if status is not None:
            break
        done, st, ru = os.wait4(pid, os.WNOHANG)
        if done:
            status, rusage = st, ru
        else:
            time.sleep(0.001)
    if status is None:
        _kill_group(pid)
        _, status, rusage = os.wait4(pid, 0)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + (sig or 0),
        "signal": sig,
        "stdout": buffers[out_r].decode("utf-8", "replace"),
        "stderr": buffers[err_r].decode("utf-8", "replace"),
        "truncated": truncated,
        "timed_out": timed_out,
        "duration_s": round(time.monotonic() - t0, 6),
        "cpu_s": round(rusage.ru_utime + rusage.ru_stime, 6) if rusage else 0.0,
        "max_rss_kb": rusage.ru_maxrss if rusage else 0,
        "error": None,
    }


def _kill_group(pid):
    try:
        os.killpg(pid, _signal.SIGKILL)
    except OSError:
        pass


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)} | {ord('"'): '\\"', ord("\\"): "\\\\"}


def to_json(value) -> str:
    """JSON text of None, bool, int, float, str, list and dict (the answers' only types)."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "null"
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, dict):
        return "{" + ",".join(to_json(str(k)) + ":" + to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return to_json(str(value))


def read_request(stream):
    """The next request, {} for a malformed one, None at the end of input."""
    header = stream.readline()
    if not header:
        return None
    try:
        payload = stream.read(int(header))
        req = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return {}
    return req if isinstance(req, dict) else {}


def not_dumpable():
    """prctl(PR_SET_DUMPABLE, 0): commands cannot open our /proc fds. Called through `_ctypes`
    itself: the `ctypes` package would add 3 ms to every sandbox's start."""
    import _ctypes

    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL
        _restype_ = Int

    return Function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))(4, 0, 0, 0, 0)


def main():
    try:
        not_dumpable()
    except Exception:  # noqa: BLE001
        pass
    _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
    out = sys.stdout.buffer

    def answer(resp):
        out.write(to_json(resp).encode("utf-8", "backslashreplace") + b"\n")
        out.flush()

    answer({"ready": True, "pid": os.getpid()})
    stream = sys.stdin.buffer
    while True:
        req = read_request(stream)
        if req is None:
            return
        op = req.get("op")
        if op == "exec":
            resp = run_exec(req)
        elif op == "ping":
            resp = {"pong": True}
        else:
            resp = {"error": f"bad request: unknown op {op!r}"}
        resp["id"] = req.get("id")
        answer(resp)


if __name__ == "__main__":
    main()
