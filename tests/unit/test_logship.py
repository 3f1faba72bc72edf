"""The worker's log shipper: bounded in bytes, it holds a fast producer back (backpressure)
rather than growing, and every line leaves once, in order, whatever the control plane does."""

from __future__ import annotations

import threading
import time

from gpulayer.worker.logship import LogShipper

LINE = "z" * 1023 + "\n"


def wait_until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_a_full_queue_holds_the_producer_back_until_batches_leave() -> None:
    control_plane_back = threading.Event()
    received: list[str] = []

    def send(batch: list[tuple[str, str]]) -> None:
        control_plane_back.wait()  # the control plane is away, then answers
        received.extend(text for _, text in batch)

    shipper = LogShipper(send, max_pending_bytes=64 * 1024, max_batch=16)
    shipper.start()
    added = 0
    highest = 0

    def produce() -> None:
        nonlocal added, highest
        for i in range(2000):  # 2 MB, thirty times the bound
            shipper.add("stdout", f"{i:06d}" + LINE)
            added += 1
            highest = max(highest, shipper.pending_bytes)

    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: added >= 60)
    time.sleep(0.3)  # room to overrun, were there no bound
    assert added <= 70, added  # held back at about 64 KiB of lines
    assert producer.is_alive()
    control_plane_back.set()
    producer.join(timeout=30)
    shipper.close()
    assert [int(t[:6]) for t in received] == list(range(2000))  # once each, in order
    assert highest <= 64 * 1024 + len(LINE) + 6


def test_lines_survive_failed_sends_and_leave_once_in_order() -> None:
    calls = 0
    received: list[str] = []

    def flaky(batch: list[tuple[str, str]]) -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise ConnectionError("control plane restarting")
        received.extend(text for _, text in batch)

    shipper = LogShipper(flaky, interval=0.01, max_batch=7)
    shipper.start()
    for i in range(100):
        shipper.add("stdout", f"{i}\n")
    shipper.close()
    assert received == [f"{i}\n" for i in range(100)]
    assert calls > 3


def test_close_gives_up_on_a_control_plane_that_never_answers() -> None:
    def dead(_batch: list[tuple[str, str]]) -> None:
        raise ConnectionError("gone")

    shipper = LogShipper(dead, interval=0.01, close_timeout=0.5)
    shipper.start()
    shipper.add("stdout", "lost\n")
    started = time.monotonic()
    shipper.close()
    assert time.monotonic() - started < 10
    assert shipper.pending_bytes == 0


def test_a_short_jobs_lines_wait_for_the_outcome_and_a_full_batch_does_not() -> None:
    held: list[str] = []
    live: list[str] = []
    full: list[str] = []
    patient = LogShipper(lambda b: held.extend(t for _, t in b), interval=0.01, first_delay=60)
    prompt = LogShipper(lambda b: live.extend(t for _, t in b), interval=0.01, first_delay=0)
    batched = LogShipper(
        lambda b: full.extend(t for _, t in b), interval=0.01, first_delay=60, max_batch=3
    )
    for shipper in (patient, prompt, batched):
        shipper.start()
    patient.add("system", "running true\n")
    prompt.add("system", "running true\n")
    for i in range(3):
        batched.add("stdout", f"{i}\n")
    wait_until(lambda: live and len(full) == 3)  # the others' loops have run meanwhile
    assert held == []
    assert patient.take(1 << 20) == [("system", "running true\n")]  # goes with the outcome
    for shipper in (patient, prompt, batched):
        shipper.close()
    assert held == []


def test_hurry_ends_the_first_wait() -> None:
    sent: list[str] = []
    shipper = LogShipper(lambda b: sent.extend(t for _, t in b), interval=0.01, first_delay=60)
    shipper.start()
    shipper.add("system", "[setup] installing torch\n")
    shipper.hurry()
    wait_until(lambda: sent == ["[setup] installing torch\n"])
    shipper.add("system", "[setup] done\n")
    wait_until(lambda: len(sent) == 2)  # at the usual pace from then on
    shipper.close()


def test_the_jobs_output_and_setup_lines_go_at_once_and_gpulayers_own_notes_wait() -> None:
    from gpulayer.worker.agent import _ship

    shippers = {}
    sent: dict[str, list[str]] = {}
    for name in ("output", "setup", "note"):
        box = sent.setdefault(name, [])
        shippers[name] = LogShipper(
            lambda b, box=box: box.extend(t for _, t in b), interval=0.01, first_delay=60
        )
        shippers[name].start()
    _ship(shippers["output"], "stdout", "epoch 1\n")
    _ship(shippers["setup"], "system", "[setup] installing torch\n")
    _ship(shippers["note"], "system", "running python train.py in /w\n")
    wait_until(lambda: sent["output"] and sent["setup"])
    assert sent["note"] == []
    for shipper in shippers.values():
        shipper.close()
    assert sent["note"] == ["running python train.py in /w\n"]  # on close, at the latest
