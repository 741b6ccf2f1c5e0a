"""The supervisor's wire format without `json`: requests are length-prefixed marshal frames from the
host; answers are JSON text written by `to_json`, which the host parses with the real `json`."""

from __future__ import annotations

import io
import json
import marshal

from agentrl_cli.envs.sandbox.supervisor import read_request, to_json


def test_answers_round_trip_through_json_whatever_the_command_printed():
    tricky = 'quote " backslash \\ tab \t newline \n nul \x00 bell \x07 unit-sep \x1f del \x7f é 漢 😀 </script>'
    resp = {"id": 3, "exit_code": 0, "signal": None, "stdout": tricky, "stderr": "", "truncated": False, "timed_out": True,
            "duration_s": 0.012345, "cpu_s": 0.0, "max_rss_kb": 1024, "error": None, "list": [1, "a", None, 2.5]}
    assert json.loads(to_json(resp)) == resp


def test_non_finite_floats_become_null_and_unknown_types_their_text():
    assert json.loads(to_json({"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": b"x"})) == \
        {"a": None, "b": None, "c": None, "d": "b'x'"}


def test_requests_are_length_prefixed_marshal_frames():
    frames = b""
    for req in ({"id": 1, "op": "ping"}, {"id": 2, "op": "exec", "argv": ["/bin/true"], "env": {"A": "1"}, "address_space": None}):
        payload = marshal.dumps(req)
        frames += b"%d\n" % len(payload) + payload
    stream = io.BytesIO(frames + b"5\nxxxxx" + b"oops\n")
    assert read_request(stream) == {"id": 1, "op": "ping"}
    assert read_request(stream)["argv"] == ["/bin/true"]
    assert read_request(stream) == {}  # not marshal: an empty request, answered with an error
    assert read_request(stream) == {}  # not a length
    assert read_request(stream) is None  # end of input
