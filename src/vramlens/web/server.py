"""Running the app under uvicorn with bounded resources: ``run_server`` (what ``vramlens serve`` does).

uvicorn alone waits forever for a client to finish its request headers and accepts
connections until the process runs out of file descriptors, so 1,100 connections that send
one byte a minute make every other request fail. Here:

* a request's headers must arrive within :data:`HEADER_TIMEOUT_S` of its first byte (or of
  the connection opening); the connection is closed otherwise. Its body must arrive within
  :data:`vramlens.web.limits.BODY_TIMEOUT_S` (408, :class:`vramlens.web.limits.BodyLimit`);
  an idle keep-alive connection is closed after :data:`KEEP_ALIVE_S`;
* at most :data:`MAX_CONNECTIONS` connections are open (and never more than the descriptors
  allow): a new connection beyond that closes the one that has waited longest for its
  headers (a slow client), or is itself closed when every connection is busy;
* SIGTERM or Ctrl+C sets the app's stop switch and kills the running plans (each runs in a
  process of its own, :mod:`vramlens.web.planning`); requests still running after
  :data:`GRACEFUL_S` are cancelled, and the process exits;
* the event loop thread gets the GIL back within :data:`SWITCH_INTERVAL_S` of asking, so the
  work of worker threads (HTML reports, snapshot uploads) cannot hold up the page's estimates.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Final

__all__ = [
    "GRACEFUL_S",
    "HEADER_TIMEOUT_S",
    "KEEP_ALIVE_S",
    "MAX_CONNECTIONS",
    "SWITCH_INTERVAL_S",
    "connection_limit",
    "guarded_protocol",
    "run_server",
]

#: Seconds a client has to send a request's headers.
HEADER_TIMEOUT_S: Final = 10.0
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S: Final = 5
#: Connections open at once, at most (also bounded by the descriptors: see :func:`connection_limit`).
MAX_CONNECTIONS: Final = 1000
#: Seconds running requests get to finish after SIGTERM before they are cancelled.
GRACEFUL_S: Final = 1
#: The interpreter's thread switch interval while serving (default 5 ms).
SWITCH_INTERVAL_S: Final = 0.001
#: Descriptors kept free beyond the connections (listening socket, files, the thread pool).
_SPARE_DESCRIPTORS: Final = 64


def connection_limit() -> int:
    """:data:`MAX_CONNECTIONS`, or fewer when the process may not open that many descriptors
    (the soft limit is first raised to the hard one where the system allows)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return MAX_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_CONNECTIONS + _SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - _SPARE_DESCRIPTORS))


def guarded_protocol(base: type[Any], *, limit: int, header_timeout: float = HEADER_TIMEOUT_S) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` with the header timeout and the
    connection limit of the module docstring."""

    class Guarded(base):  # type: ignore[misc]
        _waiting_since: float | None = None
        _tail = b""
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._begin_headers()
            if len(self.connections) > limit:
                waiting = [c for c in self.connections if c is not self and c._waiting_since is not None]
                victim = min(waiting, key=lambda c: c._waiting_since) if waiting else self
                victim.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._waiting_since is None and (self.cycle is None or self.cycle.response_complete):
                self._begin_headers()  # the next request on a keep-alive connection
            if self._waiting_since is not None:
                window = self._tail + data
                if b"\r\n\r\n" in window:
                    self._end_headers()
                else:
                    self._tail = window[-3:]
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._end_headers()
            super().connection_lost(exc)

        def _begin_headers(self) -> None:
            self._waiting_since, self._tail = time.monotonic(), b""
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(header_timeout, self._too_slow)

        def _end_headers(self) -> None:
            self._waiting_since = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self._waiting_since is not None and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _protocol_base() -> type[Any]:
    """uvicorn's C-parser protocol when httptools is installed (the [web] extra), else h11's."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def run_server(app: Any, *, host: str, port: int) -> None:
    """Serve ``app`` (from :func:`vramlens.web.create_app`) until SIGTERM or Ctrl+C."""
    import uvicorn

    limit = connection_limit()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=guarded_protocol(_protocol_base(), limit=limit),
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_S,
        lifespan="on",
    )
    from vramlens.web.app import stop

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            stop(app)  # running plans are killed now, not after the graceful wait
            super().handle_exit(sig, frame)

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    Server(config).run()
