"""gpulayer's provider for machines that already exist and are reached over SSH.

Importing this package does not import paramiko; the first probe or launch does."""

from gpulayer_ssh.errors import HostUnreachable
from gpulayer_ssh.provider import SshHostsProvider
from gpulayer_ssh.settings import HostHardware, SshHost, SshProviderSettings

__all__ = ["HostHardware", "HostUnreachable", "SshHost", "SshHostsProvider", "SshProviderSettings"]
