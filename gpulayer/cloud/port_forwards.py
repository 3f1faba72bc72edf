"""A rented machine's ports, forwarded to this machine's loopback (``ssh -L``) through an SSH
session of the control plane's own to the machine, made with the machine's key as the worker's
link is: what `gpulayer attach` carries to the submitting shell. One session per machine, one
listener per port, reused while the machine lives and closed with it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gpulayer.cloud.lifecycle.records import InstanceRecord

_CONNECT_SECONDS = 20.0


class PortForwards:
    def __init__(self, keys_dir: Path) -> None:
        self.keys_dir = keys_dir
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}
        self._forwards: dict[tuple[str, int], Any] = {}

    def forward(self, record: InstanceRecord, port: int) -> int:
        """The port of this machine's loopback that reaches ``port`` of ``record``'s machine."""
        from gpulayer.cloud.lifecycle.links import connect
        from gpulayer.ssh.forward import LocalForward

        key = (record.request_id, port)
        with self._lock:
            found = self._forwards.get(key)
            session = self._sessions.get(record.request_id)
            if found is not None and session is not None and session.connected:
                return int(found.local_port)
            if session is None or not session.connected:
                session = connect(
                    record.machine or {},
                    Path(record.key_path or ""),
                    self.keys_dir,
                    record.request_id,
                    _CONNECT_SECONDS,
                )
                self._sessions[record.request_id] = session
            made = LocalForward(session, 0, port)
            self._forwards[key] = made
            return int(made.local_port)

    def keep_only(self, live: set[str]) -> None:
        """Close what reaches machines no longer in ``live`` (request ids)."""
        with self._lock:
            for key in [k for k in self._forwards if k[0] not in live]:
                self._forwards.pop(key).close()
            for request_id in [r for r in self._sessions if r not in live]:
                self._sessions.pop(request_id).close()

    def close(self) -> None:
        self.keep_only(set())
