"""A worker's claim long-poll: each look at the store on a worker thread, each wait on the
event loop, so idle workers hold none of the HTTP server's threads between their looks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from anyio import to_thread

if TYPE_CHECKING:
    from gpulayer.control.auth import Principal
    from gpulayer.control.worker_news import WorkerNews
    from gpulayer.protocol.messages import ClaimReply


class ClaimSource(Protocol):
    """What a poll needs of the control service (which calls this module itself)."""

    news: WorkerNews

    def claim_start(self, worker_id: str, caller: Principal | None) -> tuple[int, int]: ...

    def claim_now(
        self, worker_id: str, caller: Principal | None, epoch: int, *, with_cancels: bool
    ) -> ClaimReply: ...


async def claim_long_poll(
    service: ClaimSource,
    worker_id: str,
    wait: float,
    caller: Principal | None,
    *,
    with_cancels: bool,
) -> ClaimReply:
    """What ControlService.claim_or_signal answers, waiting up to ``wait`` seconds."""
    since, epoch = await to_thread.run_sync(service.claim_start, worker_id, caller)
    deadline = time.monotonic() + wait
    while True:
        reply = await to_thread.run_sync(
            lambda: service.claim_now(worker_id, caller, epoch, with_cancels=with_cancels)
        )
        left = deadline - time.monotonic()
        if reply.assignments or reply.cancel_attempts or left <= 0:
            return reply
        await service.news.async_wait(worker_id, since, left)
        since = service.news.count(worker_id)
