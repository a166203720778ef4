"""What the web server accepts: request sizes, how long a body may take, who may ask, upload kinds.

* Every request body is capped at :data:`MAX_BODY_BYTES` (10 MiB). A ``Content-Length`` over
  the cap is refused with 413 before any byte of the body is read; a body sent without one
  (chunked) is read up to the cap and refused with 413 as soon as it passes it, so the server
  never holds more than the cap plus one network chunk. Real ``config.json`` files are a few
  KiB and a safetensors index a few hundred KiB; a larger memory snapshot is for ``vramlens view``.
* A body must arrive within :data:`BODY_TIMEOUT_S` of the request's headers (408 otherwise), so a
  client that trickles its body cannot hold a request open (headers: :mod:`vramlens.web.server`).
* ``Host`` must be one of the names the server answers (DNS-rebinding guard), and a request a
  browser sends from a page (``Origin``) must come from this server's own origin: the same
  scheme, host and port as the ``Host`` it was sent to. Another site's page, another local
  server's page (``http://localhost:3000``) and ``Origin: null`` get 403, whatever the bind.
* An upload is a JSON document or a safetensors header (an 8-byte little-endian length, then
  that many bytes of JSON, as a ``.safetensors`` file starts); anything else is refused with
  415 by :func:`sniff_upload`, whatever the file is called. Snapshots are recognised by
  :func:`vramlens.forensics.sources.open_source` (pickles are read by the restricted unpickler).

The middleware is plain ASGI so that it runs before FastAPI parses anything.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import urlsplit

from vramlens._compat import StrEnum
from vramlens.errors import InputError

__all__ = [
    "BODY_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "BodyLimit",
    "HostCheck",
    "UploadKind",
    "UploadRefused",
    "same_origin",
    "sniff_upload",
]

#: Largest request body accepted, in bytes (10 MiB; the issue's limit).
MAX_BODY_BYTES: Final = 10 * 2**20
#: Seconds a request body may take to arrive once the headers are in (10 MiB at 1 MB/s: 10 s).
BODY_TIMEOUT_S: Final = 30.0

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

    def __init__(self, app: App, limit: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

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
        deadline = asyncio.get_running_loop().time() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                await _refuse(send, 408, f"request body: not received within {self.timeout:g} s")
                return
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


_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _endpoint(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin or ``Host`` value (host lower-cased, IPv6 in
    brackets, the scheme's default port filled in); None when it does not parse."""
    try:
        parts = urlsplit(f"{scheme}://{netloc.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.path or parts.query or parts.username is not None:
        return None
    host = f"[{host}]" if ":" in host else host
    return scheme, host.lower(), port if port is not None else _DEFAULT_PORTS.get(scheme, -1)


def same_origin(origin: str, host_header: str) -> bool:
    """Whether the ``Origin`` of a request is this server's own: the page was served by the
    same scheme, host and port as the ``Host`` the request was sent to (``http``, or ``https``
    behind a proxy that terminates TLS). ``null`` and anything unparsable are not."""
    text = origin.strip().lower()
    scheme, separator, netloc = text.partition("://")
    if not separator or scheme not in _DEFAULT_PORTS:
        return False
    own = _endpoint(scheme, host_header.lower())
    return own is not None and _endpoint(scheme, netloc) == own


class HostCheck:
    """ASGI middleware: answer only requests whose ``Host`` is one of ``hosts`` (400 otherwise;
    ``None`` accepts any), so that a web page on another site cannot reach the server through
    DNS rebinding; and when the browser says which page sent a request (``Origin``), only
    pages of this server's own origin (403 otherwise, :func:`same_origin`), whatever ``hosts`` is."""

    def __init__(self, app: App, hosts: tuple[str, ...] | None) -> None:
        self.app = app
        self.hosts = None if hosts is None else tuple(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.hosts is not None and _host(scope) not in self.hosts:
                accepted = ", ".join(self.hosts)
                await _refuse(
                    send,
                    400,
                    f"Host header: {_host(scope)[:100]!r} is not served here; accepted: {accepted} "
                    "(vramlens serve --allow-host NAME adds a name)",
                )
                return
            origin = _header(scope, b"origin")
            if origin is not None and not same_origin(origin, _header(scope, b"host") or ""):
                await _refuse(
                    send,
                    403,
                    f"Origin header: {origin[:100]!r} may not use this server; only its own pages may "
                    f"(origin http://{(_header(scope, b'host') or '')[:100]})",
                )
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
