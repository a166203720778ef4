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
import dataclasses
import json
import re
import tempfile
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from vramlens.errors import InputError
from vramlens.report.model import MemoryReport
from vramlens.units import format_bytes, format_count
from vramlens.web.present import present_plan, present_report, present_view
from vramlens.web.schema import PLAN_SCHEMA, WORKLOAD_SCHEMA, openapi_body
from vramlens.web.uploads import UploadStore, parse_upload

__all__ = [
    "CACHED_ESTIMATES",
    "CONCURRENT_PLANS",
    "MAX_PLAN_GPUS",
    "RAW_PATHS",
    "RAW_ROUTES",
    "ResponseCache",
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
#: Answers of ``/api/estimate`` kept (about 8 KiB each).
CACHED_ESTIMATES: Final = 512
_RAW_BODY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _store(request: Request) -> UploadStore:
    store: UploadStore = request.app.state.uploads
    return store


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object (one-line errors as for a workload file)."""
    raw = await request.body()
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise InputError("request body: not UTF-8 text; expected a JSON object of workload keys") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"request body: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError("request body: invalid JSON: nested too deeply") from None
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


def _report(workload: dict[str, Any], store: UploadStore) -> MemoryReport:
    """The estimate of a workload dict, as :func:`vramlens.estimate.estimate` makes it (keys
    validated first, then the model and GPU resolved), with ``model`` resolved by the upload
    store: a catalog name or an ``upload:`` token, never a path."""
    from vramlens.estimate import estimate_resolved
    from vramlens.hardware import resolve_gpu
    from vramlens.workload.load import load_workload

    loaded = load_workload(_with_model(workload))
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
    from vramlens.hardware import gpu_table

    return [
        {
            "name": gpu.name,
            "display_name": gpu.display_name,
            "aliases": list(gpu.aliases),
            "memory": {"bytes": gpu.memory_bytes, "text": format_bytes(gpu.memory_bytes)},
            "capacity_basis": gpu.capacity_basis,
        }
        for gpu in gpu_table()
    ]


class ResponseCache:
    """The last :data:`CACHED_ESTIMATES` answers of ``/api/estimate`` by exact request body: the
    page asks again for inputs it has shown (a slider moved back). Only successful answers are
    kept; an ``upload:`` token names its upload's content, so a cached answer stays right."""

    def __init__(self, capacity: int = CACHED_ESTIMATES) -> None:
        self._answers: OrderedDict[bytes, bytes] = OrderedDict()
        self._capacity = capacity

    def get(self, key: bytes) -> bytes | None:
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
        return answer

    def put(self, key: bytes, answer: bytes) -> None:
        self._answers[key] = answer
        while len(self._answers) > self._capacity:
            self._answers.popitem(last=False)


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
    report = _flag(request, "report")
    cache: ResponseCache = request.app.state.estimates
    key = (b"r" if report else b"v") + await request.body()
    answer = cache.get(key)
    if answer is None:  # ~0.3-0.5 ms of work: computed on the event loop, no thread hop
        result = _report(await _json_object(request), _store(request))
        content = {"report": result.to_dict()} if report else {}
        answer = bytes(JSONResponse({**content, "view": present_report(result)}).body)
        cache.put(key, answer)
    return Response(answer, media_type="application/json")


RAW_ROUTES: Final = (Route("/api/estimate", estimate_endpoint, methods=["POST"]),)


@router.post("/report.html", summary="The HTML report of a workload", openapi_extra=openapi_body(WORKLOAD_SCHEMA))
async def report_html(request: Request) -> Response:
    from vramlens.report.html import render_html

    workload = await _json_object(request)
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
    """The planner in a worker thread, at most :data:`CONCURRENT_PLANS` at once; a request
    whose client went away while it waited (the page asked again) is not planned."""
    from vramlens.plan import plan
    from vramlens.workload.load import load_workload

    workload, headroom, method, top = _plan_arguments(await _json_object(request))
    loaded = load_workload(_with_model(workload))
    if loaded.parallel.gpus > MAX_PLAN_GPUS:
        raise InputError(
            f"parallel.gpus: the web planner plans up to {MAX_PLAN_GPUS} GPUs (vramlens plan has no limit), "
            f"got {loaded.parallel.gpus}"
        )
    loaded = dataclasses.replace(loaded, model=_store(request).resolve(loaded.model))

    def run() -> Any:
        return plan(loaded, headroom=headroom, allow_method_change=method, max_candidates=top)

    async with _plans(request):
        if await request.is_disconnected():
            return Response(status_code=204)
        result = await run_in_threadpool(run)
    return JSONResponse({"plan": result.to_dict(), "view": present_plan(result, top=top)})


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
    data = await request.body()
    return JSONResponse(parse_upload(data, _upload_name(name, "config.json"), _store(request)))


def _run_config(data: bytes, name: str, fmt: str | None) -> dict[str, Any]:
    """``vramlens estimate --from``'s reading of an uploaded run config: its workload keys (a
    catalog model by its catalog name), the notes and the keys it does not model. Files the
    config names are not opened (an upload has no folder)."""
    from vramlens.model.catalog import find_entry
    from vramlens.workload.sources import parse_run_config
    from vramlens.workload.sources.shared import MAX_SOURCE_BYTES

    if len(data) > MAX_SOURCE_BYTES:
        raise InputError(f"{name}: larger than {MAX_SOURCE_BYTES // 2**20} MiB; not a run config")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text; expected a run config") from None
    source = parse_run_config(text, origin=name, format=fmt)
    summary = source.to_dict()
    model = summary["keys"].get("model")
    entry = find_entry(model) if isinstance(model, str) else None
    if entry is not None:
        summary["keys"]["model"] = entry.name
    summary["assumptions"] = list(source.assumptions())
    return summary


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
    return JSONResponse(_run_config(data, _upload_name(name, "run-config"), format))


def _view(data: bytes, name: str, fmt: str) -> Any:
    """``vramlens view`` of an uploaded record, read from a private temporary file."""
    from vramlens.report.sources import open_source
    from vramlens.report.view import build_view

    with tempfile.TemporaryDirectory(prefix="vramlens-web-") as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            view = build_view(open_source(path))
        except InputError as error:
            raise InputError(str(error).replace(str(path), name)) from None
        details = view.to_dict()
        details["source"]["path"] = name
        if fmt == "html":
            from vramlens.report.html import render_html

            return render_html(view.report, details=details)
        return {"view": details, **present_view(view.report, details)}


@router.post(
    "/snapshot",
    summary="View a memory snapshot, profiler export or vramlens timeline",
    openapi_extra={"requestBody": {"required": True, "content": _RAW_BODY}},
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
