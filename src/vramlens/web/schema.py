"""JSON schemas of the API's request bodies, for the OpenAPI document (``/openapi.json``).

The workload schema describes the contract of ``WORKLOAD.md``: generated from the declaration
of every key (:data:`vramlens.workload.keys.KEYS`: kind, range, enum values, description). It documents; it does
not validate: bodies are validated by :func:`vramlens.workload.load_workload`, so a bad value
gets the same one-line message as on the command line (400 ``{"error": ...}``), never a
schema-validator's report. Token counts also accept strings such as ``"8k"``, and every enum
accepts its values in any case, as the loader does.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final

from vramlens.workload._strings import MAX_ALLOC_CONF_CHARS, MAX_VERSION_CHARS
from vramlens.workload.keys import Key, Kind, keys_of
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS
from vramlens.workload.ranges import RANGES
from vramlens.workload.versions import CURRENT, PACKAGES

__all__ = ["ERROR_SCHEMA", "PLAN_SCHEMA", "WORKLOAD_SCHEMA", "error_answers", "openapi_body", "workload_schema"]

_FLAG: Final = {"type": "boolean"}


def _enum(cls: type[Enum]) -> dict[str, Any]:
    return {"type": "string", "enum": [str(member.value) for member in cls]}


def _bounds(key: str, kind: str) -> dict[str, Any]:
    """The JSON-schema bounds of a numeric key, from :data:`vramlens.workload.ranges.RANGES`."""
    bounds = RANGES[key]
    low, high = (int(bounds.low), int(bounds.high)) if kind == "integer" else (bounds.low, bounds.high)
    schema: dict[str, Any] = {"type": kind}
    schema["exclusiveMinimum" if bounds.low_open else "minimum"] = low
    schema["exclusiveMaximum" if bounds.high_open else "maximum"] = high
    return schema


def _int(key: str) -> dict[str, Any]:
    return _bounds(key, "integer")


def _number(key: str) -> dict[str, Any]:
    return _bounds(key, "number")


def _tokens(key: str) -> dict[str, Any]:
    """A token count: an integer in range, or a string such as '8k' (= 8192)."""
    return {"anyOf": [_int(key), {"type": "string", "examples": ["8k"]}]}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _versions() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            package: {"type": "string", "maxLength": MAX_VERSION_CHARS, "examples": [CURRENT[package]]}
            for package in PACKAGES
        },
        "additionalProperties": False,
    }


def _shape(key: Key) -> dict[str, Any]:
    """The JSON schema of one declared key's values (before ``null`` and the description)."""
    if key.values is not None:
        return _enum(key.values)
    kinds: dict[Kind, Any] = {
        Kind.INT: lambda: _int(key.path),
        Kind.TOKENS: lambda: _tokens(key.path),
        Kind.REAL: lambda: _number(key.path),
        Kind.SWITCH: lambda: dict(_FLAG),
        Kind.TEXT: lambda: {"type": "string"},
        Kind.MODEL: lambda: {"type": "string", "examples": ["llama-3.1-8b", "upload:..."]},
        Kind.GPU: lambda: {"type": "string", "examples": ["h100-80gb", "24GiB"]},
        Kind.NAMES: lambda: {"type": "array", "items": {"type": "string"}},
        Kind.TARGETS: lambda: {
            "anyOf": [{"type": "string", "enum": ["all-linear"]}, {"type": "array", "items": {"type": "string"}}]
        },
        Kind.ALLOC_CONF: lambda: {"type": "string", "maxLength": MAX_ALLOC_CONF_CHARS},
        Kind.VERSIONS: _versions,
    }
    schema: dict[str, Any] = kinds[key.kind]()
    return schema


def _property(key: Key) -> dict[str, Any]:
    """A key's schema with its declared one-line description (and ``null`` where accepted)."""
    schema = _nullable(_shape(key)) if key.nullable else _shape(key)
    return {**schema, "description": key.help}


_TOP: Final = {key.name: _property(key) for key in keys_of("")}
_LORA: Final = {key.name: _property(key) for key in keys_of("lora")}
_PARALLEL: Final = {key.name: _property(key) for key in keys_of("parallel")}


def _block(properties: dict[str, dict[str, Any]], keys: Any, title: str) -> dict[str, Any]:
    missing = set(keys) - set(properties)
    if missing:  # the loader grew a key: document it (a test keeps this in step)
        raise RuntimeError(f"web schema: {title} lacks {sorted(missing)}")
    return {"type": "object", "title": title, "properties": properties, "additionalProperties": False}


def workload_schema() -> dict[str, Any]:
    """The workload object (WORKLOAD.md), every key optional except ``model``."""
    schema = _block(dict(_TOP), TOP_KEYS, "Workload")
    schema["properties"] = {
        **schema["properties"],
        "lora": _block(dict(_LORA), LORA_KEYS, "LoRA"),
        "parallel": _block(dict(_PARALLEL), PARALLEL_KEYS, "Parallel"),
    }
    schema["required"] = ["model"]
    schema["example"] = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "batch": 4, "seq": 2048}
    return schema


WORKLOAD_SCHEMA: Final = workload_schema()
PLAN_SCHEMA: Final = {
    "type": "object",
    "title": "PlanRequest",
    "properties": {
        "workload": WORKLOAD_SCHEMA,
        "headroom": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.1},
        "allow_method_change": {"type": "boolean", "default": False},
        "top": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
    },
    "required": ["workload"],
    "additionalProperties": False,
}
ERROR_SCHEMA: Final = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "the CLI's one-line message"}},
    "required": ["error"],
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


#: Routes that take an upload (a raw body of a given kind).
_UPLOADS: Final = ("/api/config", "/api/snapshot")


def error_answers(path: str, method: str) -> dict[str, Any]:
    """Every error answer an operation can give (the server's middleware included), as OpenAPI
    responses: 400 bad input (or a Host not served), 403 a page of another origin, 500 a bug;
    for a body also 408 (slower than 30 s) and 413 (over 10 MiB); for an upload 415 (not a
    kind it reads); for a plan 503 (the server is stopping) and 204 (the client went away)."""
    answers = {
        "400": _error("bad input (the one-line message the CLI prints), or a Host header this server does not answer"),
        "403": _error("the request came from a page of another origin (Origin header)"),
        "500": _error("internal error: a bug in vramlens"),
    }
    if method.lower() == "post":
        answers["408"] = _error("the request body did not arrive within 30 s")
        answers["413"] = _error("request body over 10 MiB")
    if path in _UPLOADS:
        answers["415"] = _error("the upload is not a kind this route reads")
    if path == "/api/plan":
        answers["503"] = _error("the server is stopping: the plan was cancelled")
        answers["204"] = {"description": "the client went away before the plan ran: no answer"}
    return answers


def openapi_body(
    schema: dict[str, Any], *, answer: str | None = None, media_type: str = "application/json"
) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is read by hand: its schema and, when given,
    its ``answer`` (200) of ``media_type`` (errors: :func:`error_answers`, added to every route)."""
    responses: dict[str, Any] = {}
    if answer is not None:
        body = {"type": "string"} if media_type.startswith("text/") else {"type": "object"}
        responses["200"] = {"description": answer, "content": {media_type: {"schema": body}}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": responses,
    }
