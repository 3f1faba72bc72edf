"""Typed SSH failures. Callers branch on the class, never on the message text."""

from __future__ import annotations

from gpulayer.errors import GpulayerError, UsageError


class SshError(GpulayerError):
    """Base of every SSH failure gpulayer raises."""


class InvalidSshArgument(SshError, UsageError):
    """An argument to an SSH call that cannot be used; the message names it."""


class InvalidSshTarget(InvalidSshArgument):
    """An SSH target field that cannot be used; the message names the field."""


class InvalidCommand(InvalidSshArgument):
    """A remote command or its environment that cannot be sent; the message names the field."""


class SshKeyError(SshError):
    """A client key that cannot be created, read or parsed."""


class InvalidHostKey(InvalidSshArgument):
    """A host key text that is not an OpenSSH public key line."""


class HostKeyStoreError(SshError):
    """The file of recorded host keys cannot be read or written."""


class HostKeyMismatch(SshError):
    """The host offered a key other than the pinned or recorded one: possibly an impostor."""

    def __init__(self, host: str, port: int, expected: list[str], offered: str) -> None:
        self.host = host
        self.port = port
        self.expected = expected
        self.offered = offered
        super().__init__(
            f"host key of {host}:{port} changed: offered {offered}, "
            f"expected {' or '.join(expected)}"
        )


class SshConnectionError(SshError):
    """The TCP connection or the SSH handshake failed (refused, timed out, bad banner)."""


class SshAuthError(SshError):
    """The host refused our client key."""


class SshKeyRefused(SshAuthError):
    """A host that answered the handshake kept refusing the key, try after try: the key is
    not where its sshd reads keys from (a deterministic failure, not a host still booting)."""

    def __init__(self, target: str, tries: int, seconds: float, last_error: BaseException):
        self.target = target
        self.tries = tries
        self.seconds = seconds
        self.last_error = last_error
        super().__init__(
            f"{target} refused the key {tries} times in {seconds:.0f} s; last: {last_error}"
        )


class SshUnreachable(SshError):
    """No session opened before the deadline; ``last_error`` says why the last try failed."""

    def __init__(
        self, target: str, deadline_seconds: float, attempts: int, last_error: BaseException
    ):
        self.target = target
        self.deadline_seconds = deadline_seconds
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(
            f"{target} not reachable over SSH within {deadline_seconds:g}s "
            f"({attempts} attempts); last error: {last_error}"
        )


class SshCommandTimeout(SshError):
    """A remote command ran past its timeout; the channel was closed."""

    def __init__(self, command: str, timeout: float) -> None:
        self.command = command
        self.timeout = timeout
        super().__init__(f"remote command exceeded {timeout:g}s: {command}")


class SshTransferError(SshError):
    """An SFTP upload or download failed; the message names both paths."""


class SshTunnelError(SshError):
    """The host refused or lost a port forward."""


class SshSessionClosed(SshError):
    """The session was used before connect() or after close()."""
