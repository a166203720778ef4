"""The JSON API answers what the CLI prints for the same workload: the same JSON, the same
formatted strings, the same one-line errors, the same HTML report."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_helpers import cli_runner, web_client

from vramlens.model.catalog import catalog_entries, find_entry
from vramlens.units import format_bytes

WORKLOAD: dict[str, Any] = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "batch": 2, "seq": 1024, "recompute": "full"}
FLAGS = ["llama-3.1-8b", "--gpu", "h100-80gb", "--batch", "2", "--seq", "1024", "--recompute", "full"]
SERVING: dict[str, Any] = {"model": "qwen2.5-7b", "mode": "infer", "engine": "vllm", "gpu": "a100-80gb", "batch": 8}
SERVING_FLAGS = ["qwen2.5-7b", "--mode", "infer", "--engine", "vllm", "--gpu", "a100-80gb", "--batch", "8"]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    yield from web_client()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    return cli_runner(capsys)


def _flat(text: str) -> str:
    """Whitespace runs as one space (rich wraps long table titles)."""
    return " ".join(text.split())


def _assert_view_matches_table(view: dict[str, Any], table: str) -> None:
    lines = table.splitlines()
    assert view["title"] == lines[0]
    assert view["fit"]["text"] == lines[1]
    for row in view["levels"]:
        pattern = rf"^\s*{row['level']}\s+{re.escape(row['text'])}\s+{re.escape(row['what'])}\s*$"
        assert re.search(pattern, table, re.M), row
    assert _flat(view["breakdown"]["title"]) in _flat(table)
    for row in view["breakdown"]["rows"]:
        pattern = rf"^\s*{re.escape(row['name'])}\s+{re.escape(row['text'])}\s+{re.escape(row['share'])}\s"
        assert re.search(pattern, table, re.M), row
    for phase in view["phases"]:
        name = phase["name"] + (" <- peak" if phase["peak"] else "")
        assert re.search(rf"^\s*{re.escape(name)}\s+{re.escape(phase['text'])}\s", table, re.M), phase
    for line in view["serving"]:
        assert _flat(line) in _flat(table)
    for note in view["assumptions"]:
        assert f"  - {note}" in lines


@pytest.mark.parametrize(("workload", "flags"), [(WORKLOAD, FLAGS), (SERVING, SERVING_FLAGS)], ids=["train", "vllm"])
def test_estimate_answers_the_cli_json_and_its_strings(
    client: Any, cli: Any, workload: dict[str, Any], flags: list[str]
) -> None:
    answer = client.post("/api/estimate", json=workload)
    assert answer.status_code == 200
    status, out, _ = cli("estimate", *flags, "--format", "json")
    assert status == 0 and answer.json()["report"] == json.loads(out)
    status, table, _ = cli("estimate", *flags)
    assert status == 0
    _assert_view_matches_table(answer.json()["view"], table)


def test_view_sends_bytes_beside_each_string(client: Any) -> None:
    view = client.post("/api/estimate", json=WORKLOAD).json()["view"]
    amounts = [*view["levels"], *view["breakdown"]["rows"], *view["phases"], view["fit"]["capacity"]]
    assert amounts and all(item["text"] == format_bytes(item["bytes"]) for item in amounts)
    # the breakdown at the peak adds up to the device-level peak, as the CLI's shares do
    device = next(row["bytes"] for row in view["levels"] if row["level"] == "device")
    assert sum(row["bytes"] for row in view["breakdown"]["rows"]) == device


def test_a_repeated_request_gets_the_same_answer(client: Any) -> None:
    first = client.post("/api/estimate", json={**WORKLOAD, "batch": 3})
    again = client.post("/api/estimate", json={**WORKLOAD, "batch": 3})
    assert first.content == again.content and first.json()["report"]["workload"]["batch"] == 3


BAD_INPUTS: list[tuple[dict[str, Any], list[str]]] = [
    ({"model": "llama-3.1-8b", "batch": 0}, ["--batch", "0"]),
    ({"model": "llama-3.1-8b", "precision": "fp64"}, ["--precision", "fp64"]),
    ({"model": "llama-3.1-8b", "gpu": "80G"}, ["--gpu", "80G"]),
    ({"model": "llama-3.1-8b", "gpu": "h200-9000"}, ["--gpu", "h200-9000"]),
    ({"model": "llama-3.1-8b", "seq": "lots"}, ["--seq", "lots"]),
    ({"model": "llama-3.1-8b", "seq": 10_000_000}, ["--seq", "10000000"]),
    ({"model": "llama-3.1-8b", "mode": "infer", "kv_dtype": "int3"}, ["--mode", "infer", "--kv-dtype", "int3"]),
    ({"model": "llama-3.1-8b", "parallel": {"gpus": 2}}, ["--gpus", "2"]),
    ({"model": "llama-3.1-8b", "parallel": {"tp": 3}}, ["--tp", "3"]),
]


@pytest.mark.parametrize(("body", "flags"), BAD_INPUTS, ids=[" ".join(flags) for _, flags in BAD_INPUTS])
def test_bad_inputs_get_the_cli_one_line_message(client: Any, cli: Any, body: dict[str, Any], flags: list[str]) -> None:
    answer = client.post("/api/estimate", json=body)
    status, _, err = cli("estimate", body["model"], *flags)
    assert status == 2 and answer.status_code == 400
    assert err == f"error: {answer.json()['error']}\n"


@pytest.mark.parametrize(
    "body", [{"model": "llama-3.1-8b", "bogus": 1}, {"model": "llama-3.1-8b", "lora": {"rank": -1}}]
)
def test_workload_file_errors_are_the_cli_messages(client: Any, cli: Any, tmp_path: Path, body: dict[str, Any]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(body))
    status, _, err = cli("estimate", "-c", path)
    answer = client.post("/api/estimate", json=body)
    assert status == 2 and answer.status_code == 400
    assert err == f"error: {answer.json()['error']}\n"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{bad", "request body: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"),
        (b"[1, 2]", "request body: expected a mapping of workload keys at the top level, got list"),
        (b"\xff\xfe", "request body: not UTF-8 text; expected a JSON object of workload keys"),
    ],
)
def test_a_body_that_is_not_a_json_object_is_refused(client: Any, raw: bytes, message: str) -> None:
    answer = client.post("/api/estimate", content=raw)
    assert (answer.status_code, answer.json()) == (400, {"error": message})


def test_models_are_catalog_names_only_never_paths(client: Any, tmp_path: Path) -> None:
    missing = client.post("/api/estimate", json={"batch": 2}).json()["error"]
    assert missing == (
        "model: required; give a catalog name (GET /api/models) or an uploaded config's upload:... (POST /api/config)"
    )
    (tmp_path / "config.json").write_text(json.dumps(find_entry("llama-3.1-8b").config))  # type: ignore[union-attr]
    answer = client.post("/api/estimate", json={"model": str(tmp_path)})
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(f"model {str(tmp_path)!r} is not a catalog name (see GET /api/models)")
    close = client.post("/api/estimate", json={"model": "llama-3.1-8"}).json()["error"]
    assert close.endswith("Did you mean llama-3.1-8b, llama-3-8b, llama-3.1-70b?")
    gone = client.post("/api/estimate", json={"model": "upload:0123456789ab"}).json()["error"]
    assert gone.startswith("model: 'upload:0123456789ab' is not held by this server")


def test_catalog_and_gpu_lists(client: Any) -> None:
    models = client.get("/api/models").json()
    assert sorted(m["name"] for m in models) == sorted(e.name for e in catalog_entries())
    llama = next(m for m in models if m["name"] == "llama-3.1-8b")
    assert (llama["parameters"], llama["parameters_text"]) == (8_030_261_248, "8.03B")
    gpus = {g["name"]: g for g in client.get("/api/gpus").json()}
    assert gpus["h100-sxm-80gb"]["memory"] == {"bytes": 85_028_896_768, "text": "79.19 GiB"}


def test_plan_answers_what_vramlens_plan_prints(client: Any, cli: Any) -> None:
    answer = client.post("/api/plan", json={"workload": {"model": "llama-3.1-8b", "gpu": "h100-80gb"}, "top": 3})
    assert answer.status_code == 200
    status, out, _ = cli("plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--top", "3", "--format", "json")
    assert status == 0 and answer.json()["plan"] == json.loads(out)
    status, table, _ = cli("plan", "llama-3.1-8b", "--gpu", "h100-80gb", "--top", "3")
    view, lines = answer.json()["view"], []
    for line in table.splitlines():  # rows longer than the piped width continue on indented lines
        if line.startswith("      ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    assert [view["title"], view["searched"]] == lines[:2]
    assert len(view["rows"]) == len(lines) - 3 >= 2  # the rows the CLI prints, whatever their number
    for row, line in zip(view["rows"], lines[3:], strict=True):
        assert line.split()[:5] == [str(row["rank"]), *row["peak"]["text"].split(), *row["headroom"]["text"].split()]
        assert row["relative_step_time"] in line and row["changes"] in line


def test_plan_errors_are_the_cli_messages(client: Any, cli: Any) -> None:
    answer = client.post("/api/plan", json={"workload": {"model": "llama-3.1-8b", "mode": "infer", "gpu": "l4"}})
    status, _, err = cli("plan", "llama-3.1-8b", "--mode", "infer", "--gpu", "l4")
    assert (status, answer.status_code) == (2, 400) and err == f"error: {answer.json()['error']}\n"
    for body, message in [
        ({"workload": {"model": "llama-3.1-8b"}, "headroom": 1.5}, "headroom: must be a fraction in [0, 1)"),
        ({"workload": {"model": "llama-3.1-8b"}, "top": 0}, "top: must be an integer from 1 to 50, got 0"),
        ({"workload": "llama"}, "workload: required; a mapping of workload keys"),
        ({"workload": {}, "extra": 1}, "request body: unknown key 'extra'"),
        (
            {"workload": {"model": "llama-3.1-8b", "gpu": "l4", "parallel": {"gpus": 4096, "shard": "fsdp"}}},
            "parallel.gpus: the web planner plans up to 1024 GPUs (vramlens plan has no limit), got 4096",
        ),
    ]:
        answer = client.post("/api/plan", json=body)
        assert answer.status_code == 400 and answer.json()["error"].startswith(message)


def test_report_download_is_the_cli_html_report(client: Any, cli: Any, tmp_path: Path) -> None:
    answer = client.post("/api/report.html", json=WORKLOAD)
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["content-disposition"] == 'attachment; filename="vramlens-llama-3.1-8b.html"'
    status, _, _ = cli("estimate", *FLAGS, "--html", tmp_path / "report.html")
    assert status == 0 and answer.text == (tmp_path / "report.html").read_text(encoding="utf-8")


def test_openapi_schema_documents_every_route_and_no_cdn_page(client: Any) -> None:
    schema = client.get("/openapi.json").json()
    assert set(schema["paths"]) == {
        "/api/models", "/api/gpus", "/api/estimate", "/api/plan", "/api/report.html", "/api/config", "/api/snapshot", "/api/from",
    }  # fmt: skip
    body = schema["paths"]["/api/estimate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model"] and "fsdp" in body["properties"]["parallel"]["properties"]["shard"]["enum"]
    assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404


def test_pages_load_nothing_from_elsewhere(client: Any) -> None:
    for path in ("/", "/snapshot"):
        page = client.get(path)
        assert page.status_code == 200 and "connect-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "common.js", "snapshot.js", "app.css"):
        text = client.get(f"/static/{name}").text
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), name
    assert client.get("/static/../api.py").status_code == 404
    assert client.get("/static/missing.js").json() == {"error": "static: no file 'missing.js'"}


def test_unknown_routes_and_methods_answer_json(client: Any) -> None:
    assert client.get("/api/nothing").json() == {"error": "Not Found"}
    wrong = client.get("/api/estimate")
    assert (wrong.status_code, wrong.json()) == (405, {"error": "Method Not Allowed"})
    bad = client.post("/api/snapshot?format=xml", content=b"{}")
    assert bad.status_code == 400 and bad.json()["error"].startswith("format: String should match pattern")


def test_a_bug_answers_json_500_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("httpx2", reason="starlette's TestClient needs httpx2 (the [dev] extra)")
    from starlette.testclient import TestClient

    from vramlens.web import create_app

    def broken(report: Any) -> Any:
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr("vramlens.web.api.present_report", broken)
    with TestClient(create_app(), base_url="http://127.0.0.1", raise_server_exceptions=False) as local:
        answer = local.post("/api/estimate", json={**WORKLOAD, "batch": 5})
    assert (answer.status_code, answer.json()) == (
        500,
        {
            "error": "internal error (a bug in vramlens, please report it): ZeroDivisionError: division by zero second line"
        },
    )
