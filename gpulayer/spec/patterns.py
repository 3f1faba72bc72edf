"""Patterns that gpulayer, Python's jsonschema and ECMA-262 validators (ajv) read alike.

A pattern is written once, as a body in the part of regular-expression syntax on which Python's
``re`` and ECMA-262 agree: character classes spelled out in ASCII (``[0-9]``, never ``\\d``,
which in Python matches any Unicode digit), groups, alternation and quantifiers. gpulayer
matches the whole value (``re.fullmatch``, ASCII semantics). The published JSON Schema cannot
say "the whole value" with ``\\A...\\Z`` (not ECMA-262), nor safely with ``^...$``: a JSON
Schema pattern is a search, and Python's ``$`` also matches before a trailing newline, so
jsonschema would take ``"job\\n"`` where ajv refuses it. It says ``^(?:body)(?![\\s\\S])``: the
end is where no character at all follows, read the same way by both engines.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

# Syntax whose meaning differs between Python and ECMA-262 (Unicode-aware shorthands in
# Python, end anchors, inline flags, Python's named groups) or that ECMA-262 lacks.
_NOT_PORTABLE = re.compile(r"\\[dDwWsSbBAZ]|\$|\(\?[aiLmsux]|\(\?P|\(\?<")


class ExactPattern:
    """A pattern the whole value must match; usable as a pydantic annotation on ``str``."""

    def __init__(self, body: str, problem: str) -> None:
        if _NOT_PORTABLE.search(body):
            raise ValueError(f"pattern {body!r} is not read alike by Python and ECMA-262")
        self.body = body
        self.problem = problem
        self._compiled = re.compile(body, re.ASCII)

    def matches(self, value: str) -> bool:
        return self._compiled.fullmatch(value) is not None

    def check(self, value: str) -> str:
        """``value``, or ValueError saying what form it should have."""
        if not self.matches(value):
            raise ValueError(f"{value!r} is not {self.problem}")
        return value

    @property
    def json_pattern(self) -> str:
        """The same rule as a JSON Schema ``pattern``."""
        return rf"^(?:{self.body})(?![\s\S])"

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        published = handler(schema)
        published["pattern"] = self.json_pattern
        return published
