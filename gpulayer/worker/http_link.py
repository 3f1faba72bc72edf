"""The worker protocol over HTTP: how a remote worker talks to its control plane."""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from gpulayer.errors import NotFoundError
from gpulayer.protocol.client import ControlClient
from gpulayer.protocol.messages import (
    Assignment,
    AttemptReport,
    HeartbeatReply,
    Registration,
    split_job_reference,
)


class HttpLink:
    def __init__(self, client: ControlClient) -> None:
        self.client = client

    def register(self, registration: Registration) -> str:
        """Register; every later call goes with the credential bound to this worker alone."""
        reply = self.client.request("POST", "/v1/workers", registration.model_dump(mode="json"))
        if reply.get("token"):
            self.client.use_token(str(reply["token"]))
        return str(reply["worker_id"])

    def heartbeat(self, worker_id: str, running: list[int]) -> HeartbeatReply:
        reply = self.client.request(
            "POST", f"/v1/workers/{worker_id}/heartbeat", {"running": running}
        )
        return HeartbeatReply.model_validate(reply)

    def claim(self, worker_id: str, wait: float) -> list[Assignment]:
        found = self.client.request(
            "POST", f"/v1/workers/{worker_id}/claim", params={"wait": wait}, timeout=wait + 30
        )
        return [Assignment.model_validate(item) for item in found]

    def append_logs(self, attempt_id: int, lines: list[tuple[str, str]]) -> None:
        self.client.request("POST", f"/v1/attempts/{attempt_id}/logs", {"lines": lines})

    def finish(self, attempt_id: int, report: AttemptReport) -> None:
        self.client.request(
            "POST", f"/v1/attempts/{attempt_id}/finish", report.model_dump(mode="json")
        )

    def fetch_bundle(self, job_id: str, destination: Path) -> None:
        self.client.download(f"/v1/jobs/{quote(job_id, safe='')}/bundle", destination)

    def store_outputs(self, attempt_id: int, files: list[tuple[str, Path]]) -> None:
        with tempfile.TemporaryDirectory(prefix="gpulayer-outputs-") as scratch:
            archive = Path(scratch) / "outputs.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                for relative, path in files:
                    tar.add(path, arcname=relative, recursive=False)
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
