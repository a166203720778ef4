"""Issue 21, item 9: the web server under hostile clients.

Header and body timeouts and the connection limit (a real uvicorn server on loopback, in a
thread, with small limits), the Origin check whatever the bind and only the server's own
origin, uploads read in memory (no temporary files) and stale upload folders swept at start-up,
plans cancelled by the stop switch, and an OpenAPI document that lists what the server answers.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_helpers import web_client

pytest.importorskip("uvicorn", reason="needs the [web] extra (fastapi, uvicorn)")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    yield from web_client()


# ---- the OpenAPI document ----------------------------------------------------------------------


def test_the_openapi_document_lists_the_answers_the_server_gives(client: Any) -> None:
    document = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in document.get("components", {}).get("schemas", {})
    for path, item in document["paths"].items():
        for method, operation in item.items():
            answers = operation["responses"]
            assert "422" not in answers, (path, method)  # validation errors are 400 here
            assert {"200", "400", "403", "500"} <= set(answers), (path, method, sorted(answers))
            if method == "post":
                assert {"408", "413"} <= set(answers), (path, sorted(answers))
    assert set(document["paths"]["/api/config"]["post"]["responses"]) >= {"415"}
    assert set(document["paths"]["/api/snapshot"]["post"]["responses"]) >= {"415"}
    assert set(document["paths"]["/api/plan"]["post"]["responses"]) >= {"503", "204"}
    html = document["paths"]["/api/report.html"]["post"]["responses"]["200"]["content"]
    assert list(html) == ["text/html"]


def test_a_wrong_method_is_405_with_allow(client: Any) -> None:
    answer = client.post("/api/models", json={})
    assert answer.status_code == 405 and answer.headers["allow"] == "GET"
    answer = client.get("/api/estimate")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


def test_what_the_document_says_of_a_bad_body_is_what_the_server_does(client: Any) -> None:
    for path in ("/api/estimate", "/api/plan", "/api/report.html"):
        answer = client.post(path, content=b"{nope")
        assert answer.status_code == 400 and answer.headers["content-type"] == "application/json", path
    answer = client.post("/api/config?name=" + "x" * 300, content=b"{}")
    assert answer.status_code == 400  # a query parameter out of range: 400, never 422


# ---- Host and Origin ------------------------------------------------------------------------------


def test_the_origin_check_holds_whatever_the_bind() -> None:
    from starlette.testclient import TestClient

    from vramlens.cli.serve import _hosts
    from vramlens.web import create_app

    ok = {"model": "llama-3.2-1b"}
    for hosts in (_hosts("0.0.0.0"), None):  # a wildcard bind; or a library user accepting any Host
        with TestClient(create_app(hosts=hosts), base_url="http://127.0.0.1:8000") as client:
            cross = client.post("/api/estimate", json=ok, headers={"Origin": "http://evil.com"})
            assert cross.status_code == 403
            other_port = client.post("/api/estimate", json=ok, headers={"Origin": "http://127.0.0.1:3000"})
            assert other_port.status_code == 403
            other_name = client.post("/api/estimate", json=ok, headers={"Origin": "http://localhost:8000"})
            assert other_name.status_code == 403
            own = client.post("/api/estimate", json=ok, headers={"Origin": "http://127.0.0.1:8000"})
            assert own.status_code == 200
            rebound = client.post("/api/estimate", json=ok, headers={"Host": "evil.com", "Origin": "http://evil.com"})
            assert rebound.status_code == (400 if hosts is not None else 200)


# ---- uploads: in memory, nothing left in /tmp -----------------------------------------------------


def test_a_snapshot_upload_writes_no_temporary_file(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the upload was written to disk")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    raw = b"[[0, 2, 1048576, 1], [10, 4, -1048576, 1]]"  # a profiler raw export
    answer = client.post("/api/snapshot?name=mem.raw.json", content=raw)
    assert answer.status_code == 200, answer.text[:300]


def test_stale_upload_folders_are_swept_at_start_up(tmp_path: Path) -> None:
    from vramlens.web.uploads import sweep_stale_uploads

    stale, fresh, other = tmp_path / "vramlens-web-abc", tmp_path / "vramlens-web-new", tmp_path / "unrelated"
    for folder in (stale, fresh, other):
        folder.mkdir()
        (folder / "snapshot.pickle").write_bytes(b"x" * 1000)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    assert sweep_stale_uploads(str(tmp_path)) == 1
    assert not stale.exists() and fresh.exists() and other.exists()


# ---- plans: cancelled by the stop switch -----------------------------------------------------------


def test_a_plan_is_cancelled_when_the_server_stops() -> None:
    from starlette.testclient import TestClient

    from vramlens.web import create_app
    from vramlens.web.app import stop

    app = create_app()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        stop(app)
        answer = client.post("/api/plan", json={"workload": {"model": "llama-3.2-1b", "gpu": "h100-80gb"}})
        assert (answer.status_code, answer.json()) == (503, {"error": "server: stopping; the plan was cancelled"})


@pytest.mark.slow
def test_a_heavy_plan_request_ends_within_its_budget(client: Any) -> None:
    from vramlens.web.planning import GRACE_S, WEB_PLAN_SECONDS

    body = {
        "workload": {"model": "llama-3.1-70b", "gpu": "a100-40gb", "parallel": {"gpus": 1024, "shard": "fsdp"}},
        "allow_method_change": True,
    }
    start = time.monotonic()
    answer = client.post("/api/plan", json=body)
    assert time.monotonic() - start < WEB_PLAN_SECONDS + GRACE_S + 5
    assert answer.status_code in (200, 400), answer.text[:300]
    if answer.status_code == 400:
        assert answer.json()["error"].startswith("plan: the search passed its limit")


# ---- a slow body: 408 ------------------------------------------------------------------------------


def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    from vramlens.web.limits import BodyLimit

    sent: list[dict[str, Any]] = []

    async def app(_scope: Any, _receive: Any, _send: Any) -> None:
        raise AssertionError("the app must not run")

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", b"100")]}
    asyncio.run(BodyLimit(app, timeout=0.2)(scope, receive, send))
    assert sent[0]["status"] == 408 and b"not received within 0.2 s" in sent[1]["body"]


# ---- headers: a timeout and a connection limit on a real server ------------------------------------


@pytest.fixture
def small_server() -> Iterator[int]:
    """uvicorn on a free loopback port with the guarded protocol: 20 connections, headers in 1 s."""
    import uvicorn

    from vramlens.web import create_app
    from vramlens.web.server import _protocol_base, guarded_protocol

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        create_app(),
        host="127.0.0.1",
        port=port,
        log_level="error",
        http=guarded_protocol(_protocol_base(), limit=20, header_timeout=1.0),
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _get(port: int, path: str = "/api/gpus") -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _slow(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /api/gpus HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and never the rest
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (within 5 s)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.slow
def test_slow_clients_neither_exhaust_the_server_nor_stay(small_server: int) -> None:
    slow = [_slow(small_server) for _ in range(30)]  # more than the server's 20 connections
    try:
        assert [_get(small_server) for _ in range(10)] == [200] * 10  # each evicts the slowest
        time.sleep(1.5)  # past the header timeout
        assert all(_closed(sock) for sock in slow)
        assert _get(small_server) == 200
    finally:
        for sock in slow:
            sock.close()
