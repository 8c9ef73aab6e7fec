"""A TCP proxy with faults, between Kafka clients and one broker listener (issue 37's network faults).

The broker advertises the proxy's port on a listener of its own (scripts/broker.sh ``WEIR_KAFKA_PROXY_PORT``), so
the clients that bootstrap through the proxy (the workers) reach the broker only through it, while the others (the
test's screens and audit) use the broker's own port. Faults, any time, from any thread:

- ``latency_ms``: every chunk, either way, waits that long before it is forwarded;
- :meth:`cut`: every open connection is closed at once (both sides see a reset connection);
- :meth:`partition`: nothing is forwarded either way and new connections hang, as when the network drops every
  packet; :meth:`heal` ends it (what was held goes on, as TCP retransmits).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field


@dataclass
class FaultProxy:
    listen_port: int
    target_port: int
    latency_ms: float = 0.0
    #: connections accepted, and connections cut, since the start
    accepted: int = 0
    cuts: int = 0
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _server: asyncio.base_events.Server | None = field(default=None, repr=False)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set, repr=False)
    _open: asyncio.Event | None = field(default=None, repr=False)

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._open = asyncio.Event()
            self._open.set()
            self._server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.listen_port))
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close() -> None:
            assert self._server is not None
            self._server.close()
            self._close_all()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def cut(self) -> None:
        """Close every open connection (the clients reconnect through the proxy)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._close_all)

    def partition(self) -> None:
        assert self._loop is not None
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        assert self._loop is not None
        assert self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)

    def _close_all(self) -> None:
        if self._writers:
            self.cuts += 1
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        self.accepted += 1
        await self._open.wait()  # a partition: the connection hangs
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, broker_writer))
        await asyncio.gather(self._pipe(client_reader, broker_writer), self._pipe(broker_reader, client_writer), return_exceptions=True)
        for writer in (client_writer, broker_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        try:
            while data := await reader.read(65536):
                await self._open.wait()
                if self.latency_ms:
                    await asyncio.sleep(self.latency_ms / 1000)
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()
