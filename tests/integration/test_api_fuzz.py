"""Every route of a real server, read from the OpenAPI document it serves, driven with
malformed paths, queries and bodies: no answer is a 5xx, and the server still answers."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.servers import ADMIN_TOKEN, ServerProcess, server_on

pytestmark = pytest.mark.slow

# Text a careless or hostile client sends: lone surrogates, NUL, control characters, any size.
nasty_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0xE000)),
    st.sampled_from(["\ud800", "\x00", "a\x00b", "../../etc/passwd", "", " ", "%", "\udfff"]),
)
nasty_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63, 2**63 - 1, -(2**63) - 1, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), nasty_numbers, nasty_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)
    ),
    max_leaves=12,
)
param_values = st.one_of(
    nasty_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    nasty_numbers.map(lambda n: str(n).encode()),
    st.binary(max_size=30),
    st.sampled_from([b"nan", b"inf", b"-1", b"1e400", b"true", b"[]"]),
)


def resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        return resolve(document["components"]["schemas"][name], document)
    return schema


def shaped_like(schema: dict[str, Any], document: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Objects carrying the schema's own field names with values of any (wrong) kind: they
    get past the first look and reach the deeper checks."""
    schema = resolve(schema, document)
    names = sorted(schema.get("properties", {}))
    if not names:
        return json_values
    return st.fixed_dictionaries({}, optional={name: json_values for name in names})


def nasty_archive() -> st.SearchStrategy[bytes]:
    def tar_of(names: list[str]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name in names:
                info = tarfile.TarInfo(name or "x")
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
        return buffer.getvalue()

    member_names = st.sampled_from(["../up", "/abs", "ok.txt", "a/../../b", "dir/x", "."])
    return st.one_of(st.binary(max_size=200), st.lists(member_names, max_size=3).map(tar_of))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with server_on(request.param, tmp_path_factory.mktemp("fuzz") / "server") as process:
        yield process


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, methods in sorted(document["paths"].items())
        for method, operation in sorted(methods.items())
    ]


def dashboard_operations(scratch: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """The dashboard's routes, which the OpenAPI document leaves out, read from the app the
    server builds (over a throwaway store), each shaped like an OpenAPI operation."""
    from fastapi.routing import APIRoute

    from gpulayer.control.api import create_app, single_token
    from gpulayer.control.paths import HomeLayout
    from gpulayer.control.service import ControlService
    from gpulayer.control.store import Store

    store = Store(f"sqlite:///{scratch / 'routes.db'}")
    app = create_app(
        ControlService(store, HomeLayout(scratch / "home").ensure()), single_token("x")
    )
    found = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.include_in_schema:
            continue
        path = re.sub(r"\{(\w+):path\}", r"{\1}", route.path)
        parameters = [{"name": name, "in": "path"} for name in re.findall(r"\{(\w+)\}", path)]
        parameters += [{"name": q.name, "in": "query"} for q in route.dependant.query_params]
        for method in sorted(route.methods or ()):
            body: dict[str, Any] = (
                {"content": {"application/x-www-form-urlencoded": {}}} if method == "POST" else {}
            )
            found.append((method, path, {"parameters": parameters, "requestBody": body}))
    store.close()
    # Logging out ends the session the others are fuzzed with: last.
    return sorted(found, key=lambda op: (op[1] == "/ui/logout", op[1], op[0]))


def log_in(http: httpx.Client) -> None:
    form = http.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf, form.text
    reply = http.post("/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN})
    assert reply.status_code in (200, 303), reply.text
    assert http.cookies, "logging in set no session cookie"


def test_no_route_answers_5xx_to_malformed_input(server: ServerProcess, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        document = http.get("/openapi.json").json()
        spec = {"workload": {"kind": "command", "command": ["true"]}}
        job_id = http.post("/v1/jobs", json={"spec": {**spec, "placement": {"target": "remote"}}})
        schedule = {"name": "fuzzed", "cron": "0 0 1 1 *", "job": spec}
        applied = http.post("/v1/schedules", json={"schedule": schedule})
        assert applied.status_code == 200, applied.text
        known_ids = [job_id.json()["id"].encode(), b"w-nobody", b"1", b"fuzzed"]
        ops = operations(document)
        assert len(ops) >= 15, [p for _, p, _ in ops]
        covered = {path for _, path, _ in ops}
        assert {"/v1/schedules", "/v1/schedules/{name}/trigger"} <= covered, sorted(covered)
        dashboard = dashboard_operations(tmp_path)
        assert {"/ui/jobs", "/ui/jobs/{job_ref}/cancel", "/ui/api/schedules"} <= {
            path for _, path, _ in dashboard
        }
        failures: list[str] = []
        for method, path, operation in ops:
            failures += fuzz_operation(http, document, method, path, operation, known_ids)
        log_in(http)
        forms: dict[str, list[Answer]] = {}
        with httpx.Client(base_url=server.url, timeout=60) as visitor:
            for method, path, operation in dashboard:
                posted = method == "POST" and path in FORM_ROUTES
                answers = forms.setdefault(path, []) if posted else None
                # The login form is fuzzed as a visitor not logged in, with the token of the
                # login page it has just been shown; the others within the session.
                client, csrf = (
                    (visitor, lambda: login_csrf(visitor))
                    if path == "/ui/login"
                    else (http, lambda: page_csrf(http))
                )
                failures += fuzz_operation(
                    client, document, method, path, operation, known_ids, csrf, answers
                )
        assert failures == [], "\n".join(failures[:20])
        assert set(forms) == FORM_ROUTES, sorted(forms)
        for path, answers in forms.items():  # the forms' own checks ran, not only CSRF's
            assert any(not refused_for_csrf(a) for a in answers), (path, answers[:5])
        assert http.get("/v1/health").status_code == 200
        assert http.get("/v1/jobs").status_code == 200
        assert http.get("/v1/workers").status_code == 200


# The dashboard's forms; each checks its CSRF token before anything else.
# Tries per route; the suite runs on two cores, a deeper search sets it higher.
EXAMPLES_PER_ROUTE = int(os.environ.get("GPULAYER_TEST_FUZZ_EXAMPLES", "25"))

FORM_ROUTES = {"/ui/login", "/ui/logout", "/ui/jobs/{job_ref}/cancel"}
# Stands in a generated form body for a CSRF token that is valid when the body is sent.
CSRF_MARK = b"\x00csrf\x00"
Answer = tuple[int, str]


def login_csrf(visitor: httpx.Client) -> str:
    """The token of a fresh login page (each answer of the login form draws a new one)."""
    return csrf_in(visitor.get("/ui/login").text)


def page_csrf(http: httpx.Client) -> str:
    """The session's token, or none once a fuzzed logout has ended the session."""
    page = http.get("/ui/jobs")
    return csrf_in(page.text) if page.status_code == 200 else ""


def csrf_in(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:300]
    return found.group(1)


def refused_for_csrf(answer: Answer) -> bool:
    status, text = answer
    return status == 403 and ("CSRF token" in text or "the form expired" in text)


def form_bodies(with_csrf: bool) -> st.SearchStrategy[bytes]:
    """Malformed urlencoded bodies; with_csrf: most of them carry a valid CSRF token, so they
    get past it to the form's own checks."""
    junk = st.one_of(param_values, st.sampled_from([b"csrf=x&token=y", b"a=%ZZ", b"=&="]))
    if not with_csrf:
        return junk
    fields = st.lists(
        st.tuples(st.sampled_from([b"token", b"csrf", b"a", b"", b"token[]"]), param_values),
        max_size=3,
    ).map(lambda pairs: b"&".join(name + b"=" + quote(value).encode() for name, value in pairs))
    return st.one_of(
        junk.map(lambda body: b"csrf=" + CSRF_MARK + b"&" + body),
        fields.map(lambda body: body + b"&csrf=" + CSRF_MARK),
        st.just(b"csrf=" + CSRF_MARK),
        junk,
    )


def fuzz_operation(
    http: httpx.Client,
    document: dict[str, Any],
    method: str,
    path: str,
    operation: dict[str, Any],
    known_ids: list[bytes],
    csrf: Callable[[], str] | None = None,
    answers: list[Answer] | None = None,
) -> list[str]:
    """Fuzz one route; csrf gives a valid CSRF token for a form body just before it is sent,
    and answers collects each (status, text) the route gave."""
    parameters = operation.get("parameters", [])
    content = operation.get("requestBody", {}).get("content", {})
    failures: list[str] = []
    if "application/json" in content:
        schema = content["application/json"]["schema"]
        bodies: st.SearchStrategy[bytes] = st.one_of(
            json_values.map(lambda v: json.dumps(v).encode()),
            shaped_like(schema, document).map(lambda v: json.dumps(v).encode()),
            st.binary(max_size=60),
        )
    elif "application/octet-stream" in content:
        bodies = nasty_archive()
    elif "application/x-www-form-urlencoded" in content:
        bodies = form_bodies(with_csrf=csrf is not None)
    else:
        bodies = st.just(b"")

    def value_for(parameter: dict[str, Any]) -> st.SearchStrategy[bytes]:
        if parameter["name"] == "wait":
            # A valid wait long-polls for up to 30 s: only malformed ones are of interest.
            return st.sampled_from([b"nan", b"inf", b"-1", b"1e400", b"abc", b""])
        if parameter["in"] == "path":
            return st.one_of(st.sampled_from(known_ids), param_values)
        return param_values

    values = st.fixed_dictionaries({p["name"]: value_for(p) for p in parameters})

    # The dashboard's log stream of a live job stays open: few tries, each cut short.
    streaming = path.endswith("/logs") and path.startswith("/ui/")

    @settings(
        max_examples=8 if streaming else EXAMPLES_PER_ROUTE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(values=values, body=bodies)
    def one_request(values: dict[str, bytes], body: bytes) -> None:
        url = path
        query: dict[bytes, bytes] = {}
        for parameter in parameters:
            value = values[parameter["name"]]
            if parameter["in"] == "path":
                url = url.replace("{" + parameter["name"] + "}", quote(value, safe="") or "%20")
            elif parameter["in"] == "query":
                query[parameter["name"].encode()] = value
        if query:
            url += "?" + urlencode(query)
        kind = next(iter(content), "application/json")
        if csrf is not None and CSRF_MARK in body:
            body = body.replace(CSRF_MARK, csrf().encode())
        try:
            reply = http.request(
                method,
                url,
                content=body or None,
                headers={"Content-Type": kind},
                timeout=3 if streaming else 60,
            )
        except httpx.TransportError:
            # A route that refuses (4xx) before reading an upload closes the connection on
            # the rest of it; what counts is that the server still answers.
            assert http.get("/v1/health").status_code == 200
            return
        if answers is not None:
            answers.append((reply.status_code, reply.text))
        if reply.status_code >= 500:
            failures.append(f"{method} {url} {body[:80]!r} -> {reply.status_code} {reply.text}")

    one_request()
    return failures
