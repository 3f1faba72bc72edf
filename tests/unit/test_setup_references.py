"""What a job's setup may name for the installer: packages of an index or shipped wheels, never
a path of the worker's machine."""

from __future__ import annotations

import pytest

from gpulayer.spec.models import Setup
from gpulayer.worker.setup_env import SetupError, refuse_machine_references


@pytest.mark.parametrize(
    ("fields", "requirements", "named"),
    [
        ({"pip": ["gltest @ file:///srv/other/x.whl"]}, None, "setup.pip[0]"),
        ({"index_url": "file:///srv/mirror"}, None, "setup.index_url"),
        ({"extra_index_urls": ["https://a.example/simple", "file:///x"]}, None,
         "setup.extra_index_urls[1]"),
        ({}, "torch==2.1\n./vendor/pkg\n", "setup.requirements_file: line 2"),
        ({}, "-e .\n", "setup.requirements_file: line 1"),
        ({}, "-r /etc/other.txt\n", "setup.requirements_file: line 1"),
        ({}, "--find-links=/victim/wheels\n", "setup.requirements_file: line 1"),
        ({}, "--index-url file:///srv\n", "setup.requirements_file: line 1"),
        ({}, "pkg @ file:///tmp/x.whl --hash=sha256:00\n", "setup.requirements_file: line 1"),
    ],
)  # fmt: skip
def test_a_path_of_the_machine_is_refused_naming_where(
    fields: dict[str, object], requirements: str | None, named: str
) -> None:
    setup = Setup.model_validate({"pip": ["x"], **fields})
    with pytest.raises(SetupError) as caught:
        refuse_machine_references(setup, requirements)
    assert str(caught.value).startswith(named), str(caught.value)


def test_index_packages_and_options_that_name_no_path_pass() -> None:
    setup = Setup.model_validate(
        {
            "pip": ["transformers==4.46.0", "pkg @ https://example.org/pkg-1.0-py3-none-any.whl"],
            "index_url": "https://pypi.example.org/simple",
        }
    )
    text = (
        "# pinned\n"
        "numpy>=1.26 ; python_version >= '3.10'  # a comment\n"
        "--extra-index-url https://download.example.org/whl\n"
        "requests==2.32.3 --hash=sha256:0123\n"
        "--pre\n"
    )
    refuse_machine_references(setup, text)
