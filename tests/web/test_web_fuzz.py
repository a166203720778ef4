"""Fuzzing the API from its own OpenAPI schema (hypothesis): no 500s, and every answer is what
the library (hence the CLI, which prints ``error: <message>``) says for the same workload.

Workloads are drawn key by key from the request schema in ``/openapi.json``: mostly values the
schema allows, sometimes any JSON value, sometimes an unknown key. Models are catalog names or
non-strings (a string that is not a catalog name is a path for the CLI, refused by the API).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from web_helpers import web_client

from vramlens.errors import InputError
from vramlens.estimator import estimate

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
SMALL_MODELS = ["gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    yield from web_client()


@pytest.fixture(scope="module")
def workload_schema(client: Any) -> dict[str, Any]:
    schema = client.get("/openapi.json").json()
    body: dict[str, Any] = schema["paths"]["/api/estimate"]["post"]["requestBody"]["content"]["application/json"]
    return body["schema"]


def _from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a JSON-schema node allows (bounds widened by a little), or any JSON value."""
    if "anyOf" in schema:
        return st.one_of([_from_schema(option) for option in schema["anyOf"]])
    if "enum" in schema:
        allowed = st.sampled_from(schema["enum"])
        return allowed | allowed.map(str.upper) | st.text(max_size=8)
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum", 0) - 2, 70_000) | st.integers(1, 8).map(lambda n: f"{n}k")
    if kind == "number":
        return st.floats(-0.5, 2.0) | st.floats()
    if kind == "boolean":
        return st.booleans() | st.sampled_from(["yes", "no", "maybe"])
    if kind == "object":
        return _object(schema)
    if kind == "null":
        return st.none()
    return st.text(max_size=12)


def _object(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    optional = {key: _from_schema(node) | JSON_VALUES for key, node in schema["properties"].items() if key != "model"}
    return st.fixed_dictionaries({}, optional=optional)


def _allowed(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Only values the schema allows (small numbers), for workloads that often estimate."""
    if "anyOf" in schema:
        return st.one_of([_allowed(option) for option in schema["anyOf"] if option.get("type") != "string"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(max(schema.get("minimum", 0), 1), 8)
    if kind == "number":
        return st.floats(0.5, 0.95)
    if kind == "object":
        return st.fixed_dictionaries({}, optional={k: _allowed(v) for k, v in schema["properties"].items()})
    return st.booleans() if kind == "boolean" else st.none()


def _sensible(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    keys = ("mode", "method", "precision", "optimizer", "batch", "recompute", "attention", "loss", "engine", "parallel")
    optional = {key: _allowed(schema["properties"][key]) for key in keys}
    return st.fixed_dictionaries({"model": st.sampled_from(SMALL_MODELS)}, optional=optional)


def _workloads(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return _sensible(schema) | _wild(schema)


def _wild(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    models = st.sampled_from(SMALL_MODELS) | st.sampled_from(["", " ", None, 7, ["gpt2"]])
    extra = st.dictionaries(st.sampled_from(["bogus", "batch_size", "lora_rank", "gpu_count"]), JSON_VALUES, max_size=1)
    return st.builds(lambda model, body, more: {"model": model, **body, **more}, models, _object(schema), extra)


def _not_finite(value: Any) -> Iterator[float]:
    """The NaNs and infinities in ``value``, in the order ``json.dumps`` writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _not_finite(item)
    elif isinstance(value, list):
        for item in value:
            yield from _not_finite(item)


NOT_JSON = "request body: invalid JSON: {} is not a finite number; JSON has no NaN or Infinity"


def _library(body: dict[str, Any]) -> tuple[int, Any]:
    """What the library says for ``body``: (200, report dict) or (400, the one-line message).
    A body holding NaN or an infinity is not JSON (``json.dumps`` writes it anyway): the API
    refuses it before any workload is read, naming the first such constant it meets."""
    first = next(_not_finite(body), None)
    if first is not None:
        return 400, NOT_JSON.format(json.dumps(first))
    try:
        return 200, estimate(body).to_dict()
    except InputError as error:
        return 400, str(error)


def test_estimate_fuzzed_from_the_schema(client: Any, workload_schema: dict[str, Any]) -> None:
    seen: dict[int, int] = {}

    @SETTINGS
    @given(body=_workloads(workload_schema))
    @example(body={"model": "gpt2", "bogus": math.inf})  # found by CI: not JSON, refused as such
    @example(body={"model": "gpt2", "batch": [1.0, -math.inf], "seq": math.nan})
    def check(body: dict[str, Any]) -> None:
        answer = client.post("/api/estimate", content=json.dumps(body).encode())
        status, expected = _library(body)
        seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
        assert answer.status_code == status, (body, answer.text)
        assert (answer.json()["report"] if status == 200 else answer.json()["error"]) == expected
        if status == 400:
            assert "\n" not in expected

    check()
    print(f"estimate fuzz: {seen}")
    assert seen.get(200, 0) >= 10 and seen.get(400, 0) >= 40, seen  # both kinds of answer were exercised


def test_plan_fuzzed_never_fails_inside(client: Any, workload_schema: dict[str, Any]) -> None:
    small = st.fixed_dictionaries(
        {"model": st.sampled_from(SMALL_MODELS[:3]), "gpu": st.sampled_from(["l4", "rtx-4090", "24GiB", "1GiB", "x"])},
        optional={
            "batch": st.integers(0, 16),
            "mode": st.sampled_from(["train", "infer"]),
            "seq": st.integers(1, 9000),
        },
    )
    bodies = st.fixed_dictionaries(
        {"workload": small | JSON_VALUES},
        optional={"headroom": st.floats(-1, 2) | JSON_VALUES, "top": st.integers(-1, 60) | JSON_VALUES,
                  "allow_method_change": st.booleans() | JSON_VALUES, "extra": JSON_VALUES},
    )  # fmt: skip

    @settings(SETTINGS, max_examples=40)
    @given(body=bodies)
    def check(body: dict[str, Any]) -> None:
        answer = client.post("/api/plan", content=json.dumps(body).encode())
        assert answer.status_code in (200, 400), (body, answer.text)
        assert answer.status_code == 200 or "\n" not in answer.json()["error"]

    check()


def test_uploads_of_anything_are_answered_or_refused_never_crash(client: Any) -> None:
    @SETTINGS
    @given(data=st.binary(max_size=300) | JSON_VALUES.map(lambda value: json.dumps(value).encode()))
    def check(data: bytes) -> None:
        for route in ("/api/config?name=up.json", "/api/snapshot?name=up.pickle"):
            answer = client.post(route, content=data)
            assert answer.status_code in (200, 400, 415), (route, data, answer.text)
            assert answer.status_code == 200 or "\n" not in answer.json()["error"]

    check()
