"""The environments submits hand over, kept in memory only (never the store): the submitting
shell's variables a local job starts from, the cloud credential variables a cloud job's
machine is rented and ended with (see gpulayer.cloud.credentials), and the values of a cloud
job's `secrets` (source env), which its worker on the rented machine is handed when it claims
the job, since that machine has none of the submitter's environment."""

from __future__ import annotations

from collections.abc import Callable

from gpulayer.errors import NotFoundError
from gpulayer.spec.models import JobSpec


class SubmitEnvironments:
    def __init__(self) -> None:
        self._client_env: dict[str, dict[str, str]] = {}
        self._cloud_env: dict[str, dict[str, str]] = {}
        self._secrets: dict[str, dict[str, str]] = {}

    def keep_client(self, job_id: str, environ: dict[str, str]) -> None:
        self._client_env[job_id] = dict(environ)

    def keep_cloud(self, job_id: str, variables: dict[str, str]) -> None:
        self._cloud_env[job_id] = variables

    def keep_secrets(self, job_id: str, spec: JobSpec, environ: dict[str, str]) -> None:
        """The values of the job's secrets that the submitting shell has, by the variable the
        worker reads each from (its ``key``)."""
        values = {s.key: environ[s.key] for s in spec.secrets if s.key and s.key in environ}
        if values:
            self._secrets[job_id] = values

    def secrets_for(self, job_id: str) -> dict[str, str]:
        return dict(self._secrets.get(job_id, {}))

    def job_environment(self, job_id: str) -> dict[str, str] | None:
        """The environment a local job starts from, if its submitter handed one over."""
        return self._client_env.get(job_id)

    def cloud_environment(self, job_id: str) -> dict[str, str] | None:
        """The cloud credential variables of the `submit` that sent the job, if it sent any."""
        return self._cloud_env.get(job_id)

    def forget(self, job_id: str) -> None:
        """The job ended (or was deleted): its submitter's environment is not needed again."""
        self._client_env.pop(job_id, None)

    def forget_cloud(self, job_id: str) -> None:
        self._cloud_env.pop(job_id, None)
        self._secrets.pop(job_id, None)

    def forget_cloud_environments(self, keep: set[str], is_terminal: Callable[[str], bool]) -> None:
        """Drop the cloud variables of ended jobs that hold no machine any more."""
        for job_id in {*self._cloud_env, *self._secrets}:
            if job_id in keep:
                continue
            try:
                ended = is_terminal(job_id)
            except NotFoundError:
                ended = True  # deleted
            if ended:
                self.forget_cloud(job_id)
