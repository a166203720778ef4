"""Request limits: bodies over 10 MiB are refused with 413 before they are read whole; only the
loopback Host names are answered; uploads are sniffed by content."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from web_helpers import web_client

from vramlens.web.limits import MAX_BODY_BYTES, BodyLimit, UploadKind, UploadRefused, sniff_upload


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    yield from web_client()


def test_limit_is_ten_mib() -> None:
    assert MAX_BODY_BYTES == 10 * 2**20


@pytest.mark.parametrize("path", ["/api/config", "/api/snapshot", "/api/estimate"])
def test_a_body_over_the_limit_is_refused_with_413(client: Any, path: str) -> None:
    answer = client.post(path, content=b"{" + b" " * MAX_BODY_BYTES)
    assert answer.status_code == 413
    assert answer.json() == {
        "error": f"request body: larger than 10 MiB; the server accepts at most {MAX_BODY_BYTES} bytes"
    }
    exactly = client.post(path, content=b"{" + b" " * (MAX_BODY_BYTES - 2) + b"}")
    assert exactly.status_code == 400  # read whole, then refused for what it says


def _run(limit: int, headers: list[tuple[bytes, bytes]], chunks: Iterator[bytes]) -> tuple[list[Any], int, bool]:
    """Drive the middleware with a body of ``chunks``: (messages sent, chunks read, app called)."""
    sent: list[Any] = []
    read = 0
    called = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal called
        called = True
        await receive()

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": next(chunks), "more_body": True}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/config", "headers": headers}
    asyncio.run(BodyLimit(app, limit)(scope, receive, send))
    return sent, read, called


def _endless(size: int) -> Iterator[bytes]:
    while True:
        yield b"x" * size


def test_declared_length_over_the_limit_is_refused_before_any_byte_is_read() -> None:
    sent, read, called = _run(1000, [(b"content-length", b"1001")], _endless(100))
    assert (sent[0]["status"], read, called) == (413, 0, False)
    sent, read, called = _run(1000, [(b"content-length", b"12ab")], _endless(100))
    assert (sent[0]["status"], read, called) == (400, 0, False)
    assert json.loads(sent[1]["body"]) == {"error": "request body: Content-Length is not a number"}


def test_a_chunked_body_is_read_only_until_it_passes_the_limit() -> None:
    sent, read, called = _run(1000, [], _endless(100))  # no Content-Length, more and more chunks
    assert (sent[0]["status"], read, called) == (413, 11, False)


def test_only_loopback_host_names_are_answered(client: Any) -> None:
    assert client.get("/api/gpus", headers={"Host": "localhost:8000"}).status_code == 200
    assert client.get("/api/gpus", headers={"Host": "[::1]:8000"}).status_code == 200
    rebound = client.get("/api/gpus", headers={"Host": "attacker.example:8000"})
    assert (rebound.status_code, rebound.json()) == (
        400,
        {
            "error": "Host header: 'attacker.example' is not served here; accepted: 127.0.0.1, localhost, [::1] "
            "(vramlens serve --allow-host NAME adds a name)"
        },
    )


def test_pages_of_other_sites_may_not_use_the_server(client: Any) -> None:
    ok = {"model": "llama-3.2-1b"}
    own = {"Host": "127.0.0.1:8000", "Origin": "http://127.0.0.1:8000"}
    assert client.post("/api/estimate", json=ok, headers=own).status_code == 200
    assert (
        client.post("/api/estimate", json=ok, headers={"Host": "[::1]:8000", "Origin": "http://[::1]:8000"}).status_code
        == 200
    )
    for origin in ("https://attacker.example", "null", "http://127.0.0.1.attacker.example", "http://127.0.0.1:3000"):
        answer = client.post("/api/estimate", json=ok, headers={"Host": "127.0.0.1:8000", "Origin": origin})
        assert answer.status_code == 403, origin
        assert answer.json()["error"].startswith(f"Origin header: {origin!r} may not use this server")


def _header(document: dict[str, Any]) -> bytes:
    raw = json.dumps(document).encode()
    return struct.pack("<Q", len(raw)) + raw


def test_uploads_are_sniffed_by_their_first_bytes() -> None:
    assert sniff_upload(b'  {"a": 1}') is UploadKind.JSON
    assert sniff_upload(b"\xef\xbb\xbf[1]") is UploadKind.JSON
    assert sniff_upload(_header({"__metadata__": {}})) is UploadKind.SAFETENSORS_HEADER
    assert sniff_upload(_header({"w": {}}) + b"\x00" * 64) is UploadKind.SAFETENSORS_HEADER
    for data in (b"", b"\x80\x04K\x01.", b"PK\x03\x04", struct.pack("<Q", 3) + b"{}", _header({})[:-1]):
        with pytest.raises(UploadRefused, match="not JSON and not a safetensors header"):
            sniff_upload(data, name="f.bin")
