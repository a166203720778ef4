"""The local web calculator of ``vramlens serve``: a page and a JSON API over the same engines.

:func:`create_app` builds the FastAPI application (the ``[web]`` extra); see ``docs/web.md``.
Importing this package imports neither FastAPI nor uvicorn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(**options: Any) -> Any:
    """The ASGI application (:func:`vramlens.web.app.create_app`)."""
    from vramlens.web.app import create_app as build

    return build(**options)
