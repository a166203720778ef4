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

from vramlens.estimate.versions import CURRENT, PACKAGES
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

__all__ = ["ERROR_SCHEMA", "PLAN_SCHEMA", "WORKLOAD_SCHEMA", "openapi_body", "workload_schema"]

_TOKENS: Final = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "examples": ["8k"]}]}
_FLAG: Final = {"type": "boolean"}
_NUMBER: Final = {"type": "number"}


def _enum(cls: type[Enum]) -> dict[str, Any]:
    return {"type": "string", "enum": [str(member.value) for member in cls]}


def _int(minimum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum}


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
    "batch": _int(1),
    "seq": _TOKENS,
    "grad_accum": _int(1),
    "packing": _FLAG,
    "recompute": _enum(Recompute),
    "recompute_every": _int(1),
    "attention": _enum(AttentionImpl),
    "loss": _enum(LossImpl),
    "compile": _FLAG,
    "moe_capacity_factor": _nullable(_NUMBER),
    "fsdp_wrap": _enum(FsdpWrap),
    "prompt": _TOKENS,
    "generate": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
    "context": _nullable(_TOKENS),
    "kv_dtype": _enum(KvDtype),
    "engine": _enum(Engine),
    "gpu_memory_utilization": _NUMBER,
    "max_num_seqs": _int(1),
    "block_size": _int(1),
    "max_num_batched_tokens": _nullable(_TOKENS),
    "allow_long_context": _FLAG,
    "alloc_conf": {"type": "string", "description": "PYTORCH_CUDA_ALLOC_CONF, e.g. 'expandable_segments:True'"},
    "versions": {
        "type": "object",
        "properties": {package: {"type": "string", "examples": [CURRENT[package]]} for package in PACKAGES},
        "additionalProperties": False,
        "description": "library versions of the run, e.g. {'transformers': '4.35', 'vllm': '0.6'}",
    },
}
_LORA: Final[dict[str, dict[str, Any]]] = {
    "rank": _int(1),
    "alpha": _NUMBER,
    "dropout": _NUMBER,
    "targets": {"anyOf": [{"type": "string", "enum": ["all-linear"]}, {"type": "array", "items": {"type": "string"}}]},
    "modules_to_save": {"type": "array", "items": {"type": "string"}},
}
_PARALLEL: Final[dict[str, dict[str, Any]]] = {
    "gpus": _int(1),
    "shard": _enum(Shard),
    "shard_degree": _nullable(_int(1)),
    "tp": _int(1),
    "pp": _int(1),
    "pp_schedule": _enum(PipelineSchedule),
    "cp": _int(1),
    "ep": _int(1),
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


def openapi_body(schema: dict[str, Any], *, answer: str | None = None) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body is read by hand: its schema and the error
    answers (and, for a route FastAPI does not document itself, its ``answer``)."""
    error = {"description": "bad input: the one-line message the CLI prints", "content": {"application/json": {"schema": ERROR_SCHEMA}}}  # fmt: skip
    responses: dict[str, Any] = {"400": error, "413": {**error, "description": "request body over 10 MiB"}}
    if answer is not None:
        responses["200"] = {"description": answer, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": responses,
    }
