"""The manual's runnable examples, found by the marker on the line before each fence.

Every ```bash and ```python block in README.md and docs/*.md carries a name on the line above
it, `<!-- example: NAME -->` (an HTML comment: the rendered page does not show it), so a test can
ask for an example by name and run it as the page shows it. Blocks in other languages (yaml, json,
ini) are files a reader copies, not commands, and carry no marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Fences a reader would run: each needs a marker. Other spellings of shell and Python count too,
# so an example cannot dodge its test by being tagged `sh` or `py`.
RUNNABLE = {
    "bash": "bash",
    "sh": "bash",
    "shell": "bash",
    "console": "bash",
    "python": "python",
    "py": "python",
}
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<name>\S+)\s*-->\s*$")
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_FENCE_OPEN = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w+-]*)")
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")


@dataclass(frozen=True)
class Example:
    name: str
    page: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    language: str  # "bash" or "python"
    body: str

    def commands(self) -> list[str]:
        return commands(self.body)


@dataclass(frozen=True)
class Scan:
    examples: list[Example]
    problems: list[str]  # one line each: page:line and what is wrong

    def by_name(self) -> dict[str, Example]:
        return {example.name: example for example in self.examples}


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def scan(root: Path = ROOT) -> Scan:
    examples: list[Example] = []
    problems: list[str] = []
    for page in pages(root):
        found, wrong = _scan_page(page.read_text(), str(page.relative_to(root)))
        examples += found
        problems += wrong
    seen: dict[str, Example] = {}
    for example in examples:
        first = seen.setdefault(example.name, example)
        if first is not example:
            problems.append(
                f"{example.page}:{example.line}: example name {example.name!r} is taken by "
                f"{first.page}:{first.line}"
            )
    return Scan(examples, problems)


def _scan_page(text: str, page: str) -> tuple[list[Example], list[str]]:
    lines = text.splitlines()
    examples: list[Example] = []
    problems: list[str] = []
    index = 0
    while index < len(lines):
        opened = _FENCE_OPEN.match(lines[index])
        if not opened:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not _FENCE_CLOSE.match(lines[end]):
            end += 1
        language = RUNNABLE.get(opened["language"].lower())
        if language is not None:
            marker = _MARKER.match(lines[index - 1]) if index else None
            where = f"{page}:{index + 1}"
            if marker is None:
                problems.append(
                    f"{where}: a {opened['language']} block has no "
                    "`<!-- example: NAME -->` line above it"
                )
            elif not _NAME.match(marker["name"]):
                problems.append(f"{where}: example name {marker['name']!r} is not kebab-case")
            else:
                indent = len(opened["indent"])
                body = "\n".join(line[indent:] for line in lines[index + 1 : end])
                examples.append(Example(marker["name"], page, index + 1, language, body))
        index = end + 1
    return examples, problems


def commands(body: str) -> list[str]:
    """A shell block's command lines as a reader types them: continuations joined, comments
    (whole lines and trailing ones) dropped."""
    joined: list[str] = []
    pending = ""
    for raw in body.splitlines():
        line = strip_comment(raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line.strip()).strip()
        pending = ""
        if line:
            joined.append(line)
    if pending.strip():
        joined.append(pending.strip())
    return joined


def strip_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes, after a blank)."""
    quote = ""
    for position, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line
