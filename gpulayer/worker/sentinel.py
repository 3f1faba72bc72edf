"""Ends a worker's attempts once the worker is gone, however it went (kill -9 included).

The worker starts this process in a session of its own with a pipe on its stdin and never
writes to it; end of file means the worker has exited. Then every process of the worker's
attempts is ended (see :mod:`gpulayer.worker.containment`).

Run as ``python -m gpulayer.worker.sentinel KEY [CGROUP_DIR]``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the worker
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    key = argv[0]
    root = Path(argv[1]) if len(argv) > 1 else None
    while sys.stdin.buffer.read(4096):
        pass
    from gpulayer.worker.containment import end_all

    end_all(key, root, remove_root=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
