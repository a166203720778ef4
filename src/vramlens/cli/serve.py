"""``vramlens serve [--port 8000] [--host 127.0.0.1] [--allow-host NAME]``: the local web calculator.

Serves the page and the JSON API of :mod:`vramlens.web` with uvicorn (the ``[web]`` extra,
imported only here) under the limits of :mod:`vramlens.web.server` (header and body timeouts, a
connection limit, plans cancelled on SIGTERM). Bound to loopback by default: the page and the
API are for this machine; ``--host 0.0.0.0`` shares them on the network (no authentication: do
it on a trusted network only). Whatever the bind, the server answers only ``Host`` names it
knows (loopback, the bound address, and on a wildcard bind this machine's name and addresses,
plus every ``--allow-host``) and only requests from its own pages (``Origin``).
FastAPI and uvicorn are imported when the command runs, with an install hint when missing.
"""

from __future__ import annotations

import gc
import socket

import click

from vramlens.cli._output import echo
from vramlens.errors import InputError

__all__ = ["serve_command"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_WILDCARD = ("0.0.0.0", "::", "")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _machine_names() -> list[str]:
    """This machine's host name, full name and the addresses they resolve to (what a client on
    the network puts in ``Host`` when the server listens on every interface)."""
    names = [socket.gethostname(), socket.getfqdn()]
    try:
        for *_, address in socket.getaddrinfo(socket.gethostname(), None):
            names.append(str(address[0]))
    except OSError:
        pass
    return [name for name in names if name]


def _hosts(host: str, allowed: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Host headers to answer: the loopback names, ``host`` itself (on a wildcard bind: this
    machine's names and addresses) and every ``allowed`` name, lower-cased, IPv6 in brackets."""
    from vramlens.web.app import LOCAL_HOSTS

    named = _machine_names() if host in _WILDCARD else [host]
    return tuple(dict.fromkeys(_bracketed(name.lower()) for name in (*LOCAL_HOSTS, *named, *allowed)))


@click.command("serve")
@click.option("--port", type=int, default=8000, show_default=True, help="TCP port to listen on.")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind; 0.0.0.0 shares the page on the network."
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests sent to this name or address (a Host header), e.g. a DNS name of this machine.",
)
def serve_command(port: int, host: str, allow_hosts: tuple[str, ...]) -> None:
    """Open the web calculator: estimator, planner, reports and snapshot viewer in a browser page."""
    from vramlens._extras import require

    if not 1 <= port <= 65535:
        raise InputError(f"--port: must be from 1 to 65535, got {port}")
    for name in allow_hosts:
        if not name.strip() or any(char in name for char in "/ @?#"):
            raise InputError(f"--allow-host: {name!r} is not a host name or address")
    require("uvicorn", purpose="vramlens serve")
    require("fastapi", purpose="vramlens serve")
    from vramlens.web.app import create_app, warm_up
    from vramlens.web.server import run_server
    from vramlens.web.uploads import sweep_stale_uploads

    sweep_stale_uploads()
    app = create_app(hosts=_hosts(host, tuple(allow_hosts)))
    warm_up()
    gc.collect()
    gc.freeze()  # start-up objects live for good: full collections during a burst need not walk them
    if host not in _LOOPBACK:
        echo(f"warning: serving on {host}: anyone who can reach this address can use the page", err=True)
    echo(f"vramlens: http://{_bracketed(host)}:{port}/ (Ctrl+C to stop)", err=True)
    run_server(app, host=host, port=port)
