"""Host-key pinning: trust the key the provider reported, else the first one seen, and nothing else.

The decision (:func:`check_host_key`) is pure; the stores hold what was recorded; the policy
plugs both into paramiko's handshake.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import hashlib
import json
import os
import struct
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpulayer.ssh.errors import HostKeyMismatch, HostKeyStoreError, InvalidHostKey

_KEY_TYPE_PREFIXES = ("ssh-", "ecdsa-", "sk-")

# The signature algorithms a host key of each type can be negotiated under.
_ALGORITHMS_OF_TYPE = {
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}


@dataclass(frozen=True)
class HostKey:
    """A public host key, compared by type and blob; comments never matter."""

    key_type: str
    blob: str
    """Base64 of the SSH wire-format key, exactly as OpenSSH prints it."""

    def __str__(self) -> str:
        return f"{self.key_type} {self.blob}"

    @property
    def fingerprint(self) -> str:
        """``SHA256:...`` as ``ssh-keygen -l`` prints it, for messages a person compares."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")

    def describe(self) -> str:
        return f"{self.key_type} {self.fingerprint}"


def _looks_like_type(token: str) -> bool:
    return token.startswith(_KEY_TYPE_PREFIXES)


def parse_host_key(line: str) -> HostKey:
    """One OpenSSH public key line, with or without a leading host field or trailing comment."""
    tokens = line.split()
    for i, token in enumerate(tokens[:-1]):
        if _looks_like_type(token):
            return _checked(token, tokens[i + 1], line)
    raise InvalidHostKey(f"host key {line.strip()[:60]!r} is not an OpenSSH public key line")


def valid_host_key_line(value: str | None) -> str | None:
    """A settings validator's form of :func:`parse_host_key`: the line as given, or
    ValueError (which pydantic reports under the field's name)."""
    if value is not None:
        try:
            parse_host_key(value)
        except InvalidHostKey as exc:
            raise ValueError(str(exc)) from None
    return value


def parse_host_keys(text: str) -> list[HostKey]:
    """All keys in ``text``, one per line; blank lines and ``#`` comments are skipped."""
    keys = [
        parse_host_key(line)
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not keys:
        raise InvalidHostKey("host key text holds no key")
    return keys


def _checked(key_type: str, blob: str, line: str) -> HostKey:
    # The wire format starts with the key type; a blob naming another type is a pasted mix-up.
    try:
        raw = base64.b64decode(blob, validate=True)
        (length,) = struct.unpack(">I", raw[:4])
        embedded = raw[4 : 4 + length].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError) as exc:
        raise InvalidHostKey(f"host key {line.strip()[:60]!r} has a corrupt base64 blob") from exc
    if embedded != key_type:
        raise InvalidHostKey(
            f"host key {line.strip()[:60]!r} says {key_type} but its blob holds {embedded!r}"
        )
    return HostKey(key_type, blob)


class Verdict(enum.Enum):
    ACCEPT = "accept"
    """The key is the one already recorded."""
    RECORD = "record"
    """The key is trusted and the store must now hold it."""


def check_host_key(
    host: str,
    port: int,
    offered: HostKey,
    *,
    pinned: Sequence[HostKey],
    recorded: HostKey | None,
) -> Verdict:
    """Decide on ``offered``. Pinned keys, when given, are the only truth: they overrule a
    recorded key, since a provider reporting a new key means the machine behind the address
    changed. Without pins the recorded key must match; with neither, the first key is recorded."""
    if pinned:
        if offered not in pinned:
            raise HostKeyMismatch(host, port, [k.describe() for k in pinned], offered.describe())
        return Verdict.ACCEPT if recorded == offered else Verdict.RECORD
    if recorded is None:
        return Verdict.RECORD
    if recorded != offered:
        raise HostKeyMismatch(host, port, [recorded.describe()], offered.describe())
    return Verdict.ACCEPT


def preferred_host_key_algorithms(
    expected: Sequence[HostKey], available: Sequence[str]
) -> list[str]:
    """``available`` reordered so the types we hold a key for are negotiated first.

    Without this a host with several keys may offer a type we hold nothing for, and a
    recorded or pinned key would be reported as changed when it is not."""
    wanted: list[str] = []
    for key in expected:
        for algorithm in _ALGORITHMS_OF_TYPE.get(key.key_type, (key.key_type,)):
            if algorithm in available and algorithm not in wanted:
                wanted.append(algorithm)
    return wanted + [a for a in available if a not in wanted]


class HostKeyStore(Protocol):
    """Where trust-on-first-use keys live between sessions. Keys are OpenSSH ``type blob`` text."""

    def get(self, host: str, port: int) -> str | None: ...

    def put(self, host: str, port: int, key: str) -> None: ...

    def forget(self, host: str, port: int) -> None:
        """Drop the record, e.g. once the instance behind an address is gone for good."""
        ...


def _entry(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MemoryHostKeyStore:
    """Keys for the life of one process."""

    def __init__(self) -> None:
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, host: str, port: int) -> str | None:
        with self._lock:
            return self._keys.get(_entry(host, port))

    def put(self, host: str, port: int, key: str) -> None:
        with self._lock:
            self._keys[_entry(host, port)] = str(parse_host_key(key))

    def forget(self, host: str, port: int) -> None:
        with self._lock:
            self._keys.pop(_entry(host, port), None)


class JsonHostKeyStore:
    """Keys in ``directory/known_hosts.json``, shared safely by threads and processes.

    Every change re-reads the file under an exclusive lock and replaces it atomically, so two
    controllers recording different hosts at once both keep their entry."""

    FILE_NAME = "known_hosts.json"

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE_NAME
        self._lock_path = self.directory / (self.FILE_NAME + ".lock")
        self._thread_lock = threading.Lock()

    def get(self, host: str, port: int) -> str | None:
        with self._locked():
            return self._read().get(_entry(host, port))

    def put(self, host: str, port: int, key: str) -> None:
        normalised = str(parse_host_key(key))
        with self._locked():
            entries = self._read()
            entries[_entry(host, port)] = normalised
            self._write(entries)

    def forget(self, host: str, port: int) -> None:
        with self._locked():
            entries = self._read()
            if entries.pop(_entry(host, port), None) is not None:
                self._write(entries)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise HostKeyStoreError(f"cannot open host key store {self.path}: {exc}") from exc
        with self._thread_lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read(self) -> dict[str, str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise HostKeyStoreError(f"cannot read host key store {self.path}: {exc}") from exc
        try:
            data: Any = json.loads(text)
            hosts = data["hosts"]
            if not isinstance(hosts, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in hosts.items()
            ):
                raise TypeError("hosts must map strings to strings")
        except (ValueError, KeyError, TypeError) as exc:
            # Never start over silently: an emptied store would trust any impostor again.
            raise HostKeyStoreError(f"host key store {self.path} is corrupt: {exc}") from exc
        return dict(hosts)

    def _write(self, entries: dict[str, str]) -> None:
        payload = json.dumps({"version": 1, "hosts": entries}, indent=2, sort_keys=True)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".known_hosts.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(payload + "\n")
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise HostKeyStoreError(f"cannot write host key store {self.path}: {exc}") from exc


class HostKeyPolicy:
    """paramiko's missing-host-key hook for one target.

    The session loads no known_hosts into paramiko, so this hook sees every handshake and is
    the single place a host key is judged."""

    def __init__(self, host: str, port: int, pinned: str | None, store: HostKeyStore) -> None:
        self.host = host
        self.port = port
        self.pinned = parse_host_keys(pinned) if pinned is not None else []
        self.store = store
        self._to_record: HostKey | None = None

    def recorded(self) -> HostKey | None:
        text = self.store.get(self.host, self.port)
        return parse_host_key(text) if text is not None else None

    def expected(self) -> list[HostKey]:
        """The keys a handshake should be steered towards."""
        if self.pinned:
            return list(self.pinned)
        recorded = self.recorded()
        return [recorded] if recorded is not None else []

    def missing_host_key(self, client: object, hostname: str, key: Any) -> None:
        offered = HostKey(key.get_name(), key.get_base64())
        verdict = check_host_key(
            self.host, self.port, offered, pinned=self.pinned, recorded=self.recorded()
        )
        if verdict is Verdict.RECORD:
            # Kept back until the host takes our key (``logged_in``): a host that refuses it
            # is not yet the machine we launched (its cloud-init has not run, or the address
            # still answers as the machine that held it before) and its key must not be the
            # one the machine is held to afterwards.
            self._to_record = offered

    def logged_in(self) -> None:
        """The host took our key: the first key it offered becomes the recorded one."""
        if self._to_record is not None:
            self.store.put(self.host, self.port, str(self._to_record))
            self._to_record = None
