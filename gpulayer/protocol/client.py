"""A small JSON-over-HTTP client for the control plane.

Built on http.client rather than an HTTP library so that `gpulayer submit` starts fast; the
API is a handful of JSON calls on a keep-alive connection.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import platform
import re
import select
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode, urlsplit

from gpulayer.errors import (
    BundleNotKeptError,
    ControlPlaneError,
    ForbiddenError,
    GpulayerError,
    NotFoundError,
    SpecError,
    StaleAttemptError,
    UsageError,
)

# The requests that make records: each carries an Idempotency-Key (see _send).
_CREATES = re.compile(r"/v1/jobs|/v1/tokens|/v1/schedules|/v1/schedules/[^/]+/trigger")


class Unauthorized(ControlPlaneError):
    exit_code = 2


class ControlClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--server: {base_url!r} is not an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._local = threading.local()

    # --- transport ----------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and _closed_by_peer(conn):
            # The server ends a keep-alive connection that sat idle (uvicorn after 5 s): a
            # request written into it would break midway, and a body cannot be sent again.
            conn.close()
            conn = self._local.conn = None
        if conn is None:
            factory = (
                http.client.HTTPSConnection
                if self._scheme == "https"
                else http.client.HTTPConnection
            )
            conn = factory(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
        return conn

    @property
    def token(self) -> str:
        """The credential calls go with now."""
        return self._token

    def use_token(self, token: str) -> None:
        """Call with this token from now on (a worker's own credential, once registered)."""
        self._token = token

    def reset(self) -> None:
        """Forget this thread's connection, e.g. after a call was interrupted."""
        self._drop_connection()

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        raw: bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> Any:
        response = self._send(method, path, body, params=params, raw=raw, timeout=timeout)
        with self._reading(method, path):
            data = response.read()
        return self._decode(response.status, data)

    @contextlib.contextmanager
    def _reading(self, method: str, path: str) -> Iterator[None]:
        """An answer cut off midway (the server died, its tunnel closed) is the control plane
        going out of reach, as a refused connection is: callers retry both alike."""
        try:
            yield
        except TimeoutError:
            self._drop_connection()
            raise ControlPlaneError(
                f"control plane at {self.base_url} did not finish its answer to {method} {path} "
                "in time"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            raise ControlPlaneError(
                f"control plane at {self.base_url} broke off its answer to {method} {path}: {exc!r}"
            ) from None

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        raw: bytes | BinaryIO | None = None,
        timeout: float | None = None,
    ) -> http.client.HTTPResponse:
        url = self._prefix + path
        if params:
            # doseq: a list is one parameter repeated (label=a=1&label=b=2).
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        headers = {"Authorization": f"Bearer {self._token}"}
        creates = method == "POST" and _CREATES.fullmatch(path) is not None
        if creates:
            # A fresh key for this request, sent again only with the request itself: a
            # server that made the records already answers with them instead of new ones.
            headers["Idempotency-Key"] = uuid.uuid4().hex
        payload: bytes | BinaryIO | None = raw
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        # A create whose answer was lost is sent again with its key (so it counts once);
        # a request the server may not have read yet (its idle connection was closed) once.
        tries = (True, True, False) if creates else (True, False)
        for retry in tries:
            conn = self._connection()
            conn.timeout = timeout or self._timeout
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(conn.timeout)
                conn.request(method, url, body=payload, headers=headers)
                return conn.getresponse()
            except (ConnectionError, http.client.HTTPException) as exc:
                # Includes a request cut off midway (Ctrl-C) that left the connection unusable.
                self._drop_connection()
                if retry and raw is None:
                    continue  # a keep-alive connection the server had closed
                raise ControlPlaneError(
                    f"control plane at {self.base_url} is unreachable: {exc}"
                ) from None
            except TimeoutError:
                self._drop_connection()
                raise ControlPlaneError(
                    f"control plane at {self.base_url} did not answer in time"
                ) from None
            except OSError as exc:
                self._drop_connection()
                raise ControlPlaneError(
                    f"control plane at {self.base_url} is unreachable: {exc}"
                ) from None
        raise AssertionError("unreachable")

    @staticmethod
    def _decode(status: int, data: bytes) -> Any:
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = None
        if status < 400:
            return decoded
        message = (
            decoded.get("error")
            if isinstance(decoded, dict)
            else data[:200].decode(errors="replace")
        )
        if status == 422 and isinstance(decoded, dict) and "errors" in decoded:
            raise SpecError(list(decoded["errors"]))
        if status == 422 and isinstance(decoded, dict) and "detail" in decoded:
            raise UsageError(_detail_line(decoded["detail"]))
        if status == 401:
            raise Unauthorized("the control plane rejected the token (set GPULAYER_TOKEN)")
        if status == 403:
            raise ForbiddenError(str(message))
        if status == 404:
            raise NotFoundError(str(message))
        if status == 409:
            raise StaleAttemptError(str(message))
        if (
            status == 400
            and isinstance(decoded, dict)
            and decoded.get("kind") == "BundleNotKeptError"
        ):
            raise BundleNotKeptError(str(message))
        if status in (400, 413):  # 413: over one of the server's limits, named in the message
            raise UsageError(str(message))
        raise GpulayerError(f"control plane error {status}: {message}")

    # --- jobs ---------------------------------------------------------------------------------

    def health(self, timeout: float = 2.0) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/v1/health", timeout=timeout)
        return result

    def submit(
        self,
        spec: dict[str, Any],
        *,
        working_dir: str | None = None,
        source_dir: str | None = None,
        bundle_id: str | None = None,
        client_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = {
            "spec": spec,
            "working_dir": working_dir,
            "source_dir": source_dir,
            "bundle_id": bundle_id,
            "client_env": client_env,
            "client_arch": _own_arch(),
        }
        result: dict[str, Any] = self.request("POST", "/v1/jobs", body)
        return result

    def offers(
        self,
        spec: dict[str, Any],
        *,
        gpu_count_exact: bool = True,
        include_disabled: bool = True,
        limit: int = 30,
        names: dict[str, str] | None = None,
        client_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Offers ``spec`` fits, ranked as submit ranks them (see gpulayer.cloud.search);
        ``limit`` 0: all of them; ``names``: how errors name the fields (the caller's flags);
        ``client_env``: the caller's cloud credential variables, which the local control
        plane asks the clouds with, as for a submit (a team server ignores them)."""
        body: dict[str, Any] = {
            "spec": spec,
            "gpu_count_exact": gpu_count_exact,
            "include_disabled": include_disabled,
            "limit": limit,
        }
        if names:
            body["names"] = names
        if client_env is not None:
            body["client_env"] = client_env
        result: dict[str, Any] = self.request("POST", "/v1/offers", body, timeout=300)
        return result

    def plan(
        self,
        spec: dict[str, Any],
        *,
        working_dir: str | None = None,
        client_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Where ``spec`` would run and why (see gpulayer.control.plan); nothing is created.
        ``working_dir``: where its local inputs are read from (the local control plane);
        ``client_env``: as for :meth:`offers`."""
        body: dict[str, Any] = {"spec": spec, "client_arch": _own_arch()}
        if working_dir is not None:
            body["working_dir"] = working_dir
        if client_env is not None:
            body["client_env"] = client_env
        result: dict[str, Any] = self.request("POST", "/v1/plan", body, timeout=300)
        return result

    def upload_bundle(self, path: Path) -> str:
        with path.open("rb") as stream:
            result = self.request("PUT", "/v1/bundles", raw=stream.read())
        return str(result["bundle_id"])

    def kept_bundle(self, sha256: str) -> str | None:
        """The id of the bundle with this digest when the server keeps it already, else None."""
        try:
            result = self.request("GET", f"/v1/bundles/sha256:{quote(sha256, safe='')}")
        except NotFoundError:
            return None
        return str(result["bundle_id"])

    def submit_many(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several submit bodies in one request and one transaction; their jobs, in order."""
        arch = _own_arch()
        for body in bodies:
            body.setdefault("client_arch", arch)
        result: list[dict[str, Any]] = self.request("POST", "/v1/jobs", bodies, timeout=600)
        return result

    def job(self, job_ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/jobs/{quote(job_ref, safe='')}")
        return result

    def jobs(
        self,
        *,
        limit: int = 50,
        states: list[str] | None = None,
        labels: dict[str, str] | None = None,
        schedule: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            "limit": limit,
            "state": ",".join(states) if states else None,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "schedule": schedule,
        }
        result: list[dict[str, Any]] = self.request("GET", "/v1/jobs", params=params)
        return result

    def cancel(self, job_ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/jobs/{quote(job_ref, safe='')}/cancel")
        return result

    def delete_jobs(self, job_refs: list[str], *, dry_run: bool = False) -> list[dict[str, Any]]:
        body = {"jobs": job_refs, "dry_run": dry_run}
        result: list[dict[str, Any]] = self.request("POST", "/v1/jobs/delete", body)
        return result

    def prune_jobs(
        self, older_than_seconds: float, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        body = {"older_than_seconds": older_than_seconds, "dry_run": dry_run}
        result: list[dict[str, Any]] = self.request("POST", "/v1/jobs/prune", body)
        return result

    def logs(
        self, job_ref: str, *, after: int = 0, wait: float = 0, node: int | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"after": after, "wait": wait}
        if node is not None:
            params["node"] = node
        result: dict[str, Any] = self.request(
            "GET",
            f"/v1/jobs/{quote(job_ref, safe='')}/logs",
            params=params,
            timeout=wait + 30,
        )
        return result

    def iter_logs(
        self, job_ref: str, *, after: int = 0, node: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every log line there is now, fetched a page at a time as the caller reads."""
        while True:
            page = self.logs(job_ref, after=after, node=node)
            if not page["lines"]:
                return
            yield from page["lines"]
            after = page["lines"][-1]["id"]

    def follow_logs(
        self,
        job_ref: str,
        *,
        after: int = 0,
        node: int | None = None,
        on_reconnect: Callable[[ControlPlaneError, float], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield log lines as they come, then a final {"job": ...} item once the job ended.

        A control plane that goes out of reach meanwhile (restarting) is asked again, within
        the follow-reconnect policy's bound, for the lines after the last one yielded: none is
        lost or yielded twice. ``on_reconnect`` hears once of each time it went away (the
        error, and the seconds it is waited for)."""

        def page_after(last: int) -> dict[str, Any]:
            try:
                return self.logs(job_ref, after=last, wait=10, node=node)
            except Unauthorized:
                raise
            except ControlPlaneError as exc:
                gone = exc
            from gpulayer.backoff import FOLLOW_RECONNECT  # only now: a follow starts fast

            if on_reconnect is not None:
                on_reconnect(gone, FOLLOW_RECONNECT.give_up_after or 0.0)
            for attempt in FOLLOW_RECONNECT.retrying(
                retry_on=(ControlPlaneError,), retry_if=lambda e: not isinstance(e, Unauthorized)
            ):
                with attempt:
                    return self.logs(job_ref, after=last, wait=10, node=node)
            raise AssertionError("unreachable")  # tenacity raises the last error

        while True:
            page = page_after(after)
            for line in page["lines"]:
                after = line["id"]
                yield line
            job = page["job"]
            if job["state"] in ("succeeded", "failed", "cancelled") and not page["lines"]:
                yield {"job": job}
                return

    def artifacts(self, job_ref: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request(
            "GET", f"/v1/jobs/{quote(job_ref, safe='')}/artifacts"
        )
        return result

    def download_artifact(self, job_ref: str, path: str, destination: Path) -> None:
        self.download(f"/v1/jobs/{quote(job_ref, safe='')}/artifacts/{quote(path)}", destination)

    def download(self, path: str, destination: Path) -> None:
        """Stream a GET answer into a file."""
        response = self._send("GET", path)
        if response.status >= 400:
            with self._reading("GET", path):
                data = response.read()
            self._decode(response.status, data)
        destination.parent.mkdir(parents=True, exist_ok=True)
        expected = response.length  # None when the answer is chunked
        received = 0
        try:
            with destination.open("wb") as out:
                # A full disk here is this machine's error, not the control plane's.
                while chunk := self._read_some(response, "GET", path):
                    out.write(chunk)
                    received += len(chunk)
            if expected is not None and received < expected:
                # http.client's read(n) ends quietly at a short body; only a count shows it.
                self._drop_connection()
                raise ControlPlaneError(
                    f"control plane at {self.base_url} broke off its answer to GET {path}: "
                    f"{received} of {expected} bytes"
                )
        except BaseException:
            destination.unlink(missing_ok=True)  # half a file must not pass for the whole
            raise

    def _read_some(self, response: http.client.HTTPResponse, method: str, path: str) -> bytes:
        with self._reading(method, path):
            return response.read(1 << 16)

    def workers(self, *, include_gone: bool = False) -> list[dict[str, Any]]:
        params = {"all": "true"} if include_gone else None
        result: list[dict[str, Any]] = self.request("GET", "/v1/workers", params=params)
        return result


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the server. Between requests nothing may
    arrive on an HTTP/1.1 connection, so a readable socket means the server's FIN (or junk)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _detail_line(detail: Any) -> str:
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return f"{where or 'request'}: {first.get('msg', 'invalid')}"
    return str(detail)


def _own_arch() -> str:
    """This machine's architecture as a submit tells it (a rented machine's default, see
    gpulayer.spec.submit_arch): on Linux only, since a Mac's wheels are no Linux machine's."""
    return platform.machine() if platform.system() == "Linux" else ""

