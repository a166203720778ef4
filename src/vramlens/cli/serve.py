"""``vramlens serve [--port 8000] [--host 127.0.0.1]``: the local web calculator.

Serves the page and the JSON API of :mod:`vramlens.web` with uvicorn (the ``[web]`` extra,
imported only here). Bound to loopback by default: the page and the API are for this machine;
``--host 0.0.0.0`` shares them on the network (no authentication: do it on a trusted network
only). FastAPI and uvicorn are imported when the command runs, with an install hint when missing.
"""

from __future__ import annotations

import gc
import socket

import click

from vramlens.errors import InputError

__all__ = ["serve_command"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _hosts(host: str) -> tuple[str, ...] | None:
    """The Host headers to answer: the loopback names, plus ``host`` itself; any on a wildcard."""
    from vramlens.web.app import LOCAL_HOSTS

    if host in ("0.0.0.0", "::", ""):
        return None
    named = f"[{host}]" if ":" in host else host
    return tuple(dict.fromkeys((*LOCAL_HOSTS, named)))


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound and listening on ``host:port`` (SO_REUSEADDR, as uvicorn binds), so that a busy
    port fails here, with one line, before the URL is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise InputError(f"--port: cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


@click.command("serve")
@click.option("--port", type=int, default=8000, show_default=True, help="TCP port to listen on.")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 shares the page on the network."
)
def serve_command(port: int, host: str) -> None:
    """Open the web calculator: estimator, planner, reports and snapshot viewer in a browser page."""
    from vramlens._extras import require

    if not 1 <= port <= 65535:
        raise InputError(f"--port: must be from 1 to 65535, got {port}")
    uvicorn = require("uvicorn", purpose="vramlens serve")
    require("fastapi", purpose="vramlens serve")
    from vramlens.web.app import create_app, warm_up

    app = create_app(hosts=_hosts(host))
    warm_up()
    gc.collect()
    gc.freeze()  # start-up objects live for good: full collections during a burst need not walk them
    sock = _listen(host, port)
    shown = f"[{host}]" if ":" in host else host
    if host not in _LOOPBACK:
        click.echo(f"warning: serving on {host}: anyone who can reach this address can use the page", err=True)
    click.echo(f"vramlens: http://{shown}:{port}/ (Ctrl+C to stop)", err=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
