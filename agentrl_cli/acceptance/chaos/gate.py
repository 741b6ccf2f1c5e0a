"""A gate in front of a TCP service on 127.0.0.1: clients connect to the gate, which forwards to
the service. `close()` makes the service unreachable without touching its process (new connections
are refused, open ones reset), `open()` lets traffic through again on the same port.

The gate runs its own event loop in a thread: a client in the run's process may block that process's
loop on a synchronous call through the gate (the trajectory writer's S3 puts).
"""

from __future__ import annotations

import asyncio
import socket
import threading

CHUNK = 65536
CALL_TIMEOUT_S = 10.0


class Gate:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1", host: str = "127.0.0.1") -> None:
        self.target_host, self.target_port, self.host = target_host, target_port, host
        with socket.socket() as s:  # the gate's port, kept across close and open
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"gate-{self.port}", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.closed_times = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "Gate":
        self._thread.start()
        self.open()
        return self

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    def open(self) -> None:
        """Accept and forward connections again (a no-op when open)."""
        self._run(self._open())

    def close(self) -> None:
        """Refuse new connections and reset the open ones (a no-op when closed)."""
        self._run(self._close())

    def close_for(self, seconds: float, on_open=lambda: None) -> None:
        """Close now and open again after `seconds`, timed by the gate's own loop (a busy caller's loop
        does not stretch the outage); `on_open()` runs in the gate's thread once open."""
        self.close()

        async def reopen() -> None:
            await asyncio.sleep(seconds)
            await self._open()
            on_open()
        asyncio.run_coroutine_threadsafe(reopen(), self._loop)

    @property
    def is_open(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        if self._thread.is_alive():
            self.close()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CALL_TIMEOUT_S)

    async def _open(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)

    async def _close(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        self.closed_times += 1
        for writer in list(self._conns):
            writer.transport.abort()
        self._conns.clear()
        await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._conns.update(pair)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in pair:
                self._conns.discard(w)
                w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the reader's end, then half-close the writer."""
    while True:
        data = await reader.read(CHUNK)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof() and not writer.transport.is_closing():
        writer.write_eof()
