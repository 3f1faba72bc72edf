"""A request body handed, chunk by chunk as it arrives, to a blocking reader on its own thread.

A reader such as tarfile's stream mode wants a file to read from; a request body is an async
stream. The reader runs on a thread of its own (never the event loop's shared pool: a reader
waits on the body, and a pool full of waiting readers would starve the very calls that feed them)
and reads from a bounded buffer that the request handler fills. The handler stops reading the
body as soon as the reader has failed, so a refusal is answered before the rest of the body has
been read.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections import deque
from collections.abc import AsyncIterable, Callable
from contextlib import suppress
from typing import Any, BinaryIO, TypeVar, cast

T = TypeVar("T")

BUFFERED_BYTES = 1024 * 1024


class BodyCut(Exception):
    """The body stopped before its end (the client went away, or the handler gave up on it)."""


class BodyPipe(io.RawIOBase):
    """Chunks in from the event loop, a readable file out on the reader's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = BUFFERED_BYTES) -> None:
        super().__init__()
        self._loop = loop
        self._limit = limit
        self._state = threading.Condition()
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0
        self._ended = False
        self._cut = False
        self._reader_gone = False
        self._room = asyncio.Event()

    # --- the event loop's side --------------------------------------------------------------

    async def put(self, chunk: bytes) -> None:
        """Add a chunk, waiting while the buffer is full; dropped once the reader has stopped."""
        while True:
            with self._state:
                if self._reader_gone:
                    return
                if self._buffered < self._limit:
                    self._chunks.append(memoryview(chunk))
                    self._buffered += len(chunk)
                    self._state.notify_all()
                    return
                # Cleared under the lock: any read after this point sets it again.
                self._room.clear()
            await self._room.wait()

    def end(self) -> None:
        """The whole body is in: the reader sees the end of the file once it has read it."""
        with self._state:
            self._ended = True
            self._state.notify_all()

    def cut(self) -> None:
        """The body will not be finished: the reader's next read raises BodyCut."""
        with self._state:
            self._cut = True
            self._state.notify_all()

    # --- the reader's side ------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        with self._state:
            while not self._chunks and not self._ended and not self._cut:
                self._state.wait()
            if self._cut:
                raise BodyCut("the upload stopped before its end")
            if not self._chunks:
                return 0
            head = self._chunks[0]
            count = min(len(head), len(target))
            target[:count] = head[:count]
            if count == len(head):
                self._chunks.popleft()
            else:
                self._chunks[0] = head[count:]
            self._buffered -= count
        self._wake_writer()
        return count

    def reader_done(self) -> None:
        """The reader has stopped: whatever is still sent is dropped, never waited on."""
        with self._state:
            self._reader_gone = True
            self._chunks.clear()
            self._buffered = 0
        self._wake_writer()

    def _wake_writer(self) -> None:
        # The loop may be closed already when a server shuts down mid-upload.
        with suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._room.set)


async def read_body_on_a_thread(
    chunks: AsyncIterable[bytes],
    reader: Callable[[BinaryIO], T],
    *,
    on_received: Callable[[int], None] | None = None,
) -> T:
    """Run ``reader`` on its own thread over the body as it streams in; return what it returns.

    When the reader fails, the rest of the body is left unread and its error is raised here at
    once. When it ends well before the body does, the rest is read and dropped (the client
    expects its body taken). ``on_received`` sees the bytes received so far after each chunk and
    may refuse by raising.
    """
    loop = asyncio.get_running_loop()
    pipe = BodyPipe(loop)
    outcome: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if outcome.done():
            return
        if error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(cast(T, result))

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = reader(cast(BinaryIO, pipe))
        except BaseException as exc:  # handed to the handler, which raises it
            error = exc
        finally:
            pipe.reader_done()
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="upload-reader", daemon=True).start()
    try:
        received = 0
        async for chunk in chunks:
            if outcome.done() and outcome.exception() is not None:
                break
            received += len(chunk)
            if on_received is not None:
                on_received(received)
            await pipe.put(chunk)
        pipe.end()
    except BaseException:
        pipe.cut()
        await asyncio.wait([outcome])  # the reader has cleaned up before the refusal is answered
        if not outcome.cancelled():
            outcome.exception()  # seen: the handler's own error is the one that counts
        raise
    return await outcome
