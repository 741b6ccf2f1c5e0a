"""Which images a Dockerfile builds FROM (`envs/images/dockerfile.external_froms`): the external
ones, in order, without `scratch` and earlier stages' names; and the build context's digest changes
with any file's bytes or mode."""

from __future__ import annotations

from agentrl_cli.envs.images.dockerfile import context_digest, external_froms


def test_external_froms_skip_scratch_and_earlier_stages_and_read_flags_and_continuations():
    text = ("FROM --platform=linux/amd64 golang:1.22 AS build\nRUN make\n"
            "from build as test\nFROM \\\n  python:3.12-slim\nCOPY --from=build /x /x\nFROM scratch\nFROM python:3.12-slim\n")
    assert external_froms(text) == ["golang:1.22", "python:3.12-slim"]


def test_the_context_digest_follows_every_files_bytes_and_mode(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM a\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("x")
    first = context_digest(tmp_path)
    assert context_digest(tmp_path) == first
    (tmp_path / "sub" / "f").chmod(0o755)
    second = context_digest(tmp_path)
    (tmp_path / "sub" / "f").write_text("y")
    assert len({first, second, context_digest(tmp_path)}) == 3
