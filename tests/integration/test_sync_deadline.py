"""A weight sync to a server that accepts the connection and never answers fails within the client's
deadline (`inference.request_timeout_s`) with that server named, for the full (disk) and the adapter
(LoRA) transports."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

from agentrl_cli.engines.inference.client import InferenceClient, InferenceError
from agentrl_cli.weightsync.base import Prepared
from agentrl_cli.weightsync.disk import DiskTransport

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def silent_server():
    """A TCP server on 127.0.0.1 that reads requests and never writes a byte back."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def test_a_disk_sync_to_a_silent_server_fails_in_time_naming_it(tmp_path):
    async def go():
        async with silent_server() as url:
            client = InferenceClient([url], timeout_s=1.0, max_retries=0)
            try:
                with pytest.raises(InferenceError) as err:
                    await DiskTransport(client, tmp_path).publish(Prepared(version=1, payload=tmp_path / "v000001"))
            finally:
                await client.close()
            return url, err.value

    url, error = asyncio.run(go())
    assert url in error.message and "weight update" in error.message
    assert "Timeout" in error.message


def test_an_adapter_load_on_a_silent_server_fails_in_time_naming_it(tmp_path):
    async def go():
        async with silent_server() as url:
            client = InferenceClient([url], timeout_s=1.0, max_retries=0)
            try:
                with pytest.raises(InferenceError) as err:
                    await client.load_lora_adapter("policy-v000001", str(tmp_path))
            finally:
                await client.close()
            return url, err.value

    url, error = asyncio.run(go())
    assert url in error.message and "policy-v000001" in error.message
