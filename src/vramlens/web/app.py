"""``create_app()``: the FastAPI application of ``vramlens serve``.

* ``/`` the calculator page and ``/snapshot`` the snapshot page (``static/``: no CDN, no
  external request; a Content-Security-Policy allows this origin only);
* ``/api/...`` the JSON API (:mod:`vramlens.web.api`), ``/openapi.json`` its schema. FastAPI's
  ``/docs`` and ``/redoc`` pages are off: they load their scripts from a CDN.

Errors are JSON ``{"error": "<one line>"}``: a :class:`~vramlens.errors.VramlensError` is 400
(an upload of the wrong kind 415) with the message the CLI prints after ``error:``; request
bodies over 10 MiB are 413 and bodies slower than 30 s 408 (:mod:`vramlens.web.limits`);
unknown routes 404, wrong methods 405 (with ``Allow``). ``hosts`` are the accepted ``Host``
headers (DNS-rebinding guard; ``None`` accepts any); an ``Origin`` must be the server's own
whatever ``hosts`` is (another page gets 403). The OpenAPI document lists exactly these answers.
``app.state.stop`` is set when the server stops (:func:`stop`); running plans are killed then.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Final

from vramlens._extras import require

__all__ = ["LOCAL_HOSTS", "create_app", "error_response", "stop", "warm_up"]

#: Host headers a server bound to loopback answers.
LOCAL_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")
#: The pages load only what this server serves; no frame, plugin or foreign connection.
PAGE_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
_STATIC: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "snapshot.js": "text/javascript; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
_PAGES: Final = {"/": "index.html", "/snapshot": "snapshot.html"}


def _static(name: str) -> bytes:
    return resources.files("vramlens.web").joinpath("static", name).read_bytes()


def _headers(csp: bool) -> dict[str, str]:
    headers = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
    if csp:
        headers["Content-Security-Policy"] = PAGE_CSP
    return headers


def _add_pages(app: Any) -> None:
    from fastapi.responses import Response

    def page(file: str) -> Any:
        def serve() -> Response:
            return Response(_static(file), media_type="text/html; charset=utf-8", headers=_headers(True))

        return serve

    for path, file in _PAGES.items():
        app.add_api_route(path, page(file), methods=["GET"], include_in_schema=False)

    def asset(name: str) -> Response:
        media = _STATIC.get(name)
        if media is None:
            missing: Response = _error(404, f"static: no file {name!r}")
            return missing
        return Response(_static(name), media_type=media, headers=_headers(False))

    app.add_api_route("/static/{name}", asset, methods=["GET"], include_in_schema=False)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers={**_headers(False), **(headers or {})})


def error_response(status: int, message: str) -> Any:
    """``{"error": message}`` with ``status`` and the API's headers."""
    return _error(status, message)


def _validation_message(exc: Any) -> str:
    """The first problem of a query/path parameter, on one line (``name: message``)."""
    errors = exc.errors() or [{}]
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "request"
    return f"{where}: {first.get('msg', 'invalid value')}"


def _add_errors(app: Any) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    from vramlens.errors import VramlensError
    from vramlens.web.limits import UploadRefused

    async def vramlens_error(_request: Any, exc: Exception) -> Any:
        return _error(415 if isinstance(exc, UploadRefused) else 400, str(exc))

    async def validation_error(_request: Any, exc: Exception) -> Any:
        return _error(400, _validation_message(exc))

    async def internal_error(_request: Any, exc: Exception) -> Any:
        text = " ".join(str(exc).split())[:300]
        return _error(500, f"internal error (a bug in vramlens, please report it): {type(exc).__name__}: {text}")

    async def http_error(_request: Any, exc: Exception) -> Any:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, str(exc.detail), dict(exc.headers or {}))  # 405 keeps its Allow

    app.add_exception_handler(Exception, internal_error)
    app.add_exception_handler(VramlensError, vramlens_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)


def _document(app: Any, paths: dict[str, Any]) -> None:
    """Add the path items of plain Starlette routes to the OpenAPI document FastAPI builds, and
    make every operation list the answers the server really gives (:func:`error_answers`):
    FastAPI's 422 never occurs (validation errors are 400 here)."""
    from vramlens.web.schema import error_answers

    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # cached by FastAPI in app.openapi_schema
            schema["paths"] = {**paths, **schema["paths"]}
            for path, item in schema["paths"].items():
                for method, operation in item.items():
                    answers = operation.setdefault("responses", {})
                    answers.pop("422", None)
                    answers.update({**error_answers(path, method), **answers})
            schema.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
            schema.get("components", {}).get("schemas", {}).pop("ValidationError", None)
        document: dict[str, Any] = app.openapi_schema
        return document

    app.openapi = openapi


def warm_up() -> None:
    """Load the catalog, the GPU table and the estimator once (the first estimate takes ~25 ms
    of imports and caches), so that the first request is as fast as the others."""
    from vramlens.estimator import estimate

    estimate({"model": "llama-3.1-8b", "gpu": "h100-80gb"})


@asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[None]:
    from vramlens.model.generic.store import code_reading

    warm_up()
    app.state.planner.start()
    try:
        with code_reading(False):  # models' code is read and traced in processes of their own
            yield
    finally:
        stop(app)


def stop(app: Any) -> None:
    """Set the app's stop switch and kill its running plans (the server is stopping)."""
    app.state.stop.set()
    app.state.planner.stop_all()


def create_app(*, hosts: Sequence[str] | None = LOCAL_HOSTS) -> Any:
    """The ASGI application (a ``fastapi.FastAPI``); needs the ``[web]`` extra."""
    fastapi = require("fastapi", purpose="vramlens serve")
    from vramlens._version import __version__
    from vramlens.web.api import RAW_PATHS, RAW_ROUTES, router
    from vramlens.web.cache import ResponseCache
    from vramlens.web.limits import BodyLimit, HostCheck
    from vramlens.web.planning import PlanRunner
    from vramlens.web.uploads import UploadStore

    app = fastapi.FastAPI(
        lifespan=_lifespan,
        title="vramlens",
        version=__version__,
        description="GPU memory of training and inference: the estimator, planner and reports of vramlens.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.uploads = UploadStore()
    app.state.estimates = ResponseCache()
    app.state.stop = threading.Event()
    app.state.planner = PlanRunner()
    app.include_router(router)
    app.router.routes.extend(RAW_ROUTES)
    _document(app, RAW_PATHS)
    _add_pages(app)
    _add_errors(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(HostCheck, hosts=None if hosts is None else tuple(hosts))
    return app
