"""What a worker does when it loses its control plane for too long: the `--deadman-action`
value that the bootstrap plan writes and the worker reads, so both parse it one way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import UsageError


@dataclass(frozen=True)
class DeadmanAction:
    kind: str  # poweroff | stop | record
    record_path: Path | None = None

    @classmethod
    def parse(cls, text: str) -> DeadmanAction:
        if text in ("poweroff", "stop"):
            return cls(text)
        if text.startswith("record:") and len(text) > len("record:"):
            return cls("record", Path(text[len("record:") :]))
        raise UsageError(f"--deadman-action: expected poweroff, stop or record:PATH, not {text!r}")

    def describe(self) -> str:
        return "power off this machine" if self.kind == "poweroff" else "stop the worker"
