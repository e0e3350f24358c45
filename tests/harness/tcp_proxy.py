"""A Kafka-aware TCP forwarder that holds back the broker's answers to chosen requests.

Requests (client -> broker) pass at once; each answer (broker -> client) to a request whose
API key is in ``delays`` (e.g. 26, EndTxn: a transaction's commit) is held for that many
seconds, in order with the answers behind it. So the request takes effect on the broker while
the client waits in vain for the answer: a ``commit_transaction`` that times out but committed.
The broker must advertise the proxy's port on a listener of its own
(``LocalKafka(extra_listeners=...)``) so a client that bootstraps through the proxy keeps every
connection on it. Written here: no library injects faults per Kafka request in-process. One
asyncio loop on a daemon thread; frames are split by Kafka's 4-byte size prefix, requests carry
(api key, version, correlation id), answers start with the correlation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from types import TracebackType

END_TXN = 26  # Kafka's API key of EndTxn (commit or abort a transaction)


class DelayingProxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.listen_port, self.target_port, self.host = listen_port, target_port, host
        self.delays: dict[int, float] = {}  # API key -> seconds; set from any thread
        self.held: dict[int, int] = {}  # API key -> answers held back so far
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delaying-proxy", daemon=True)

    def start(self) -> DelayingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"proxy on port {self.listen_port} did not start")
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> DelayingProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(
            asyncio.start_server(self._accept, self.host, self.listen_port))
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_w.close()
            return
        asked: dict[int, int] = {}  # correlation id -> API key, on this connection
        await asyncio.gather(self._requests(client_r, broker_w, asked),
                             self._answers(broker_r, client_w, asked),
                             return_exceptions=True)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        asked: dict[int, int]) -> None:
        try:
            async for frame in _frames(reader):
                api_key, _version, correlation = struct.unpack(">hhi", frame[4:12])
                asked[correlation] = api_key
                writer.write(frame)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       asked: dict[int, int]) -> None:
        try:
            async for frame in _frames(reader):
                (correlation,) = struct.unpack(">i", frame[4:8])
                api_key = asked.pop(correlation, -1)
                delay = self.delays.get(api_key, 0.0)
                if delay > 0:
                    self.held[api_key] = self.held.get(api_key, 0) + 1
                    await asyncio.sleep(delay)  # the answers behind it wait too, in order
                writer.write(frame)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError):
                writer.close()


class _frames:  # lower case: read like a function, `async for frame in _frames(reader)`
    """Size-prefixed Kafka frames (prefix included) until the connection closes."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _frames:
        return self

    async def __anext__(self) -> bytes:
        try:
            head = await self.reader.readexactly(4)
            (size,) = struct.unpack(">i", head)
            return head + await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            raise StopAsyncIteration from None

