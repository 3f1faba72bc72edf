"""The schedule calls of the control plane's HTTP API, on a ControlClient's connection."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gpulayer.protocol.client import ControlClient


class ScheduleClient:
    def __init__(self, client: ControlClient) -> None:
        self.client = client

    def _path(self, name: str, action: str = "") -> str:
        return f"/v1/schedules/{quote(name, safe='')}{'/' + action if action else ''}"

    def apply(
        self,
        document: dict[str, Any],
        *,
        working_dir: str | None = None,
        source_dir: str | None = None,
        bundle_id: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "schedule": document,
            "working_dir": working_dir,
            "source_dir": source_dir,
            "bundle_id": bundle_id,
        }
        result: dict[str, Any] = self.client.request("POST", "/v1/schedules", body)
        return result

    def all(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.client.request("GET", "/v1/schedules")
        return result

    def show(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.client.request("GET", self._path(name))
        return result

    def runs(self, name: str, *, limit: int = 50) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.client.request(
            "GET", self._path(name, "runs"), params={"limit": limit}
        )
        return result

    def action(self, name: str, action: str) -> dict[str, Any]:
        """pause, resume or trigger."""
        result: dict[str, Any] = self.client.request("POST", self._path(name, action))
        return result

    def delete(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.client.request("DELETE", self._path(name))
        return result
