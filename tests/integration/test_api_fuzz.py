"""Every route of a real server, read from the OpenAPI document it serves, driven with
malformed paths, queries and bodies: no answer is a 5xx, and the server still answers."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
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


def test_no_route_answers_5xx_to_malformed_input(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        document = http.get("/openapi.json").json()
        spec = {"workload": {"kind": "command", "command": ["true"]}}
        job_id = http.post("/v1/jobs", json={"spec": {**spec, "placement": {"target": "remote"}}})
        known_ids = [job_id.json()["id"].encode(), b"w-nobody", b"1"]
        ops = operations(document)
        assert len(ops) >= 15, [p for _, p, _ in ops]
        failures: list[str] = []
        for method, path, operation in ops:
            failures += fuzz_operation(http, document, method, path, operation, known_ids)
        assert failures == [], "\n".join(failures[:20])
        assert http.get("/v1/health").status_code == 200
        assert http.get("/v1/jobs").status_code == 200
        assert http.get("/v1/workers").status_code == 200


def fuzz_operation(
    http: httpx.Client,
    document: dict[str, Any],
    method: str,
    path: str,
    operation: dict[str, Any],
    known_ids: list[bytes],
) -> list[str]:
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

    @settings(
        max_examples=40,
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
        try:
            reply = http.request(method, url, content=body or None, headers={"Content-Type": kind})
        except httpx.TransportError:
            # A route that refuses (4xx) before reading an upload closes the connection on
            # the rest of it; what counts is that the server still answers.
            assert http.get("/v1/health").status_code == 200
            return
        if reply.status_code >= 500:
            failures.append(f"{method} {url} {body[:80]!r} -> {reply.status_code} {reply.text}")

    one_request()
    return failures
