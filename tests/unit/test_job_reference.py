"""`job:<id>/<path>` input references, split the same way by the local and HTTP worker links."""

from __future__ import annotations

import pytest

from gpulayer.errors import UsageError
from gpulayer.protocol.messages import split_job_reference


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("job:j-abc/out/model.pt", ("j-abc", "out/model.pt")),
        ("job:j-abc/out/", ("j-abc", "out")),
        ("job:j-abc", ("j-abc", "")),
    ],
)
def test_split(reference: str, expected: tuple[str, str]) -> None:
    assert split_job_reference(reference) == expected


@pytest.mark.parametrize("reference", ["j-abc/out", "job:", "job:/out"])
def test_refused(reference: str) -> None:
    with pytest.raises(UsageError, match="inputs:"):
        split_job_reference(reference)
