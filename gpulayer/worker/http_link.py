"""The worker protocol over HTTP: how a remote worker talks to its control plane."""

from __future__ import annotations

import logging
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from gpulayer.errors import ForbiddenError, NotFoundError, StaleAttemptError
from gpulayer.protocol.client import ControlClient
from gpulayer.protocol.job_files import JobFileError, open_job_file, root_of
from gpulayer.protocol.messages import (
    Assignment,
    AttemptFinish,
    AttemptReport,
    ClaimReply,
    FinishBatch,
    FinishOutcome,
    FinishReply,
    HeartbeatReply,
    Registration,
    split_job_reference,
)
from gpulayer.worker.identity import WorkerIdentity, load_identity, save_identity

log = logging.getLogger("gpulayer.worker")

LEAVE_WAIT_SECONDS = 5.0
"""How long a stopping worker waits for the control plane to take its word that it leaves."""


def _add_job_file(tar: tarfile.TarFile, relative: str, path: Path) -> None:
    """One output into the archive, opened as a file the job wrote (no link followed, no
    special file read): it may have been swapped since the folder was walked."""
    try:
        with open_job_file(root_of(relative, path), relative) as (stream, info):
            entry = tarfile.TarInfo(relative)
            entry.size = info.st_size
            entry.mtime = int(info.st_mtime)
            entry.mode = 0o644
            tar.addfile(entry, stream)
    except JobFileError as exc:
        log.warning("outputs: skipped %s", exc)


class HttpLink:
    def __init__(self, client: ControlClient, *, identity_file: Path | None = None) -> None:
        self.client = client
        self.identity_file = identity_file
        self._batched_finish = True
        self._join_token = client.token

    def credentials(self) -> list[str]:
        """Every credential this link has called with: masked wherever a job's text goes."""
        return [self._join_token, self.client.token]

    def register(self, registration: Registration) -> str:
        """Register; every later call goes with the credential bound to this worker alone.
        With an identity saved from an earlier life, come back as that worker."""
        server = self.client.base_url.rstrip("/")
        saved = None if self.identity_file is None else load_identity(self.identity_file, server)
        if saved is not None:
            self.client.use_token(saved.token)
            registration = registration.model_copy(update={"worker_id": saved.worker_id})
        reply = self.client.request("POST", "/v1/workers", registration.model_dump(mode="json"))
        if reply.get("token"):
            self.client.use_token(str(reply["token"]))
            if self.identity_file is not None:
                identity = WorkerIdentity(server, str(reply["worker_id"]), str(reply["token"]))
                save_identity(self.identity_file, identity)
        return str(reply["worker_id"])

    def heartbeat(
        self, worker_id: str, running: list[int], degraded: str | None = None
    ) -> HeartbeatReply:
        body: dict[str, object] = {"running": running}
        if degraded is not None:
            body["degraded"] = degraded
        reply = self.client.request("POST", f"/v1/workers/{worker_id}/heartbeat", body)
        return HeartbeatReply.model_validate(reply)

    def leave(self, worker_id: str) -> None:
        path = f"/v1/workers/{worker_id}/leave"
        self.client.request("POST", path, timeout=LEAVE_WAIT_SECONDS)

    def claim(self, worker_id: str, wait: float) -> ClaimReply:
        found = self.client.request(
            "POST",
            f"/v1/workers/{worker_id}/claim",
            params={"wait": wait, "signals": 1},
            timeout=wait + 30,
        )
        if isinstance(found, list):
            # A control plane from before signals=1 answers with the assignments alone.
            return ClaimReply(assignments=[Assignment.model_validate(item) for item in found])
        return ClaimReply.model_validate(found)

    def append_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None:
        self.client.request("POST", f"/v1/attempts/{attempt_id}/logs", {"lines": lines})

    def finish(self, attempt_id: int, report: AttemptReport) -> None:
        self.client.request(
            "POST", f"/v1/attempts/{attempt_id}/finish", report.model_dump(mode="json")
        )

    def finish_many(
        self, worker_id: str, reports: Sequence[tuple[int, AttemptReport]]
    ) -> list[FinishOutcome]:
        if not self._batched_finish:
            return finish_one_by_one(self, reports)
        body = FinishBatch(
            reports=[AttemptFinish(attempt_id=a, report=r) for a, r in reports]
        ).model_dump(mode="json")
        try:
            reply = self.client.request("POST", f"/v1/workers/{worker_id}/finish", body)
        except NotFoundError:
            # A control plane from before batched reports has no such route.
            self._batched_finish = False
            return finish_one_by_one(self, reports)
        return FinishReply.model_validate(reply).results

    def fetch_bundle(self, job_id: str, destination: Path) -> None:
        self.client.download(f"/v1/jobs/{quote(job_id, safe='')}/bundle", destination)

    def store_outputs(self, attempt_id: int, files: list[tuple[str, Path]]) -> None:
        with tempfile.TemporaryDirectory(prefix="gpulayer-outputs-") as scratch:
            archive = Path(scratch) / "outputs.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                for relative, path in files:
                    _add_job_file(tar, relative, path)
            with archive.open("rb") as body:
                self.client.request(
                    "PUT", f"/v1/attempts/{attempt_id}/outputs", raw=body, timeout=600
                )

    def resolve_artifact(self, reference: str, scratch: Path) -> Path:
        """Download `job:<id>/<path>` (a file or a folder of outputs) into scratch."""
        job_ref, wanted = split_job_reference(reference)
        target = scratch / job_ref / wanted if wanted else scratch / job_ref
        found = False
        for entry in self.client.artifacts(job_ref):
            path = entry["path"]
            if wanted and path != wanted and not path.startswith(wanted + "/"):
                continue
            found = True
            self.client.download_artifact(job_ref, path, scratch / job_ref / path)
        if not found:
            raise NotFoundError(f"job {job_ref} has no output {wanted or '(none at all)'}")
        return target

    def job_environment(self, job_id: str) -> Mapping[str, str] | None:
        return None


def finish_one_by_one(
    link: HttpLink, reports: Sequence[tuple[int, AttemptReport]]
) -> list[FinishOutcome]:
    outcomes = []
    for attempt_id, report in reports:
        try:
            link.finish(attempt_id, report)
        except StaleAttemptError as exc:
            outcomes.append(FinishOutcome(attempt_id=attempt_id, outcome="stale", detail=str(exc)))
        except ForbiddenError as exc:
            outcomes.append(
                FinishOutcome(attempt_id=attempt_id, outcome="refused", detail=str(exc))
            )
        else:
            outcomes.append(FinishOutcome(attempt_id=attempt_id, outcome="recorded"))
    return outcomes
