"""The JSON API behind the page (every route is listed in ``/openapi.json``).

=========================  ========================================================================
``GET /api/models``        the bundled catalog: name, HF id, family, parameter counts
``GET /api/gpus``          the GPU table: name, display name, capacity (bytes and text)
``POST /api/estimate``     a workload (WORKLOAD.md) -> ``report`` (``--format json``) and ``view``
``POST /api/plan``         ``{workload, headroom, allow_method_change, top}`` -> the planner's best
``POST /api/report.html``  a workload -> the HTML report ``vramlens estimate --html`` writes
``POST /api/config``       a config.json, safetensors index or header (raw body) -> its summary
``POST /api/from``         a run config (axolotl, torchtune, litgpt, DeepSpeed, accelerate, TRL, vLLM;
                           raw body) -> its workload keys and how each was read (``--from``)
``POST /api/snapshot``     a memory record (raw body) -> ``vramlens view``'s JSON or HTML report
=========================  ========================================================================

Bodies are read by hand and validated by the workload loader, so a bad value answers 400 with
``{"error": "<the CLI's one-line message>"}``. A workload's ``model`` is a catalog name or an
``upload:...`` token from ``/api/config``: the API never opens a path the request names.
"""

from __future__ import annotations

import asyncio
import re
from functools import cache
from typing import Any, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from vramlens._untrusted import load_json
from vramlens.errors import InputError
from vramlens.model.generic.store import CodeNotRead
from vramlens.planner.budget import PlanCancelled
from vramlens.result.report import MemoryReport
from vramlens.units import format_count
from vramlens.web.cache import ResponseCache, cache_key
from vramlens.web.present import present_gpus, present_report, present_view
from vramlens.web.schema import PLAN_SCHEMA, WORKLOAD_SCHEMA, openapi_body
from vramlens.web.uploads import UploadStore, parse_upload, read_run_config_upload, release_memory
from vramlens.workload.spec import Workload

__all__ = [
    "CONCURRENT_PLANS",
    "MAX_PLAN_GPUS",
    "RAW_PATHS",
    "RAW_ROUTES",
    "router",
]

router = APIRouter(prefix="/api")
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")
_PLAN_KEYS = ("workload", "headroom", "allow_method_change", "top")
#: GPUs the web planner plans for at most (a search over 10**6 GPUs takes a minute; the
#: planner's own search for the smallest setup stops at 1024).
MAX_PLAN_GPUS: Final = 1024
#: Plans computed at once (each in a worker thread, ~0.01 to 5 s).
CONCURRENT_PLANS: Final = 2
#: Bytes a compressed upload may inflate to (its parsed form takes several times that).
MAX_INFLATED_UPLOAD_BYTES: Final = 64 * 2**20
_RAW_BODY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _store(request: Request) -> UploadStore:
    store: UploadStore = request.app.state.uploads
    return store


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object (one-line errors as for a workload file; nesting,
    size, over-long numbers and NaN bounded by :func:`vramlens._untrusted.load_json`)."""
    raw = await request.body()
    data = load_json(raw, name="request body", what="a JSON object of workload keys")
    if not isinstance(data, dict):
        raise InputError(
            f"request body: expected a mapping of workload keys at the top level, got {type(data).__name__}"
        )
    return data


def _with_model(workload: dict[str, Any]) -> dict[str, Any]:
    """``workload``, refused without a ``model`` key in the API's words (the CLI's message names its
    MODEL argument and ``-c``, which the API does not have)."""
    if "model" not in workload:
        raise InputError(
            "model: required; give a catalog name (GET /api/models) or an uploaded config's upload:... (POST /api/config)"
        )
    return workload


def _report(workload: dict[str, Any] | Workload, store: UploadStore) -> MemoryReport:
    """The estimate of a workload dict, as :func:`vramlens.estimator.estimate` makes it (keys
    validated first, then the model and GPU resolved), with ``model`` resolved by the upload
    store: a catalog name or an ``upload:`` token, never a path."""
    from vramlens.estimator import estimate_resolved
    from vramlens.hardware import resolve_gpu
    from vramlens.workload.load import load_workload

    loaded = workload if isinstance(workload, Workload) else load_workload(_with_model(workload))
    spec = store.resolve(loaded.model)
    return estimate_resolved(spec, loaded, resolve_gpu(loaded.gpu) if loaded.gpu is not None else None)


@router.get("/models", summary="The bundled model catalog")
def models() -> list[dict[str, Any]]:
    return _catalog()


@cache
def _catalog() -> list[dict[str, Any]]:
    from vramlens.model.catalog import catalog_entries

    rows = []
    for entry in catalog_entries():
        spec = entry.spec()
        rows.append(
            {
                "name": entry.name,
                "hf_id": entry.hf_id,
                "family": entry.family,
                "aliases": list(entry.aliases),
                "parameters": spec.num_parameters,
                "parameters_text": format_count(spec.num_parameters),
                "active_parameters": spec.active_parameters,
                "max_position_embeddings": spec.max_position_embeddings,
            }
        )
    return sorted(rows, key=lambda row: row["name"])


@router.get("/gpus", summary="The GPU table")
def gpus() -> list[dict[str, Any]]:
    return present_gpus()


_REPORT_PARAMETER = {
    "name": "report",
    "in": "query",
    "required": False,
    "schema": {"type": "boolean", "default": True},
    "description": "also send `report`, what `vramlens estimate --format json` prints (the page leaves it out)",
}
#: OpenAPI path items of the routes served by :data:`RAW_ROUTES` (FastAPI documents its own).
RAW_PATHS: Final = {
    "/api/estimate": {
        "post": {
            "summary": "Estimate a workload",
            "operationId": "estimate",
            "description": "`{report, view}`: `view` holds every figure the page shows as `{bytes, text}`, "
            "`text` being what the CLI prints; `report` is `vramlens estimate --format json`.",
            "parameters": [_REPORT_PARAMETER],
            **openapi_body(WORKLOAD_SCHEMA, answer="the estimate"),
        }
    }
}


def _flag(request: Request, name: str) -> bool:
    text = request.query_params.get(name, "true").strip().lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise InputError(f"{name}: must be true or false, got {text!r}")
    return text in ("true", "1", "yes")


async def estimate_endpoint(request: Request) -> Response:
    """``POST /api/estimate``: a plain Starlette route (no dependency solving: it is the route
    the page calls on every change, ~0.1 ms saved of ~0.5); documented by :data:`RAW_PATHS`."""
    from vramlens.workload.load import load_workload

    report = _flag(request, "report")
    cache: ResponseCache = request.app.state.estimates
    workload = load_workload(_with_model(await _json_object(request)))
    key = cache_key(report, workload)
    answer = cache.get(key)
    if answer is None:  # ~0.3-0.5 ms of work: computed on the event loop, no thread hop
        try:
            result = _report(workload, _store(request))
        except CodeNotRead:  # a model read from its code, at a setting not traced yet
            stopped = await _read_code(request, _estimate_job(request, workload))
            if stopped is not None:
                return stopped
            result = _report(workload, _store(request))
        content = {"report": result.to_dict()} if report else {}
        answer = bytes(JSONResponse({**content, "view": present_report(result)}).body)
        cache.put(key, answer)
    return Response(answer, media_type="application/json")


RAW_ROUTES: Final = (Route("/api/estimate", estimate_endpoint, methods=["POST"]),)


@router.post(
    "/report.html",
    summary="The HTML report of a workload",
    response_class=HTMLResponse,
    openapi_extra=openapi_body(
        WORKLOAD_SCHEMA, answer="the HTML report `vramlens estimate --html` writes", media_type="text/html"
    ),
)
async def report_html(request: Request) -> Response:
    from vramlens.report.html import render_html
    from vramlens.workload.load import load_workload

    workload = load_workload(_with_model(await _json_object(request)))
    try:
        report = _report(workload, _store(request))
    except CodeNotRead:
        stopped = await _read_code(request, _estimate_job(request, workload))
        if stopped is not None:
            return stopped
        report = _report(workload, _store(request))
    page = await run_in_threadpool(render_html, report)
    name = _NAME_RE.sub("-", report.model).strip("-") or "model"
    return Response(
        page,
        media_type="text/html; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="vramlens-{name}.html"'},
    )


def _plan_arguments(body: dict[str, Any]) -> tuple[dict[str, Any], float, bool, int]:
    unknown = [key for key in body if key not in _PLAN_KEYS]
    if unknown:
        raise InputError(f"request body: unknown key {unknown[0]!r}; accepted keys: {', '.join(_PLAN_KEYS)}")
    workload, headroom = body.get("workload"), body.get("headroom", 0.10)
    method, top = body.get("allow_method_change", False), body.get("top", 5)
    if not isinstance(workload, dict):
        raise InputError("workload: required; a mapping of workload keys (as for /api/estimate)")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)):
        raise InputError(f"headroom: must be a fraction in [0, 1) (e.g. 0.1 keeps 10% free), got {headroom!r}")
    if not isinstance(method, bool):
        raise InputError(f"allow_method_change: must be true or false, got {method!r}")
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 50:
        raise InputError(f"top: must be an integer from 1 to 50, got {top!r}")
    return workload, float(headroom), method, top


@router.post("/plan", summary="Configurations that fit, fastest first", openapi_extra=openapi_body(PLAN_SCHEMA))
async def plan_route(request: Request) -> Response:
    """The planner in a process of its own (:mod:`vramlens.web.planning`), at most
    :data:`CONCURRENT_PLANS` at once; a request whose client went away while it waited (the
    page asked again) is not planned, and one whose client goes away while it runs is stopped."""
    from vramlens.web.planning import PlanRunner
    from vramlens.workload.load import load_workload, workload_to_dict

    workload, headroom, method, top = _plan_arguments(await _json_object(request))
    loaded = load_workload(_with_model(workload))
    if loaded.parallel.gpus > MAX_PLAN_GPUS:
        raise InputError(
            f"parallel.gpus: the web planner plans up to {MAX_PLAN_GPUS} GPUs (vramlens plan has no limit), "
            f"got {loaded.parallel.gpus}"
        )
    recipe = _store(request).recipe(loaded.model)  # the plan's process builds the model from it
    runner: PlanRunner = request.app.state.planner
    async with _plans(request):
        if await request.is_disconnected():
            return Response(status_code=204)
        try:
            answer = await runner.run(
                (recipe, workload_to_dict(loaded), headroom, method, top), request.is_disconnected
            )
        except PlanCancelled:
            return _stopped(request)
    return JSONResponse(answer)


def _stopped(request: Request) -> Response:
    """The answer to a plan that was cancelled: 503 while the server stops, else none (the
    client went away)."""
    if request.app.state.stop.is_set():
        from vramlens.web.app import error_response

        response: Response = error_response(503, "server: stopping; the plan was cancelled")
        return response
    return Response(status_code=204)


def _plans(request: Request) -> asyncio.Semaphore:
    """The app's planner slots (made on first use, on the server's event loop)."""
    state = request.app.state
    if getattr(state, "plans", None) is None:
        state.plans = asyncio.Semaphore(CONCURRENT_PLANS)
    slots: asyncio.Semaphore = state.plans
    return slots


def _upload_name(name: str | None, default: str) -> str:
    """A display name for an upload: its base name, only ``[A-Za-z0-9._-]``, at most 100 chars."""
    text = _NAME_RE.sub("_", (name or "").replace("\\", "/").rsplit("/", 1)[-1]).strip("._")[:100]
    return text or default


@router.post(
    "/config",
    summary="Upload a config.json, safetensors index or safetensors header",
    openapi_extra={"requestBody": {"required": True, "content": _RAW_BODY}},
)
async def config_route(request: Request, name: str | None = Query(None, max_length=200)) -> Response:
    data, shown = await request.body(), _upload_name(name, "config.json")
    try:
        return JSONResponse(parse_upload(data, shown, _store(request)))
    except CodeNotRead:  # a model_type without a native family, not read yet
        stopped = await _read_code(request, ("config", data, shown))
        if stopped is not None:
            return stopped
        return JSONResponse(parse_upload(data, shown, _store(request)))


def _estimate_job(request: Request, workload: Workload) -> tuple[Any, ...]:
    from vramlens.workload.load import workload_to_dict

    return ("estimate", _store(request).recipe(workload.model), workload_to_dict(workload))


async def _read_code(request: Request, job: tuple[Any, ...]) -> Response | None:
    """Have a process of its own read or trace a model's code into the recipe cache (the server
    never imports torch: :func:`vramlens.model.generic.store.code_reading`), in a planner slot;
    the answer to give instead when it was cancelled, else None (the cache now holds it)."""
    from vramlens.web.planning import WEB_CODE_SECONDS, PlanRunner, read_code

    runner: PlanRunner = request.app.state.planner
    what = "reading the model's code" if job[0] == "config" else "tracing the model's layers"
    async with _plans(request):
        try:
            await runner.run(job, request.is_disconnected, target=read_code, seconds=WEB_CODE_SECONDS, what=what)
        except PlanCancelled:
            return _stopped(request)
        except RuntimeError as error:  # the process died (out of memory) or transformers' code broke
            raise InputError(f"{what}: its process failed ({error})") from None
    return None


@router.post(
    "/from",
    summary="Read a run config (what vramlens estimate --from reads) into workload keys",
    openapi_extra={"requestBody": {"required": True, "content": _RAW_BODY}},
)
async def from_route(
    request: Request,
    name: str | None = Query(None, max_length=200),
    format: str | None = Query(None, max_length=40),
) -> Response:
    data = await request.body()
    if not data:
        raise InputError("run config: empty upload; expected an axolotl, torchtune, litgpt, DeepSpeed, accelerate, "
                         "TRL or vllm serve config")  # fmt: skip
    return JSONResponse(read_run_config_upload(data, _upload_name(name, "run-config"), format))


def _view(data: bytes, name: str, fmt: str) -> Any:
    """``vramlens view`` of an uploaded record, read from its bytes in memory (nothing is written
    to disk, so nothing is left behind when a request is killed); a compressed upload inflates
    to at most :data:`MAX_INFLATED_UPLOAD_BYTES`."""
    from vramlens.forensics.sources import read_source
    from vramlens.forensics.view import build_view

    try:
        view = build_view(read_source(data, name=name, max_bytes=MAX_INFLATED_UPLOAD_BYTES))
        details = view.to_dict()
        details["source"]["path"] = name
        if fmt == "html":
            from vramlens.report.html import render_html

            return render_html(view.report, details=details)
        return {"view": details, **present_view(view.report, details)}
    finally:
        release_memory()


@router.post(
    "/snapshot",
    summary="View a memory snapshot, profiler export or vramlens timeline",
    openapi_extra={
        "requestBody": {"required": True, "content": _RAW_BODY},
        "responses": {
            "200": {
                "description": "`vramlens view` of the record: JSON, or with format=html its HTML report",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/html": {"schema": {"type": "string"}},
                },
            }
        },
    },
)
async def snapshot_route(
    request: Request,
    name: str | None = Query(None, max_length=200),
    format: str = Query("json", pattern="^(json|html)$"),
) -> Response:
    data = await request.body()
    if not data:
        raise InputError("snapshot: empty upload; expected a PyTorch memory snapshot, profiler export or .npz timeline")
    result = await run_in_threadpool(_view, data, _upload_name(name, "snapshot.pickle"), format)
    if format == "html":
        return Response(result, media_type="text/html; charset=utf-8")
    return JSONResponse(result)
