"""A job key the host refused, read as data: the typed SSH error becomes a StepError of kind
key_refused, and the prepare reading drops the offer as a configuration error with one line
naming the setting, and ends the machine's charge at the refusal. Pure: no host, no store."""

from __future__ import annotations

from gpulayer.cloud.lifecycle import planning
from gpulayer.cloud.lifecycle.results import KEY_REFUSED, error_of, prepare_failed
from gpulayer.cloud.protocol import JobKeyFile
from gpulayer.ssh.errors import SshAuthError, SshConnectionError, SshKeyRefused, SshUnreachable

KEY_FILE = JobKeyFile(path="~/.ssh/authorized_keys", setting="ssh.hosts[host-1].authorized_keys")
LINE = (
    "ssh.hosts[host-1].authorized_keys: the host refused the job key written to "
    "~/.ssh/authorized_keys; set the file its sshd reads"
)


def _refused() -> SshKeyRefused:
    return SshKeyRefused("root@10.0.0.5:22", 3, 10.2, SshAuthError("refused key /k"))


def test_a_refused_key_is_its_own_kind_of_error() -> None:
    error = error_of(_refused())
    assert error.kind == KEY_REFUSED and error.type == "SshKeyRefused"
    # A host that never answered is not a refusal: its wait ran to the deadline as before.
    unreachable = SshUnreachable("root@10.0.0.5:22", 600, 90, SshConnectionError("refused"))
    assert error_of(unreachable).kind == "error"
    # A key refused once, with retries off, is not the typed refusal either.
    assert error_of(SshAuthError("refused key /k")).kind == "error"


def test_a_refused_key_drops_the_offer_with_one_line_naming_the_setting() -> None:
    reading = prepare_failed(
        error_of(_refused()),
        in_gang=False,
        node_rank=0,
        label="ssh/on-prem/host-1",
        place="host-1",
        key_file=KEY_FILE,
    )
    assert reading.end == planning.misconfigured(LINE)
    assert reading.end.outcome == "config"  # counted against the provider, offer not retried
    assert reading.charge_ends
    assert reading.note == f"ssh/on-prem/host-1: {LINE}; dropping the offer"
    assert reading.reason == f"could not be made a worker: {LINE}"


def test_a_gang_node_with_a_refused_key_says_the_gang_goes() -> None:
    reading = prepare_failed(
        error_of(_refused()), in_gang=True, node_rank=1, label="x", place="z", key_file=KEY_FILE
    )
    assert reading.end.outcome == "config" and reading.charge_ends
    assert reading.note == f"x: {LINE}; tearing the whole gang down (node 1)"


def test_a_provider_that_names_no_key_file_still_gets_one_line() -> None:
    reading = prepare_failed(
        error_of(_refused()), in_gang=False, node_rank=0, label="p/r/t", place=None
    )
    assert (
        reading.note
        == "p/r/t: the host refused the job key; set the file its sshd reads; dropping the offer"
    )


def test_other_failures_keep_their_reading_and_their_charge() -> None:
    error = error_of(SshUnreachable("h", 600, 90, SshConnectionError("refused")))
    reading = prepare_failed(error, in_gang=False, node_rank=0, label="l", place=None)
    assert reading.end.outcome == "failed" and not reading.charge_ends
