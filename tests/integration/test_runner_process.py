"""The pieces under JobRun: /proc parsing and tree membership (pure), secret masking, and the
output pump on real pipes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpulayer.procs import ProcStat, parse_stat
from gpulayer.worker.process import OutputPump, ProcessTree, Redactor, tree_members

# --- /proc/<pid>/stat -------------------------------------------------------------------------


def stat_line(
    pid: int, comm: str, state: str, ppid: int, pgrp: int, session: int, start: int
) -> str:
    middle = " ".join(["0"] * 15)  # tty_nr .. itrealvalue
    return f"{pid} ({comm}) {state} {ppid} {pgrp} {session} {middle} {start} 1000 20\n"


@pytest.mark.parametrize("comm", ["python", "my prog", "a) b (c", "))"])
def test_parse_stat_survives_odd_command_names(comm: str) -> None:
    stat = parse_stat(stat_line(42, comm, "S", 7, 40, 30, 123456))
    assert stat == ProcStat(pid=42, ppid=7, pgrp=40, session=30, state="S", start_time=123456)


def test_parse_stat_reads_this_process() -> None:
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    stat = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert (stat.pid, stat.ppid, stat.pgrp, stat.session) == (
        os.getpid(),
        os.getppid(),
        os.getpgrp(),
        os.getsid(0),
    )


def proc(
    pid: int, ppid: int, pgrp: int, session: int, state: str = "S", start: int = 1
) -> ProcStat:
    return ProcStat(pid, ppid, pgrp, session, state, start)


def test_tree_members() -> None:
    leader = 100
    table = [
        proc(1, 0, 1, 1),
        proc(100, 1, 100, 100),  # the leader
        proc(101, 100, 100, 100),  # its child
        proc(102, 101, 102, 100),  # own group, same session
        proc(103, 100, 103, 103, start=5),  # own session, found through its parent
        proc(104, 103, 103, 103),  # and that one's child
        proc(105, 100, 100, 100, state="Z"),  # a zombie is dead already
        proc(200, 1, 200, 200),  # unrelated
        proc(300, 1, 300, 300, start=9),  # once known, now orphaned in its own session
        proc(301, 1, 301, 301, start=2),  # a pid once known, now another process
    ]
    known = {300: 9, 301: 1}
    members = tree_members(table, leader, known)
    assert members == {101: 1, 102: 1, 103: 5, 104: 1, 300: 9}


# --- masking secrets --------------------------------------------------------------------------


def test_redact_masks_every_occurrence_longest_first() -> None:
    redactor = Redactor(["abcd1234", "abcd12345678", "xy"])
    assert redactor.redact("k=abcd12345678 k2=abcd1234, xy") == "k=*** k2=***, xy"


def test_multi_line_secret_is_masked_line_by_line() -> None:
    key = "-----BEGIN KEY-----\nMIIEvQIBADANBg\n-----END KEY-----"
    redactor = Redactor([key])
    assert redactor.redact("line: MIIEvQIBADANBg\n") == "line: ***\n"
    assert redactor.redact(key) == "***"


def test_unsafe_tail_holds_back_a_possible_secret_start() -> None:
    redactor = Redactor(["secretvalue"])
    assert redactor.unsafe_tail("token=secr") == len("secr")
    assert redactor.unsafe_tail("token=secretvalu") == len("secretvalu")
    assert redactor.unsafe_tail("token=x") == 0
    assert not Redactor(["abc", ""])  # too short to mask


# --- the output pump --------------------------------------------------------------------------


class Pipes:
    def __init__(self, secrets: tuple[str, ...] = (), **pump_args: float) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.seen = threading.Condition()
        out_r, self.out_w = os.pipe()
        err_r, self.err_w = os.pipe()
        self.pump = OutputPump(
            {"stdout": out_r, "stderr": err_r},
            self._sink,
            redactor=Redactor(secrets),
            **pump_args,  # type: ignore[arg-type]
        )
        self._read_ends = (out_r, err_r)
        self.pump.start()

    def _sink(self, stream: str, text: str) -> None:
        with self.seen:
            self.chunks.append((stream, text))
            self.seen.notify_all()

    def wait_for(self, count: int) -> None:
        with self.seen:
            assert self.seen.wait_for(lambda: len(self.chunks) >= count, timeout=60)

    def close(self) -> None:
        os.close(self.out_w)
        os.close(self.err_w)
        assert self.pump.finish(timeout=60)
        for fd in self._read_ends:
            os.close(fd)


def test_lines_split_across_writes_and_streams_kept_apart() -> None:
    pipes = Pipes()
    os.write(pipes.out_w, b"one\ntw")
    os.write(pipes.err_w, b"oops\n")
    os.write(pipes.out_w, b"o\nthree\n")
    pipes.close()
    assert [t for s, t in pipes.chunks if s == "stdout"] == ["one\n", "two\n", "three\n"]
    assert [t for s, t in pipes.chunks if s == "stderr"] == ["oops\n"]


def test_utf8_split_inside_a_character_and_invalid_bytes() -> None:
    pipes = Pipes()
    snowman = "☃".encode()
    os.write(pipes.out_w, b"a" + snowman[:1])
    os.write(pipes.out_w, snowman[1:] + b"\xff\n")
    pipes.close()
    assert pipes.chunks == [("stdout", "a☃\ufffd\n")]


def test_carriage_returns_do_not_end_lines() -> None:
    pipes = Pipes()
    os.write(pipes.out_w, b"10%\r50%\r100%\n")
    pipes.close()
    assert pipes.chunks == [("stdout", "10%\r50%\r100%\n")]


def test_partial_line_waits_for_a_pause_and_never_shows_half_a_secret() -> None:
    pipes = Pipes(secrets=("hunter2hunter2",), flush_after=0.05)
    os.write(pipes.out_w, b"password: hunter2")
    pipes.wait_for(1)  # the pause flushed what cannot be the start of the secret
    assert pipes.chunks == [("stdout", "password: ")]
    os.write(pipes.out_w, b"hunter2 ok\n")
    pipes.close()
    assert "".join(t for _, t in pipes.chunks) == "password: *** ok\n"


def test_unterminated_last_line_is_delivered_at_the_end() -> None:
    pipes = Pipes(flush_after=3600)
    os.write(pipes.out_w, b"no newline")
    pipes.close()
    assert pipes.chunks == [("stdout", "no newline")]


def test_overlong_unterminated_line_is_not_held_back() -> None:
    pipes = Pipes(flush_after=3600, max_line=10)
    os.write(pipes.out_w, b"x" * 25)
    pipes.wait_for(1)  # before the end, though no newline came and no pause counted
    pipes.close()
    assert "".join(t for _, t in pipes.chunks) == "x" * 25


def test_failing_sink_does_not_stop_draining() -> None:
    calls: list[str] = []

    def sink(stream: str, text: str) -> None:
        calls.append(text)
        raise RuntimeError("log store down")

    out_r, out_w = os.pipe()
    pump = OutputPump({"stdout": out_r}, sink)
    pump.start()
    os.write(out_w, b"a\nb\n" + b"c" * 200_000 + b"\n")  # more than a pipe holds
    os.close(out_w)
    assert pump.finish(timeout=60)
    os.close(out_r)
    assert calls[:2] == ["a\n", "b\n"] and len(calls) > 2


def test_finish_gives_up_on_a_pipe_someone_else_holds() -> None:
    out_r, out_w = os.pipe()
    pump = OutputPump({"stdout": out_r}, lambda s, t: None)
    pump.start()
    assert pump.finish(timeout=0.1) is False
    os.close(out_w)
    os.close(out_r)


# --- waiting for the leader -------------------------------------------------------------------


def _waited(tree: ProcessTree, wake_fd: int | None = None) -> threading.Thread:
    """A thread in tree.wait_exit with an hour's timeout: it ends only if something woke it."""
    waiter = threading.Thread(target=tree.wait_exit, args=(3600.0, wake_fd), daemon=True)
    waiter.start()
    return waiter


def test_the_leaders_exit_wakes_the_wait_at_once(tmp_path: Path) -> None:
    """Where the kernel tells a child's exit, the supervisor is woken by it, not by a poll
    (a 50 ms poll held every short job's slot that long)."""
    go = tmp_path / "go"
    script = 'while [ ! -e "$0" ]; do sleep 0.01; done; exit 3'
    tree = ProcessTree.spawn(["/bin/sh", "-c", script, str(go)], cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    if not tree.sees_exit:
        tree.terminate(5)
        tree.close()
        pytest.skip("this kernel has no pidfds: the wait polls")
    waiter = _waited(tree)
    assert tree.exited() is None and waiter.is_alive()
    go.touch()
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert tree.exited() == 3
    assert tree.close() == 3


def test_a_wake_descriptor_ends_the_wait_while_the_job_runs(tmp_path: Path) -> None:
    tree = ProcessTree.spawn(["sleep", "600"], cwd=tmp_path, env=dict(os.environ))
    wake_read, wake_write = os.pipe()
    try:
        waiter = _waited(tree, wake_read)
        os.write(wake_write, b"x")
        waiter.join(timeout=60)
        assert not waiter.is_alive()
        assert tree.exited() is None  # woken by the descriptor: the job runs on
    finally:
        tree.terminate(5)
        tree.close()
        os.close(wake_read)
        os.close(wake_write)
