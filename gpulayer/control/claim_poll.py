"""A worker's claim: the one path every caller takes (the HTTP route, the local worker's
in-process link, tests), so each gets the same rules: the poll belongs to the worker's life
(epoch) that started it, and returns early with work or, when asked, with cancels it was not
told of yet.

The HTTP route awaits the poll: each look at the store on a worker thread, each wait on the
event loop, so idle workers hold none of the HTTP server's threads between their looks. A
caller with a thread of its own to block (the local link, tests) takes the same poll with
``claim_blocking``, which waits on that thread instead.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from anyio import to_thread

if TYPE_CHECKING:
    from gpulayer.control.auth import Principal
    from gpulayer.control.worker_news import WorkerNews
    from gpulayer.protocol.messages import ClaimReply


class ClaimSource(Protocol):
    """What a poll needs of the control service."""

    news: WorkerNews

    def claim_start(self, worker_id: str, caller: Principal | None) -> tuple[int, int]: ...

    def claim_now(
        self, worker_id: str, caller: Principal | None, epoch: int, *, with_cancels: bool
    ) -> ClaimReply: ...


class _Poll:
    """One poll's rules, apart from how it waits."""

    def __init__(self, service: ClaimSource, worker_id: str, wait: float) -> None:
        self.service = service
        self.worker_id = worker_id
        self.deadline = time.monotonic() + wait

    def answered(self, reply: ClaimReply) -> float | None:
        """None when ``reply`` is the answer; else how long to wait for news before looking
        again."""
        left = self.deadline - time.monotonic()
        if reply.assignments or reply.cancel_attempts or left <= 0:
            return None
        return left


async def claim_long_poll(
    service: ClaimSource,
    worker_id: str,
    wait: float,
    caller: Principal | None,
    *,
    with_cancels: bool,
) -> ClaimReply:
    """What waits for this worker's life, waiting up to ``wait`` seconds on the event loop."""
    since, epoch = await to_thread.run_sync(service.claim_start, worker_id, caller)
    poll = _Poll(service, worker_id, wait)
    while True:
        reply = await to_thread.run_sync(
            lambda: service.claim_now(worker_id, caller, epoch, with_cancels=with_cancels)
        )
        left = poll.answered(reply)
        if left is None:
            return reply
        await service.news.async_wait(worker_id, since, left)
        since = service.news.count(worker_id)


def claim_blocking(
    service: ClaimSource,
    worker_id: str,
    wait: float,
    caller: Principal | None = None,
    *,
    with_cancels: bool = False,
) -> ClaimReply:
    """claim_long_poll's answer, blocking this thread while it waits (``wait`` 0: one look)."""
    since, epoch = service.claim_start(worker_id, caller)
    poll = _Poll(service, worker_id, wait)
    while True:
        reply = service.claim_now(worker_id, caller, epoch, with_cancels=with_cancels)
        left = poll.answered(reply)
        if left is None:
            return reply
        service.news.wait(worker_id, since, left)
        since = service.news.count(worker_id)
