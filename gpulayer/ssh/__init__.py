"""SSH to workers and instances: sessions, waiting for sshd, SFTP, tunnels, host-key pinning.

Modules are imported one by one (``gpulayer.ssh.session`` ...); none imports paramiko until a
connection is made, so importing them costs nothing at start-up.
"""
