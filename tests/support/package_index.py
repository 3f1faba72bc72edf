"""A package index on the test network: PEP 503 "simple" pages over a folder of wheels.

Test hosts have no way out to a real index, so a test serves one on an address they reach
(the lab's bridge, or loopback), with wheels it makes (:func:`make_wheel`) or finds on this
machine.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from tests.support.sshd_hosts import SshdLab


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def make_wheel(directory: Path, name: str, version: str, modules: dict[str, str]) -> Path:
    """A pure-Python wheel of ``modules`` (file name -> source), as a build backend writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = dict(modules)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: gpulayer-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for file_name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{file_name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file_name, text in files.items():
            archive.writestr(file_name, text)
    return path


class PackageIndex:
    """Serves ``wheels`` at ``http://ADDRESS:PORT/simple/``; ``requests`` counts file downloads."""

    def __init__(self, wheels: Path, address: str = "127.0.0.1") -> None:
        self.wheels = wheels
        self.downloads: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index._answer(self)

            def do_HEAD(self) -> None:
                index._answer(self, head=True)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.address = address
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/simple"

    def _projects(self) -> dict[str, list[Path]]:
        found: dict[str, list[Path]] = {}
        for wheel in sorted(self.wheels.glob("*.whl")):
            found.setdefault(normalize(wheel.name.split("-")[0]), []).append(wheel)
        return found

    def _answer(self, request: http.server.BaseHTTPRequestHandler, head: bool = False) -> None:
        def send(status: int, body: bytes, content_type: str = "text/html") -> None:
            _send(request, status, b"" if head else body, content_type, length=len(body))

        parts = [unquote(p) for p in request.path.split("?")[0].split("/") if p]
        projects = self._projects()
        if parts == ["simple"]:
            links = [f'<a href="/simple/{n}/">{n}</a>' for n in projects]
            return send(200, _page(links))
        if len(parts) == 2 and parts[0] == "simple":
            wheels = projects.get(normalize(parts[1]))
            if wheels is None:
                return send(404, b"not found")
            links = []
            for wheel in wheels:
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                href = f"/files/{quote(wheel.name)}#sha256={digest}"
                links.append(f'<a href="{html.escape(href)}">{html.escape(wheel.name)}</a>')
            return send(200, _page(links))
        if len(parts) == 2 and parts[0] == "files":
            wheel = self.wheels / parts[1]
            if wheel.parent != self.wheels or not wheel.is_file():
                return send(404, b"not found")
            if not head:
                self.downloads.append(wheel.name)
            return send(200, wheel.read_bytes(), "application/octet-stream")
        return send(404, b"not found")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> PackageIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _page(links: list[str]) -> bytes:
    body = "<!DOCTYPE html><html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n"
    return body.encode()


def _send(
    request: http.server.BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    content_type: str,
    *,
    length: int,
) -> None:
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(length))
    request.end_headers()
    request.wfile.write(body)


def repacked_wheels(root: str) -> Path:
    """Wheels of ``root`` and all it requires, repacked from this machine's installed copies
    (what the controller has, for hosts that reach no real index); cached by their versions."""
    import fcntl
    import os
    from importlib import metadata

    from gpulayer.cloud.wheelhouse.closure import worker_distributions
    from gpulayer.cloud.wheelhouse.repack import repack_distribution
    from tests.support.rootfs import cache_root

    dists = worker_distributions(root, exclude=())
    names = ",".join(f"{d.metadata['Name']}=={d.version}" for d in dists)
    key = hashlib.sha256(names.encode()).hexdigest()[:12]
    directory = cache_root() / f"wheels-{normalize(root)}-{key}"
    done = directory / ".complete"
    if done.exists():
        return directory
    cache_root().mkdir(parents=True, exist_ok=True)
    fd = os.open(cache_root() / f".wheels-{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not done.exists():
            directory.mkdir(exist_ok=True)
            for dist in dists:
                assert isinstance(dist, metadata.Distribution)
                repack_distribution(dist, directory)
            done.write_text(names + "\n")
    finally:
        os.close(fd)
    return directory


@pytest.fixture(scope="session")
def torch_index(sshd_lab: SshdLab) -> Iterator[PackageIndex]:
    """torch and what it needs, repacked from this machine, served where the lab's hosts
    reach it: how a job on a host that has no torch gets it through ``setup.pip``."""
    try:
        wheels = repacked_wheels("torch")
    except Exception as exc:  # torch not installed here, or not repackable
        pytest.skip(f"no torch wheels to serve: {exc}")
    with PackageIndex(wheels, address=sshd_lab.gateway) as served:
        yield served
