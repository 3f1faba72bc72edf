"""A running job's rented machine, reached through an SSH session of the control plane's own
(made with the machine's key and pinned host key, as the worker's link is): its ports forwarded
to this machine's loopback (``ssh -L``, what `gpulayer attach` carries to the submitting shell),
and commands run in the job's folder and environment, as its user (`gpulayer exec`). One session
per machine, one listener per port, reused while the machine lives and closed with it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gpulayer.cloud.lifecycle.records import InstanceRecord

_CONNECT_SECONDS = 20.0
MAX_OUTPUT_CHARS = 1_000_000
"""What `exec` brings back of each stream; beyond it, the output is cut and says so."""

# Run on the job's machine by its login user: finds the job's first process (the one that
# carries GPULAYER_JOB_ID and is oldest), takes its folder, environment and user, and runs the
# command there as that user, so the command sees what the job sees.
_IN_THE_JOB = """
import json, os, sys
job, argv = sys.argv[1], json.loads(sys.argv[2])
mark = ("GPULAYER_JOB_ID=" + job).encode()
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = f.read().split(b"\\0")
        if mark in env:
            cwd, info = os.readlink("/proc/%s/cwd" % pid), os.stat("/proc/%s" % pid)
            break
    except OSError:
        continue
else:
    sys.exit("exec: no process of job %s runs on this machine" % job)
environ = dict(e.split(b"=", 1) for e in env if b"=" in e)
os.chdir(cwd)
if os.getuid() == 0 and info.st_uid != 0:
    os.setgroups([])
    os.setgid(info.st_gid)
    os.setuid(info.st_uid)
try:
    os.execvpe(argv[0], argv, environ)
except OSError as exc:
    sys.exit("exec: cannot run %r: %s" % (argv[0], exc.strerror))
"""


class JobMachines:
    def __init__(self, keys_dir: Path) -> None:
        self.keys_dir = keys_dir
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}
        self._forwards: dict[tuple[str, int], Any] = {}

    def forward(self, record: InstanceRecord, port: int) -> int:
        """The port of this machine's loopback that reaches ``port`` of ``record``'s machine."""
        from gpulayer.ssh.forward import LocalForward

        key = (record.request_id, port)
        with self._lock:
            found = self._forwards.get(key)
            session = self._sessions.get(record.request_id)
            if found is not None and session is not None and session.connected:
                return int(found.local_port)
        session = self._session(record)
        with self._lock:
            made = LocalForward(session, 0, port)
            self._forwards[key] = made
            return int(made.local_port)

    def run(
        self, record: InstanceRecord, job_id: str, argv: list[str], timeout: float
    ) -> tuple[int, str, str]:
        """Run ``argv`` on ``record``'s machine in job ``job_id``'s folder and environment, as
        its user: (exit code, stdout, stderr), each stream cut at MAX_OUTPUT_CHARS."""
        import json

        command = ["python3", "-c", _IN_THE_JOB, job_id, json.dumps(argv)]
        done = self._session(record).run(command, timeout=timeout)
        return done.exit_code, _cut(done.stdout), _cut(done.stderr)

    def _session(self, record: InstanceRecord) -> Any:
        from gpulayer.cloud.lifecycle.links import connect

        with self._lock:
            session = self._sessions.get(record.request_id)
            if session is None or not session.connected:
                session = connect(
                    record.machine or {},
                    Path(record.key_path or ""),
                    self.keys_dir,
                    record.request_id,
                    _CONNECT_SECONDS,
                )
                self._sessions[record.request_id] = session
            return session

    def keep_only(self, live: set[str]) -> None:
        """Close what reaches machines no longer in ``live`` (request ids)."""
        with self._lock:
            for key in [k for k in self._forwards if k[0] not in live]:
                self._forwards.pop(key).close()
            for request_id in [r for r in self._sessions if r not in live]:
                self._sessions.pop(request_id).close()

    def close(self) -> None:
        self.keep_only(set())


def _cut(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n[output cut at {MAX_OUTPUT_CHARS} characters]\n"

