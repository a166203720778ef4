"""Uploads: a config.json becomes a model the API estimates exactly as the CLI estimates the same
file; safetensors headers and indexes are summarised; snapshots are viewed as ``vramlens view``
views them; nothing uploaded runs."""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_helpers import cli_runner, web_client

from conftest import write_safetensors
from vramlens.categories import Category
from vramlens.model.catalog import find_entry
from vramlens.model.safetensors import read_checkpoint
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.snapshot import save_snapshot

MIB = 2**20


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    yield from web_client()


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    return cli_runner(capsys)


def _config() -> dict[str, Any]:
    entry = find_entry("qwen2.5-0.5b")
    assert entry is not None
    return entry.config


def test_uploaded_config_estimates_as_the_cli_estimates_the_file(client: Any, cli: Any, tmp_path: Path) -> None:
    raw = json.dumps(_config()).encode()
    answer = client.post("/api/config?name=config.json", content=raw)
    assert answer.status_code == 200
    upload = answer.json()
    assert upload["kind"] == "config" and upload["model"].startswith("upload:")
    assert upload["summary"]["parameters"] == find_entry("qwen2.5-0.5b").spec().num_parameters  # type: ignore[union-attr]
    assert upload["note"].startswith("config.json: ") and upload["note"].endswith(f"selected as {upload['model']}")
    workload = {"gpu": "rtx-4090", "batch": 2, "seq": 512}
    estimated = client.post("/api/estimate", json={"model": upload["model"], **workload}).json()["report"]
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_bytes(raw)
    status, out, _ = cli("estimate", folder / "config.json", "--gpu", "rtx-4090", "--batch", "2", "--seq", "512", "--format", "json")  # fmt: skip
    expected = json.loads(out)
    assert status == 0
    for key in ("peak", "breakdown", "phases", "fits", "headroom_bytes", "assumptions"):
        assert estimated[key] == expected[key], key
    plan = client.post("/api/plan", json={"workload": {"model": upload["model"], **workload}, "top": 1})
    assert plan.status_code == 200 and len(plan.json()["view"]["rows"]) == 1


def test_config_errors_name_the_upload(client: Any, cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",')
    status, _, err = cli("models", "show", path)
    answer = client.post("/api/config?name=config.json", content=path.read_bytes())
    assert (status, answer.status_code) == (2, 400)
    assert err.replace(str(path), "config.json") == f"error: {answer.json()['error']}\n"
    unknown = client.post("/api/config?name=c.json", content=b'{"model_type": "no-such-family"}')
    assert unknown.status_code == 400 and unknown.json()["error"].startswith("c.json: ")
    listed = client.post("/api/config", content=b"[1]")
    assert listed.json() == {"error": "config.json: expected a JSON object at the top level, got list"}
    empty = client.post("/api/config", content=b"")
    assert empty.status_code == 400 and empty.json()["error"].startswith("config.json: empty upload")


def test_a_file_that_is_neither_json_nor_a_safetensors_header_is_refused(client: Any) -> None:
    for data in (b"\x80\x04\x95 pickle", b"PK\x03\x04 zip", b"hello world", struct.pack("<Q", 10**9) + b"{}"):
        answer = client.post("/api/config?name=weights.bin", content=data)
        assert answer.status_code == 415, data
        assert answer.json()["error"].startswith("weights.bin: not JSON and not a safetensors header")


def test_safetensors_header_is_summarised_from_its_first_bytes(client: Any, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"embed.weight": ("BF16", [64, 32]), "norm.weight": ("F32", [32])}, {"format": "pt"})
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    answer = client.post("/api/config?name=model.safetensors", content=data[: 8 + length])
    assert answer.status_code == 200
    summary, expected = answer.json(), read_checkpoint(path).to_dict()
    for key in ("num_tensors", "total_elements", "total_bytes", "bytes_by_dtype", "elements_by_dtype"):
        assert summary[key] == expected[key], key
    assert summary["note"] == (
        "model.safetensors: safetensors header of 2 tensors, 2.08K elements, 4.12 KiB (BF16 4.00 KiB, F32 128 B)"
    )
    header = json.dumps({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}).encode()
    bad = client.post("/api/config?name=x.safetensors", content=struct.pack("<Q", len(header)) + header)
    assert bad.status_code == 400 and bad.json()["error"].startswith("x.safetensors: tensor 'w': unknown dtype 'F33'")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    short = client.post("/api/config?name=x.safetensors", content=struct.pack("<Q", len(header)) + header)
    assert short.json() == {"error": "x.safetensors: tensor 'w': 4 bytes stored but shape [2] of F32 needs 8"}


def test_safetensors_index_lists_its_shards(client: Any) -> None:
    index = {"metadata": {"total_size": 3 * 2**30}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}}  # fmt: skip
    answer = client.post("/api/config?name=model.safetensors.index.json", content=json.dumps(index).encode()).json()
    assert answer["kind"] == "safetensors-index" and answer["num_tensors"] == 3
    assert answer["shards"] == [{"file": "s1.safetensors", "tensors": 2}, {"file": "s2.safetensors", "tensors": 1}]
    assert answer["note"].startswith(
        "model.safetensors.index.json: safetensors index of 3 tensors in 2 shards, 3.00 GiB"
    )
    bad = client.post("/api/config?name=i.json", content=b'{"weight_map": {"a": 1}}')
    assert bad.json() == {"error": "i.json: 'weight_map' must map tensor names to shard file names"}


def _timeline() -> Timeline:
    """Parameters 4 MiB, then activations 1, 2, 3 MiB (peak 10 MiB), then freed: 1 ms apart."""
    builder = TimelineBuilder(time_unit="ns")
    forward = builder.code("phase", "forward")
    rows = [(4 * MIB, Category.PARAMETERS, 1)] + [(k * MIB, Category.ACTIVATIONS, 10 + k) for k in (1, 2, 3)]
    rows += [(-k * MIB, Category.ACTIVATIONS, 10 + k) for k in (3, 2, 1)]
    for index, (nbytes, category, storage) in enumerate(rows):
        builder.append(index * 1_000_000, nbytes, CATEGORY_ORDER.index(category), storage, forward, -1, -1)
    return builder.build()


def test_snapshot_is_viewed_as_vramlens_view_views_it(client: Any, cli: Any, tmp_path: Path) -> None:
    path = save_snapshot(_timeline(), tmp_path / "run.pickle")
    answer = client.post("/api/snapshot?name=run.pickle", content=path.read_bytes())
    assert answer.status_code == 200
    status, out, _ = cli("view", path, "--format", "json")
    expected = json.loads(out)
    expected["source"]["path"] = "run.pickle"
    assert status == 0 and answer.json()["view"] == expected
    status, table, _ = cli("view", path)
    assert answer.json()["summary"]["title"] == table.splitlines()[0]
    top = answer.json()["top"]
    assert [row["text"] for row in top] == ["4.00 MiB", "3.00 MiB", "2.00 MiB", "1.00 MiB"]
    assert answer.json()["summary"]["levels"][0]["text"] == "10.00 MiB"
    page = client.post("/api/snapshot?name=run.pickle&format=html", content=path.read_bytes())
    status, _, _ = cli("view", path, "--html", tmp_path / "run.html")
    assert page.status_code == 200 and page.text == (tmp_path / "run.html").read_text(encoding="utf-8")


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("pwned",))


def test_a_pickle_that_would_run_code_is_refused(client: Any, capsys: Any) -> None:
    answer = client.post("/api/snapshot?name=evil.pickle", content=pickle.dumps({"segments": [_Boom()]}))
    assert answer.status_code == 400 and answer.json()["error"].startswith("evil.pickle: ")
    assert "/tmp" not in answer.json()["error"] and "pwned" not in capsys.readouterr().out
    junk = client.post("/api/snapshot?name=../../etc/x", content=b"not a record")
    assert junk.status_code == 400 and junk.json()["error"].startswith("x: not a known memory file")
    empty = client.post("/api/snapshot", content=b"")
    assert empty.status_code == 400 and empty.json()["error"].startswith("snapshot: empty upload")
