"""The submitting machine's architecture, recorded on a job that names none, is what its rented
machines may have."""

from __future__ import annotations

import platform

import pytest

from gpulayer.spec.submit_arch import (
    SUBMIT_ARCH_LABEL,
    machine_arch,
    rented_arch,
    with_submit_arch,
)
from gpulayer.spec.validate import validate_spec

JOB = {"workload": {"kind": "command", "command": ["true"]}, "placement": {"target": "cloud"}}


@pytest.mark.parametrize(
    ("name", "arch"),
    [
        ("x86_64", "x86_64"),
        ("AMD64", "x86_64"),
        ("arm64", "aarch64"),
        ("ppc64le", None),
        ("x٨", None),
    ],
)
def test_machine_names_are_read_as_the_spec_reads_them(name: str, arch: str | None) -> None:
    assert machine_arch(name) == arch


def test_this_machines_own_name_is_read_on_linux_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine_arch() == machine_arch(platform.machine())
    monkeypatch.setattr(platform, "system", lambda: "Darwin")  # a Mac's wheels are not Linux's
    assert machine_arch() is None


def test_a_job_naming_no_architecture_gets_the_submitting_machines() -> None:
    recorded = with_submit_arch({**JOB, "labels": {"team": "nlp"}}, "aarch64")
    assert recorded["labels"] == {"team": "nlp", SUBMIT_ARCH_LABEL: "aarch64"}
    assert rented_arch(validate_spec(recorded)) == ("aarch64",)


def test_a_job_naming_its_architectures_keeps_them() -> None:
    both = {**JOB, "resources": {"cpu_arch": ["x86_64", "arm64"]}}
    assert with_submit_arch(both, "aarch64") is both
    assert rented_arch(validate_spec(both)) == ("x86_64", "aarch64")


def test_an_unknown_submitting_machine_leaves_any_architecture() -> None:
    assert with_submit_arch(JOB, None) is JOB
    assert rented_arch(validate_spec(JOB)) == ()
    odd = validate_spec({**JOB, "labels": {SUBMIT_ARCH_LABEL: "sparc"}})
    assert rented_arch(odd) == ()


def test_a_job_that_rents_nothing_keeps_its_labels_its_own() -> None:
    local = {"workload": {"kind": "command", "command": ["true"]}, "labels": {"team": "nlp"}}
    assert with_submit_arch(local, "x86_64") is local
    remote = {**local, "placement": {"target": "remote"}}
    assert with_submit_arch(remote, "x86_64") is remote
    fallback = {**local, "placement": {"target": "remote", "fallback_targets": ["cloud"]}}
    assert SUBMIT_ARCH_LABEL in with_submit_arch(fallback, "x86_64")["labels"]

