"""How big a request body each route takes, and who must be known before any of it is read.

One table for every route, read by the HTTP edge (see edge.py) before the route runs: a body
is only ever read for a caller the edge has already recognised, and never past its route's cap.
JSON routes are buffered whole within their cap; uploads stream through with their own, larger
caps and are never held in memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MIB = 1024 * 1024

Gate = Literal["bearer", "session", "open"]
"""Who may send a body: ``bearer`` any valid token (the route then checks its kind), ``session``
a dashboard session cookie, ``open`` anyone (only the login form, whose body is the token)."""

DEFAULT_CAP = 1 * MIB
SUBMIT_CAP = 32 * MIB
"""A list of up to 10,000 jobs' specs in one submit."""
WORKER_REPORT_CAP = 64 * MIB
"""Log batches and attempt outcomes: a result may be 16 MiB of JSON, escaped on the way."""
BUNDLE_CAP = 1024 * MIB
"""A source bundle (at most 512 MiB of files, compressed, plus its archive's overhead)."""
LOGIN_CAP = 16 * 1024


class BodyTooLarge(Exception):
    """A body ran past its route's cap while it streamed in."""

    def __init__(self, rule: CapRule, method: str, path: str) -> None:
        super().__init__(refusal_line(rule, method, path))


@dataclass(frozen=True)
class CapRule:
    method: str
    pattern: str
    """The route's path as the README shows it; {name} is one path segment."""
    cap: int
    gate: Gate = "bearer"
    streamed: bool = False
    """An upload: counted as it streams to the route, never buffered by the edge."""

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and _compiled(self.pattern).fullmatch(path) is not None


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _PATTERNS.get(pattern)
    if found is None:
        found = re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(pattern)))
        _PATTERNS[pattern] = found
    return found


_PATTERNS: dict[str, re.Pattern[str]] = {}


def route_caps(output_cap: int) -> tuple[CapRule, ...]:
    """The table, first match wins; ``output_cap`` is the server's --max-output-bytes."""
    return (
        CapRule("PUT", "/v1/bundles", BUNDLE_CAP, streamed=True),
        CapRule("PUT", "/v1/attempts/{id}/outputs", output_cap, streamed=True),
        CapRule("POST", "/v1/jobs", SUBMIT_CAP),
        CapRule("POST", "/v1/attempts/{id}/logs", WORKER_REPORT_CAP),
        CapRule("POST", "/v1/attempts/{id}/finish", WORKER_REPORT_CAP),
        CapRule("POST", "/v1/workers/{id}/finish", WORKER_REPORT_CAP),
        CapRule("POST", "/ui/login", LOGIN_CAP, gate="open"),
    )


def rule_for(table: tuple[CapRule, ...], method: str, path: str) -> CapRule:
    """The route's rule; any other route (every other JSON call, any dashboard form, an
    unknown path) takes the default cap, dashboard forms behind their session."""
    for rule in table:
        if rule.matches(method, path):
            return rule
    gate: Gate = "session" if path.startswith("/ui/") else "bearer"
    return CapRule(method, path, DEFAULT_CAP, gate=gate)


def size_text(count: int) -> str:
    """A byte count as people read caps: 1 MiB, 16 KiB, 1.5 GiB, 100 bytes."""
    for unit, size in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if count >= size:
            value = count / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{count} bytes"


def refusal_line(rule: CapRule, method: str, path: str) -> str:
    return f"request body: over the {size_text(rule.cap)} cap of {method} {path}"
