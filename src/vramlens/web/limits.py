"""What the web server accepts: request sizes and upload kinds.

* Every request body is capped at :data:`MAX_BODY_BYTES` (10 MiB). A ``Content-Length`` over
  the cap is refused with 413 before any byte of the body is read; a body sent without one
  (chunked) is read up to the cap and refused with 413 as soon as it passes it, so the server
  never holds more than the cap plus one network chunk. Real ``config.json`` files are a few
  KiB and a safetensors index a few hundred KiB; a larger memory snapshot is for ``vramlens view``.
* An upload is a JSON document or a safetensors header (an 8-byte little-endian length, then
  that many bytes of JSON, as a ``.safetensors`` file starts); anything else is refused with
  415 by :func:`sniff_upload`, whatever the file is called. Snapshots are recognised by
  :func:`vramlens.report.sources.open_source` (pickles are read by the restricted unpickler).

The middleware is plain ASGI so that it runs before FastAPI parses anything.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import urlsplit

from vramlens._compat import StrEnum
from vramlens.errors import InputError

__all__ = ["MAX_BODY_BYTES", "BodyLimit", "HostCheck", "UploadKind", "UploadRefused", "sniff_upload"]

#: Largest request body accepted, in bytes (10 MiB; the issue's limit).
MAX_BODY_BYTES: Final = 10 * 2**20

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class UploadKind(StrEnum):
    """What an uploaded file is, judged by its first bytes."""

    JSON = "json"
    SAFETENSORS_HEADER = "safetensors-header"


class UploadRefused(InputError):
    """An upload that is neither JSON nor a safetensors header (HTTP 415)."""


def sniff_upload(data: bytes, *, name: str = "upload") -> UploadKind:
    """The kind of ``data``: JSON (an object or array, optional UTF-8 BOM) or a safetensors
    header (length prefix, then a JSON object within the upload); else :class:`UploadRefused`."""
    text = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    if text.lstrip()[:1] in (b"{", b"["):
        return UploadKind.JSON
    if len(data) >= 10:
        (length,) = struct.unpack("<Q", data[:8])
        if 2 <= length <= len(data) - 8 and data[8:9] == b"{":
            return UploadKind.SAFETENSORS_HEADER
    raise UploadRefused(
        f"{name}: not JSON and not a safetensors header (starts with {data[:8]!r}); accepted: a config.json, "
        "a model.safetensors.index.json, or the first bytes of a .safetensors file (its 8-byte length and JSON header)"
    )


def _error_body(status: int, message: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = json.dumps({"error": message}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, {"type": "http.response.body", "body": body}


async def _refuse(send: Send, status: int, message: str) -> None:
    start, body = _error_body(status, message)
    await send(start)
    await send(body)


def _declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (-1 when it is not a number), or None without one."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with 413 (module docstring)."""

    def __init__(self, app: App, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    def _too_large(self) -> str:
        return f"request body: larger than {self.limit // 2**20} MiB; the server accepts at most {self.limit} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared < 0:
            await _refuse(send, 400, "request body: Content-Length is not a number")
            return
        if declared is not None and declared > self.limit:
            await _refuse(send, 413, self._too_large())
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _refuse(send, 413, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name), None)


def _host(scope: Scope) -> str:
    """The name in the request's ``Host`` header, lower-cased, without the port (``[::1]`` kept)."""
    value = (_header(scope, b"host") or "").strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1]
    return value.split(":", 1)[0]


def _origin_host(origin: str) -> str:
    """The host of an ``Origin`` header (``[::1]`` bracketed as in ``Host``; "" for "null")."""
    try:
        name = urlsplit(origin.strip()).hostname or ""
    except ValueError:
        return ""
    return f"[{name}]" if ":" in name else name


class HostCheck:
    """ASGI middleware: answer only requests whose ``Host`` is one of ``hosts`` (400 otherwise),
    so that a web page on another site cannot reach the server through DNS rebinding, and,
    when the browser says which page sent a request (``Origin``), only pages of those hosts
    (403 otherwise: another site's page cannot make this server work for it)."""

    def __init__(self, app: App, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.hosts = tuple(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            accepted = ", ".join(self.hosts)
            if _host(scope) not in self.hosts:
                await _refuse(send, 400, f"Host header: {_host(scope)!r} is not served here; accepted: {accepted}")
                return
            origin = _header(scope, b"origin")
            if origin is not None and _origin_host(origin) not in self.hosts:
                await _refuse(send, 403, f"Origin header: {origin!r} may not use this server; accepted: {accepted}")
                return
        await self.app(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the buffered body once, then waits on the real one (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
