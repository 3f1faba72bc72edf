"""Google Cloud Storage on this machine: gcp-storage-emulator (from PyPI) as a process of its
own on loopback, in memory; google-cloud-storage reaches it through STORAGE_EMULATOR_HOST."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.servers import free_port

_READY_SECONDS = 30.0


@dataclass(frozen=True)
class GcsEmulator:
    url: str


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def gcs_emulator() -> Iterator[GcsEmulator]:
    port = free_port()
    program = shutil.which("gcp-storage-emulator")
    argv = [program] if program else [sys.executable, "-m", "gcp_storage_emulator"]
    process = subprocess.Popen(
        [*argv, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + _READY_SECONDS
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                error = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"gcp-storage-emulator did not start: {error[-2000:]}")
            time.sleep(0.05)
        yield GcsEmulator(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
