"""Claims: which launch request holds which host, as one file per host.

A claim is made by hard-linking a finished temporary file to ``<host>.json``: the link fails
when the name exists, so of two launches racing for one host exactly one wins, and a reader
never sees half a claim. The file records the request (id, job, owner, tags) and the instance
handed out, so describe, list_owned and terminate work from the files alone, even after the
host was removed from the settings.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.cloud import Instance, ProviderError
from gpulayer_ssh.errors import PROVIDER


@dataclass(frozen=True)
class Claim:
    host: str
    request_id: str
    job_id: str
    owner: str
    tags: dict[str, str]
    instance: Instance
    connection: dict[str, Any]
    """How to reach the host for cleanup: address, port, user, key_path, host_key,
    install_root, authorized_keys, region."""

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "request_id": self.request_id,
            "job_id": self.job_id,
            "owner": self.owner,
            "tags": self.tags,
            "instance": self.instance.model_dump(mode="json"),
            "connection": self.connection,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Claim:
        return cls(
            host=str(data["host"]),
            request_id=str(data["request_id"]),
            job_id=str(data["job_id"]),
            owner=str(data["owner"]),
            tags={str(k): str(v) for k, v in dict(data["tags"]).items()},
            instance=Instance.model_validate(data["instance"]),
            connection=dict(data["connection"]),
        )


class ClaimStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, host: str) -> Path:
        return self.directory / f"{host}.json"

    def create(self, claim: Claim) -> Claim:
        """Claim ``claim.host``; returns the claim that holds the host afterwards, which is
        another request's when that one was first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".claim-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(claim.to_json(), handle)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, self.path(claim.host))
            except FileExistsError:
                held = self.read(claim.host)
                if held is None:  # released between our link and our read: try once more
                    os.link(tmp, self.path(claim.host))
                    return claim
                return held
            return claim
        finally:
            Path(tmp).unlink(missing_ok=True)

    def read(self, host: str) -> Claim | None:
        path = self.path(host)
        try:
            return Claim.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ProviderError(
                f"claim file {path} is unreadable: {exc}", provider=PROVIDER
            ) from exc

    def all(self) -> list[Claim]:
        if not self.directory.is_dir():
            return []
        claims = []
        for path in sorted(self.directory.glob("*.json")):
            claim = self.read(path.stem)
            if claim is not None:
                claims.append(claim)
        return claims

    def release(self, host: str, request_id: str) -> bool:
        """Free the host if ``request_id`` holds it; True when a claim was removed."""
        held = self.read(host)
        if held is None or held.request_id != request_id:
            return False
        self.path(host).unlink(missing_ok=True)
        return True
