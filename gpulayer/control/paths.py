"""Where gpulayer keeps its state on this machine. GPULAYER_HOME moves all of it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HomeLayout:
    root: Path

    @property
    def database(self) -> Path:
        return self.root / "state.db"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def server_file(self) -> Path:
        """Address of the running local control plane, written once it listens."""
        return self.root / "server.json"

    @property
    def daemon_lock(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{attempt}"

    def outputs_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "outputs"

    def bundle_file(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "source.tar.gz"

    def ensure(self) -> HomeLayout:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self


def home() -> HomeLayout:
    configured = os.environ.get("GPULAYER_HOME")
    if configured:
        return HomeLayout(Path(configured).expanduser())
    from platformdirs import user_data_dir

    return HomeLayout(Path(user_data_dir("gpulayer", appauthor=False)))
