"""JSON schemas of the API's request bodies, for the OpenAPI document (``/openapi.json``).

The workload schema describes the contract of ``WORKLOAD.md`` (its keys, and the accepted
values of each enum key, taken from :mod:`vramlens.workload.options`). It documents; it does
not validate: bodies are validated by :func:`vramlens.workload.load_workload`, so a bad value
gets the same one-line message as on the command line (400 ``{"error": ...}``), never a
schema-validator's report. Token counts also accept strings such as ``"8k"``, and every enum
accepts its values in any case, as the loader does.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final

from vramlens.workload._strings import MAX_ALLOC_CONF_CHARS, MAX_VERSION_CHARS
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS
from vramlens.workload.options import (
    AttentionImpl,
    Engine,
    Framework,
    FsdpWrap,
    KvDtype,
    LossImpl,
    Method,
    Mode,
    Offload,
    OptimizerImpl,
    OptimizerName,
    PipelineSchedule,
    Precision,
    Quant,
    Recompute,
    Shard,
)
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


_TOP: Final[dict[str, dict[str, Any]]] = {
    "model": {"type": "string", "description": "a catalog name (GET /api/models) or an upload:... from /api/config"},
    "mode": _enum(Mode),
    "gpu": _nullable({"type": "string", "description": "GET /api/gpus, or a size such as '24GiB'"}),
    "framework": _enum(Framework),
    "method": _enum(Method),
    "precision": _enum(Precision),
    "quant": _enum(Quant),
    "float8": _FLAG,
    "optimizer": _enum(OptimizerName),
    "optimizer_impl": _enum(OptimizerImpl),
    "optimizer_in_backward": _FLAG,
    "batch": _int("batch"),
    "seq": _tokens("seq"),
    "grad_accum": _int("grad_accum"),
    "packing": _FLAG,
    "recompute": _enum(Recompute),
    "recompute_every": _int("recompute_every"),
    "attention": _enum(AttentionImpl),
    "loss": _enum(LossImpl),
    "compile": _FLAG,
    "moe_capacity_factor": _nullable(_number("moe_capacity_factor")),
    "fsdp_wrap": _enum(FsdpWrap),
    "prompt": _tokens("prompt"),
    "generate": _tokens("generate"),
    "context": _nullable(_tokens("context")),
    "kv_dtype": _enum(KvDtype),
    "engine": _enum(Engine),
    "gpu_memory_utilization": _number("gpu_memory_utilization"),
    "max_num_seqs": _int("max_num_seqs"),
    "block_size": _int("block_size"),
    "max_num_batched_tokens": _nullable(_tokens("max_num_batched_tokens")),
    "allow_long_context": _FLAG,
    "alloc_conf": {
        "type": "string",
        "maxLength": MAX_ALLOC_CONF_CHARS,
        "description": "PYTORCH_CUDA_ALLOC_CONF, e.g. 'expandable_segments:True'",
    },
    "versions": {
        "type": "object",
        "properties": {
            package: {"type": "string", "maxLength": MAX_VERSION_CHARS, "examples": [CURRENT[package]]}
            for package in PACKAGES
        },
        "additionalProperties": False,
        "description": "library versions of the run, e.g. {'transformers': '4.35', 'vllm': '0.6'}",
    },
}
_LORA: Final[dict[str, dict[str, Any]]] = {
    "rank": _int("lora.rank"),
    "alpha": _number("lora.alpha"),
    "dropout": _number("lora.dropout"),
    "targets": {"anyOf": [{"type": "string", "enum": ["all-linear"]}, {"type": "array", "items": {"type": "string"}}]},
    "modules_to_save": {"type": "array", "items": {"type": "string"}},
}
_PARALLEL: Final[dict[str, dict[str, Any]]] = {
    "gpus": _int("parallel.gpus"),
    "shard": _enum(Shard),
    "shard_degree": _nullable(_int("parallel.shard_degree")),
    "tp": _int("parallel.tp"),
    "pp": _int("parallel.pp"),
    "pp_schedule": _enum(PipelineSchedule),
    "cp": _int("parallel.cp"),
    "ep": _int("parallel.ep"),
    "offload": _enum(Offload),
}


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
