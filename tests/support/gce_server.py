"""A Compute Engine on this machine: a small REST server speaking the paths google-cloud-compute
uses, whose instances boot as network-namespace sshd hosts of a lab.

No usable GCE emulator exists, so this one answers what the gcp provider calls: aggregated
machine-type, accelerator-type and instance lists; instances insert/get/delete; global firewall
rules; images by family; zone and global operations (get, wait, list); the Cloud Billing
Catalog's SKU list; and an OAuth token endpoint for service-account credentials. Ids are numeric strings, as the client requires.

When an instance is inserted, the server does what GCE and the guest agent do at boot: it gives
the instance the next free internal address of the lab's network and brings it up as a lab host
whose login user is the one named in the ``ssh-keys`` metadata, with that key authorized. A
deleted instance's host is removed, with everything running on it. Only the lab's own
namespaces are ever targets.

Tests steer it through :meth:`ComputeServer.fault` (answer a call with an HTTP error, or end
an insert's operation with an error code), :meth:`reject_credentials` (401 to everything) and
:meth:`preempt` (delete a spot instance as GCE does on preemption).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.shutdown import stop_services
from tests.support.sshd_hosts import LastLook, SshdHost, SshdLab

log = logging.getLogger(__name__)

PROJECT = "gpulayer-lab"
LAB_USER = "root"
BASE = "/compute/v1/projects/"


@dataclass(frozen=True)
class Boot:
    """One instance brought up as a host: what it asked for at boot."""

    name: str
    zone: str
    address: str
    host_name: str
    ssh_user: str
    ssh_cidrs: tuple[str, ...]
    """Sources the firewall rules targeting its network tags admit on port 22."""


@dataclass
class Fault:
    call: str
    """e.g. "instances.insert", "*" for any."""
    kind: str
    """"http": answer with ``status`` and ``reason``; "operation": the operation ends with
    error ``code``."""
    code: str
    message: str
    status: int = 400
    match: dict[str, str] = field(default_factory=dict)
    times: int | None = None


@dataclass
class ZoneShape:
    machines: dict[str, tuple[int, int, str | None, int]]
    """Machine type -> (vCPUs, memory MiB, fixed accelerator, its count)."""
    accelerators: dict[str, int]
    """Attachable accelerator type -> most cards per instance."""


class ComputeServer:
    """The server and its books. Use :func:`compute_server` to run one."""

    def __init__(
        self,
        zones: Mapping[str, ZoneShape],
        *,
        lab: SshdLab | None = None,
        images: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        self.zones = dict(zones)
        self.lab = lab
        self.images = dict(images or {})
        """(project, family) -> image name."""
        self._lock = threading.RLock()
        self._ids = itertools.count(4_503_599_627_370_496)
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self._by_request: dict[str, str] = {}
        self._hosts: dict[tuple[str, str], SshdHost] = {}
        self.last_look = LastLook()
        """What watched folders held on each host when its instance ended."""
        self._booted: list[Boot] = []
        self._faults: list[Fault] = []
        self._calls: list[dict[str, Any]] = []
        self._rejecting = False
        self.errors: list[str] = []
        self.skus: list[dict[str, Any]] = []
        """Compute Engine SKUs the billing catalog lists (REST field names)."""
        self.httpd: ThreadingHTTPServer | None = None

    # --- controls -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def fault(
        self,
        call: str,
        code: str,
        *,
        message: str | None = None,
        kind: str = "operation",
        status: int = 400,
        match: dict[str, str] | None = None,
        times: int | None = None,
    ) -> None:
        with self._lock:
            self._faults.append(
                Fault(call, kind, code, message or f"{code} (injected)", status, match or {}, times)
            )

    def reject_credentials(self, rejecting: bool = True) -> None:
        with self._lock:
            self._rejecting = rejecting

    def calls(self, call: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self._calls if call is None or c["call"] == call]

    @property
    def booted(self) -> list[Boot]:
        with self._lock:
            return list(self._booted)

    def hosts(self) -> dict[tuple[str, str], SshdHost]:
        with self._lock:
            return dict(self._hosts)

    def reset(self) -> None:
        for key in list(self.hosts()):
            self._shut_down(key)
        with self._lock:
            self.instances.clear()
            self.firewalls.clear()
            self.operations.clear()
            self._by_request.clear()
            self._booted.clear()
            self._faults.clear()
            self._calls.clear()
            self._rejecting = False
            self.errors.clear()
            self.skus = []

    def preempt(self, zone: str, name: str) -> None:
        """What GCE does to a spot instance with instanceTerminationAction DELETE."""
        with self._lock:
            raw = self.instances.pop((zone, name))
            self._operation("compute.instances.preempted", raw["selfLink"], zone=zone)
        self._shut_down((zone, name))

    # --- books --------------------------------------------------------------------------

    def _id(self) -> str:
        return str(next(self._ids))

    def _operation(
        self,
        operation_type: str,
        target: str,
        *,
        zone: str | None,
        error: dict[str, Any] | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        op_id = self._id()
        name = f"operation-{op_id}"
        scope = f"zones/{zone}" if zone else "global"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": op_id,
            "name": name,
            "operationType": operation_type,
            "targetLink": target,
            "targetId": self._id(),
            "status": "RUNNING" if error is None else "DONE",
            "progress": 0,
            "insertTime": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "selfLink": f"{self.url}{BASE}{PROJECT}/{scope}/operations/{name}",
        }
        if zone:
            op["zone"] = f"{self.url}{BASE}{PROJECT}/zones/{zone}"
        if error is not None:
            op["error"] = {"errors": [error]}
            op["httpErrorStatusCode"] = 400
        self.operations[name] = op
        if request_id:
            self._by_request[request_id] = name
        return op

    def _finish(self, name: str) -> dict[str, Any] | None:
        op = self.operations.get(name)
        if op is not None and op["status"] != "DONE":
            op["status"] = "DONE"
            op["progress"] = 100
        return op

    def _take_fault(self, call: str, params: Mapping[str, str]) -> Fault | None:
        for fault in self._faults:
            if fault.call not in (call, "*"):
                continue
            if any(not _matches(params, k, v) for k, v in fault.match.items()):
                continue
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
            return fault
        return None

    # --- boot ---------------------------------------------------------------------------

    def _next_address(self) -> str | None:
        if self.lab is None or self.lab.subnet is None:
            return None
        used = {i["networkInterfaces"][0].get("networkIP") for i in self.instances.values()}
        used |= {str(h.address) for h in self._hosts.values() if getattr(h, "address", None)}
        used.add(self.lab.gateway)
        # A host still shutting down keeps its address until it is gone, as GCE's would.
        used |= self.lab.addresses_taken()
        # The first addresses are GCE's own (network, gateway); instances start above them.
        for candidate in list(self.lab.subnet.hosts())[9:]:
            if str(candidate) not in used:
                return str(candidate)
        return None

    def _boot(self, zone: str, raw: dict[str, Any]) -> None:
        if self.lab is None:
            return
        name = raw["name"]
        address = raw["networkInterfaces"][0].get("networkIP", "")
        assert self.lab.subnet is not None
        if not address or ipaddress.IPv4Address(address) not in self.lab.subnet:
            self.errors.append(f"{name}: address {address} is not on the lab's {self.lab.subnet}")
            return
        metadata = {i["key"]: i.get("value", "") for i in raw.get("metadata", {}).get("items", [])}
        user, _, key = metadata.get("ssh-keys", "").partition(":")
        if user != LAB_USER:
            self.errors.append(f"{name}: login user {user!r}; lab hosts admit {LAB_USER}")
            return
        if not key.strip():
            self.errors.append(f"{name}: no ssh-keys in its metadata, so nobody could log in")
            return
        host_name = name  # GCE's guest hostname is the instance name
        host = self.lab.add_host(host_name, start=False, address=address)
        host.set_authorized_keys(key.strip() + "\n")
        self._hosts[(zone, name)] = host
        host.start()
        self._booted.append(Boot(name, zone, address, host_name, user, self._ssh_sources(raw)))

    def _ssh_sources(self, raw: Mapping[str, Any]) -> tuple[str, ...]:
        tags = set(raw.get("tags", {}).get("items", []))
        sources: list[str] = []
        for rule in self.firewalls.values():
            if rule.get("direction", "INGRESS") != "INGRESS":
                continue
            if not tags & set(rule.get("targetTags", [])):
                continue
            for allowed in rule.get("allowed", []):
                ports = allowed.get("ports", [])
                # No ports: every port of the protocol, SSH's among them.
                if allowed.get("IPProtocol") == "tcp" and (not ports or "22" in ports):
                    sources += rule.get("sourceRanges", [])
        return tuple(sorted(sources))

    def _shut_down(self, key: tuple[str, str]) -> None:
        with self._lock:
            host = self._hosts.pop(key, None)
        if host is None or self.lab is None:
            return
        try:
            stop_services(self.lab.pids_of(host))
        except Exception as exc:
            self.errors.append(f"{key}: stopping its services failed: {exc}")
        try:
            self.last_look.take(host)
            self.lab.remove_host(host)
        except Exception as exc:
            self.errors.append(f"{key}: removing its host failed: {exc}")
            return
        left = self.lab.host_leftovers(host)
        if left:
            self.errors.append(f"{key}: its host left behind {left}")

    # --- HTTP ---------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: Mapping[str, str], body: Any
    ) -> tuple[int, Any]:
        if path == "/token":
            if self._rejecting:
                return 400, {"error": "invalid_grant", "error_description": "Invalid JWT"}
            return 200, {
                "access_token": f"lab-{self._id()}",
                "expires_in": 3600,
                "token_type": "Bearer",
            }
        if path.startswith("/v1/services/") and path.endswith("/skus"):
            # The Cloud Billing Catalog API's SKU list, on the same endpoint.
            with self._lock:
                self._calls.append({"call": "skus.list", "service": path.split("/")[3]})
                if self._rejecting:
                    return _error(401, "authError", "Request had invalid credentials.")
                return 200, {"skus": list(self.skus)}
        if not path.startswith(BASE):
            return _error(404, "notFound", f"unknown path {path}")
        parts = path[len(BASE) :].split("/")
        project, rest = parts[0], parts[1:]
        call, params = _route(method, rest)
        params.update(query)
        with self._lock:
            self._calls.append({"call": call, "project": project, **params, "body": body})
            if self._rejecting:
                return _error(401, "authError", "Request had invalid authentication credentials.")
            # A fault may also match on the name of what is inserted (one node of a gang).
            named = {"body_name": str(body.get("name", ""))} if isinstance(body, dict) else {}
            fault = self._take_fault(call, {**params, **named})
            if fault is not None and fault.kind == "http":
                return _error(fault.status, fault.code, fault.message)
            return self._dispatch(call, project, params, body, fault)

    def _dispatch(
        self,
        call: str,
        project: str,
        params: dict[str, str],
        body: Any,
        fault: Fault | None,
    ) -> tuple[int, Any]:
        zone = params.get("zone", "")
        if call == "machineTypes.aggregatedList":
            pattern = re.search(r'name eq "([^"]*)"', params.get("filter", ""))
            wanted = re.compile(pattern.group(1)) if pattern else None

            def machine_types(zone: str) -> list[dict[str, Any]]:
                listed = self._machine_types(zone)
                return [m for m in listed if wanted is None or wanted.fullmatch(m["name"])]

            return 200, self._aggregated("machineTypes", machine_types)
        if call == "acceleratorTypes.aggregatedList":
            return 200, self._aggregated("acceleratorTypes", self._accelerator_types)
        if call == "instances.aggregatedList":
            return 200, self._aggregated("instances", self._instances_in(params.get("filter")))
        if call == "images.getFromFamily":
            image = self.images.get((project, params["family"]))
            if image is None:
                return _error(404, "notFound", f"family {params['family']} not found")
            link = f"{self.url}{BASE}{project}/global/images/{image}"
            return 200, {
                "id": self._id(),
                "name": image,
                "family": params["family"],
                "selfLink": link,
                "status": "READY",
            }
        if call == "instances.insert":
            return self._insert(zone, body, params.get("requestId"), fault)
        if call == "instances.get":
            raw = self.instances.get((zone, params["name"]))
            if raw is None:
                return _error(404, "notFound", f"instance {params['name']} was not found")
            return 200, raw
        if call == "instances.delete":
            raw = self.instances.pop((zone, params["name"]), None)
            if raw is None:
                return _error(404, "notFound", f"instance {params['name']} was not found")
            self._shut_down((zone, params["name"]))
            return 200, self._operation("delete", raw["selfLink"], zone=zone)
        if call == "firewalls.insert":
            if body["name"] in self.firewalls:
                return _error(409, "alreadyExists", f"firewall {body['name']} already exists")
            link = f"{self.url}{BASE}{project}/global/firewalls/{body['name']}"
            self.firewalls[body["name"]] = {**body, "id": self._id(), "selfLink": link}
            return 200, self._operation("insert", link, zone=None)
        if call == "firewalls.get":
            rule = self.firewalls.get(params["name"])
            return (200, rule) if rule else _error(404, "notFound", "firewall not found")
        if call == "firewalls.delete":
            rule = self.firewalls.pop(params["name"], None)
            if rule is None:
                return _error(404, "notFound", f"firewall {params['name']} was not found")
            return 200, self._operation("delete", rule["selfLink"], zone=None)
        if call in ("zoneOperations.wait", "globalOperations.wait", "zoneOperations.get"):
            op = self._finish(params["operation"]) if call.endswith("wait") else None
            op = op or self.operations.get(params["operation"])
            return (200, op) if op else _error(404, "notFound", "operation not found")
        if call == "zoneOperations.list":
            wanted = _filter_value(params.get("filter", ""), "operationType")
            items = [
                op
                for op in self.operations.values()
                if op.get("zone", "").endswith(f"/zones/{zone}")
                and (wanted is None or op["operationType"] == wanted)
            ]
            return 200, {"kind": "compute#operationList", "items": items}
        return _error(400, "badRequest", f"{call} is not served by this test server")

    def _insert(
        self, zone: str, body: dict[str, Any], request_id: str | None, fault: Fault | None
    ) -> tuple[int, Any]:
        if request_id and request_id in self._by_request:
            return 200, self.operations[self._by_request[request_id]]
        name = body["name"]
        link = f"{self.url}{BASE}{PROJECT}/zones/{zone}/instances/{name}"
        if fault is not None:
            error = {"code": fault.code, "message": fault.message}
            return 200, self._operation(
                "insert", link, zone=zone, error=error, request_id=request_id
            )
        if (zone, name) in self.instances:
            return _error(409, "alreadyExists", f"instance {name} already exists")
        machine = body["machineType"].rsplit("/", 1)[-1]
        if machine not in self.zones.get(zone, ZoneShape({}, {})).machines:
            return _error(400, "invalid", f"machine type {machine} does not exist in {zone}")
        interfaces = body.get("networkInterfaces") or [{}]
        address = interfaces[0].get("networkIP") or self._next_address() or "10.128.0.2"
        interfaces[0] = {**interfaces[0], "networkIP": address, "name": "nic0"}
        raw = {
            **body,
            "kind": "compute#instance",
            "id": self._id(),
            "zone": f"{self.url}{BASE}{PROJECT}/zones/{zone}",
            "status": "RUNNING",
            "selfLink": link,
            "networkInterfaces": interfaces,
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        }
        self.instances[(zone, name)] = raw
        try:
            self._boot(zone, raw)
        except Exception as exc:
            self.errors.append(f"{name}: boot failed: {type(exc).__name__}: {exc}")
        return 200, self._operation("insert", link, zone=zone, request_id=request_id)

    def _aggregated(self, key: str, items_of: Any) -> dict[str, Any]:
        return {
            "kind": f"compute#{key}AggregatedList",
            "items": {f"zones/{zone}": {key: items_of(zone)} for zone in sorted(self.zones)},
        }

    def _machine_types(self, zone: str) -> list[dict[str, Any]]:
        result = []
        for name, (vcpus, memory_mb, accelerator, count) in self.zones[zone].machines.items():
            item: dict[str, Any] = {
                "id": self._id(),
                "name": name,
                "guestCpus": vcpus,
                "memoryMb": memory_mb,
                "zone": zone,
            }
            if accelerator:
                item["accelerators"] = [
                    {"guestAcceleratorType": accelerator, "guestAcceleratorCount": count}
                ]
            result.append(item)
        return result

    def _accelerator_types(self, zone: str) -> list[dict[str, Any]]:
        return [
            {"id": self._id(), "name": name, "maximumCardsPerInstance": cards, "zone": zone}
            for name, cards in self.zones[zone].accelerators.items()
        ]

    def _instances_in(self, filter_text: str | None) -> Any:
        wanted = _label_clauses(filter_text or "")

        def items(zone: str) -> list[dict[str, Any]]:
            return [
                raw
                for (z, _), raw in self.instances.items()
                if z == zone and all(raw.get("labels", {}).get(k) == v for k, v in wanted.items())
            ]

        return items


def _matches(params: Mapping[str, str], key: str, wanted: str) -> bool:
    """A fault's match: the param equal to the value, or with ``KEY_suffix`` ending in it."""
    if key.endswith("_suffix"):
        return str(params.get(key[: -len("_suffix")], "")).endswith(wanted)
    return params.get(key) == wanted


def _error(status: int, reason: str, message: str) -> tuple[int, Any]:
    return status, {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


_ROUTES: Sequence[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"^aggregated/machineTypes$"), "machineTypes.aggregatedList"),
    ("GET", re.compile(r"^aggregated/acceleratorTypes$"), "acceleratorTypes.aggregatedList"),
    ("GET", re.compile(r"^aggregated/instances$"), "instances.aggregatedList"),
    ("GET", re.compile(r"^global/images/family/(?P<family>[^/]+)$"), "images.getFromFamily"),
    ("POST", re.compile(r"^zones/(?P<zone>[^/]+)/instances$"), "instances.insert"),
    ("GET", re.compile(r"^zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"), "instances.get"),
    (
        "DELETE",
        re.compile(r"^zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$"),
        "instances.delete",
    ),
    (
        "POST",
        re.compile(r"^zones/(?P<zone>[^/]+)/operations/(?P<operation>[^/]+)/wait$"),
        "zoneOperations.wait",
    ),
    (
        "GET",
        re.compile(r"^zones/(?P<zone>[^/]+)/operations/(?P<operation>[^/]+)$"),
        "zoneOperations.get",
    ),
    ("GET", re.compile(r"^zones/(?P<zone>[^/]+)/operations$"), "zoneOperations.list"),
    ("POST", re.compile(r"^global/firewalls$"), "firewalls.insert"),
    ("GET", re.compile(r"^global/firewalls/(?P<name>[^/]+)$"), "firewalls.get"),
    ("DELETE", re.compile(r"^global/firewalls/(?P<name>[^/]+)$"), "firewalls.delete"),
    ("POST", re.compile(r"^global/operations/(?P<operation>[^/]+)/wait$"), "globalOperations.wait"),
]


def _route(method: str, rest: list[str]) -> tuple[str, dict[str, str]]:
    tail = "/".join(rest)
    for verb, pattern, call in _ROUTES:
        match = pattern.match(tail)
        if verb == method and match:
            return call, dict(match.groupdict())
    return f"{method} {tail}", {}


def _label_clauses(text: str) -> dict[str, str]:
    return dict(re.findall(r'labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"', text))


def _filter_value(text: str, field_name: str) -> str | None:
    match = re.search(rf'{field_name}\s*=\s*"([^"]*)"', text)
    return match.group(1) if match else None


class _Handler(BaseHTTPRequestHandler):
    server_version = "gce-lab/1"
    compute: ComputeServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gce-lab: " + format, *args)

    def _serve(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            content_type = self.headers.get("Content-Type", "")
            if "json" in content_type:
                body = json.loads(raw)
            else:
                body = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
        try:
            status, answer = self.compute.handle(method, url.path, query, body)
        except Exception as exc:
            log.exception("gce-lab: %s %s failed", method, self.path)
            self.compute.errors.append(f"{method} {self.path}: {type(exc).__name__}: {exc}")
            status, answer = _error(500, "backendError", f"{type(exc).__name__}: {exc}")
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


@contextlib.contextmanager
def compute_server(
    zones: Mapping[str, ZoneShape],
    *,
    lab: SshdLab | None = None,
    images: Mapping[tuple[str, str], str] | None = None,
) -> Iterator[ComputeServer]:
    """Run a :class:`ComputeServer` on a free loopback port; on exit every host it booted is
    removed and the server stopped."""
    compute = ComputeServer(zones, lab=lab, images=images)
    handler = type("Handler", (_Handler,), {"compute": compute})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    compute.httpd = httpd
    thread = threading.Thread(target=httpd.serve_forever, name="gce-lab", daemon=True)
    thread.start()
    try:
        yield compute
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
        for key in list(compute.hosts()):
            compute._shut_down(key)


def service_account_file(folder: Path, token_url: str, project: str = PROJECT) -> Path:
    """A service-account key file (a fresh RSA key) whose token endpoint is ``token_url``, for
    GOOGLE_APPLICATION_CREDENTIALS: google-auth's default chain then gets its tokens there."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "0123456789abcdef",
                "private_key": pem,
                "client_email": f"gpulayer@{project}.iam.gserviceaccount.com",
                "client_id": "100000000000000000001",
                "token_uri": token_url,
            }
        )
    )
    path.chmod(0o600)
    return path


def isolated_google_env(folder: Path) -> dict[str, str]:
    """Environment that keeps google-auth off this user's gcloud files and off any metadata
    server: nothing but what a test hands it is found."""
    return {
        "CLOUDSDK_CONFIG": str(folder / "no-gcloud"),
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "NO_GCE_CHECK": "True",
    }
