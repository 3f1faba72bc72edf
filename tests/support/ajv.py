"""ajv (JavaScript, Draft 2020-12 with ajv-formats) as one long-lived node process that
validates documents a line at a time against one schema: tests/support/ajv_lines.js."""

from __future__ import annotations

import json
import selectors
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".ci" / "js" / "node_modules"
SCRIPT = Path(__file__).with_name("ajv_lines.js")
INSTALL_HINT = "npm ci --prefix .ci/js (.ci/install runs it)"


class AjvUnavailable(RuntimeError):
    """node is there but ajv is not installed, or it would not start."""


class Ajv:
    def __init__(self, schema: dict[str, Any], node: str, timeout: float = 30.0) -> None:
        if not (NODE_MODULES / "ajv").is_dir() or not (NODE_MODULES / "ajv-formats").is_dir():
            raise AjvUnavailable(f"ajv is not installed under {NODE_MODULES}: {INSTALL_HINT}")
        self.timeout = timeout
        self.process = subprocess.Popen(
            [node, str(SCRIPT), str(NODE_MODULES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        first = self._ask(schema)
        if not first.get("ready"):
            raise AjvUnavailable(f"ajv refused the schema: {first.get('schema_error', first)}")

    def _ask(self, document: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(document) + "\n")
        self.process.stdin.flush()
        if not self._selector.select(self.timeout):
            raise AjvUnavailable(f"ajv gave no answer in {self.timeout:.0f} s")
        line = self.process.stdout.readline()
        if not line:
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AjvUnavailable(f"ajv's node process ended: {stderr[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def errors(self, document: Any) -> list[str]:
        """What ajv finds wrong with ``document`` (empty: valid)."""
        answer = self._ask(document)
        return [] if answer["valid"] else list(answer["errors"]) or ["invalid"]

    def close(self) -> None:
        self._selector.close()
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def node_binary() -> str | None:
    return shutil.which("node")
