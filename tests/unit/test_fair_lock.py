"""The store's SQLite writer lock: reentrant, and taken in the order it was asked for."""

from __future__ import annotations

import threading

import pytest

from gpulayer.control.fair_lock import FairRLock


def wait_for_waiters(lock: FairRLock, count: int) -> None:
    done = threading.Event()
    for _ in range(2000):
        if lock.waiting >= count:
            return
        done.wait(0.005)
    raise AssertionError(f"{count} threads never queued for the lock")


def test_the_lock_goes_to_its_waiters_in_the_order_they_came() -> None:
    lock = FairRLock()
    order: list[int] = []
    lock.acquire()
    threads = []
    for n in range(12):
        thread = threading.Thread(target=lambda n=n: _take(lock, order, n))
        thread.start()
        threads.append(thread)
        wait_for_waiters(lock, n + 1)  # each queues before the next starts
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == list(range(12))


def _take(lock: FairRLock, order: list[int], n: int) -> None:
    with lock:
        order.append(n)


def test_a_newcomer_does_not_overtake_a_waiter() -> None:
    lock = FairRLock()
    got: list[str] = []
    lock.acquire()
    waiter = threading.Thread(target=lambda: _take_named(lock, got, "waiter"))
    waiter.start()
    wait_for_waiters(lock, 1)
    lock.release()
    # The lock was handed over on release: this thread now queues behind the waiter.
    with lock:
        got.append("releaser")
    waiter.join(timeout=10)
    assert got == ["waiter", "releaser"]


def _take_named(lock: FairRLock, got: list[str], name: str) -> None:
    with lock:
        got.append(name)


def test_the_owner_takes_it_again_without_waiting() -> None:
    lock = FairRLock()
    with lock, lock, lock:
        assert lock.waiting == 0
    # Released as often as taken: another thread gets it at once.
    taken = threading.Event()
    thread = threading.Thread(target=lambda: (lock.acquire(), taken.set(), lock.release()))
    thread.start()
    assert taken.wait(5)
    thread.join(timeout=5)


def test_only_the_owner_may_release() -> None:
    lock = FairRLock()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()
    lock.acquire()
    failed: list[BaseException] = []

    def release_from_elsewhere() -> None:
        try:
            lock.release()
        except RuntimeError as exc:
            failed.append(exc)

    thread = threading.Thread(target=release_from_elsewhere)
    thread.start()
    thread.join(timeout=5)
    assert len(failed) == 1
    lock.release()
