"""A request body read on a thread as it arrives: a reader's failure stops the reading at once,
a reader that ends early still lets the whole body be taken, and a refusal on the way in ends
the reader before it is raised."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import BinaryIO

import pytest

from gpulayer.control.body_pipe import BodyCut, read_body_on_a_thread

CHUNK = b"x" * 64 * 1024


class Body:
    """A body of ``count`` chunks that records how many were taken from it."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.taken += 1
            yield CHUNK
            await asyncio.sleep(0)  # a body arrives over time, not in one go


class Refused(Exception):
    pass


def test_a_failing_reader_stops_the_body_being_read() -> None:
    body = Body(1000)

    def reader(upload: BinaryIO) -> None:
        upload.read(10)
        raise Refused("over a limit")

    with pytest.raises(Refused, match="over a limit"):
        asyncio.run(read_body_on_a_thread(body, reader))
    assert body.taken < 100, body.taken  # the pipe holds 16 chunks; nothing read on past them


def test_a_reader_that_reads_all_sees_every_byte() -> None:
    body = Body(200)

    def reader(upload: BinaryIO) -> int:
        total = 0
        while piece := upload.read(10_000):
            total += len(piece)
        return total

    assert asyncio.run(read_body_on_a_thread(body, reader)) == 200 * len(CHUNK)


def test_a_reader_that_ends_early_still_has_the_body_taken_whole() -> None:
    body = Body(200)
    assert asyncio.run(read_body_on_a_thread(body, lambda upload: upload.read(5))) == b"xxxxx"
    assert body.taken == 200


def test_a_refusal_on_the_way_in_cuts_the_reader_before_it_is_raised() -> None:
    body = Body(1000)
    seen: list[BaseException] = []

    def reader(upload: BinaryIO) -> None:
        try:
            while upload.read(10_000):
                pass
        except BodyCut as exc:
            seen.append(exc)
            raise

    def over(received: int) -> None:
        if received > 10 * len(CHUNK):
            raise Refused("too big")

    with pytest.raises(Refused):
        asyncio.run(read_body_on_a_thread(body, reader, on_received=over))
    assert len(seen) == 1  # the reader was told and had ended when the refusal came out
    assert body.taken == 11
