"""``--from FILE``: a run config as the workload's base in estimate, plan and simulate; flags override;
the report's assumptions say how the file was read; the web API reads uploads the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vramlens.cli import main
from vramlens.estimator import estimate
from vramlens.workload.sources import read_run_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(capsys: Any, *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    "name", sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".yml", ".yaml", ".json", ".sh"))
)
def test_every_example_estimates_like_its_keys(capsys: Any, name: str) -> None:
    source = read_run_config(EXAMPLES / name)
    model = [] if "model" in source.keys else ["llama-3.1-8b"]
    status, out, err = _run(capsys, "estimate", *model, "--from", EXAMPLES / name, "--gpu", "h200", "--format", "json")
    assert status == 0, err
    data = json.loads(out)
    expected = estimate({"model": "llama-3.1-8b", **source.keys}, gpu="h200")
    assert data["peak"]["device_bytes"] == expected.device_bytes
    assert data["assumptions"][: len(source.assumptions())] == list(source.assumptions())
    assert data["source"]["format"] == source.format


def test_flags_override_the_file_and_the_note_says_so(capsys: Any) -> None:
    status, out, err = _run(capsys, "estimate", "--from", EXAMPLES / "axolotl-qlora.yml", "--batch", "1",
                            "--format", "json")  # fmt: skip
    assert status == 0, err
    data = json.loads(out)
    assert data["workload"]["batch"] == 1 and data["workload"]["seq"] == 4096
    assert "axolotl micro_batch_size: 2 -> batch 2 (overridden by a flag)" in data["assumptions"]
    assert "axolotl sequence_len: 4096 -> seq 4096" in data["assumptions"]


def test_table_and_markdown_show_the_reading(capsys: Any) -> None:
    for fmt in ("table", "markdown"):
        status, out, _ = _run(capsys, "estimate", "llama-3.1-8b", "--from", EXAMPLES / "ds_config_zero3_offload.json",
                              "--format", fmt)  # fmt: skip
        assert status == 0
        assert "read ds_config_zero3_offload.json as deepspeed" in out
        assert "deepspeed zero_optimization.stage: 3 -> parallel.shard zero3" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", EXAMPLES / "accelerate-fsdp.yaml"], "error: model: accelerate-fsdp.yaml names no model; give MODEL"),
        (["llama-3.1-8b", "--from", EXAMPLES / "trl-sft.sh", "-c", EXAMPLES / "trl-sft.sh"],
         "error: --from and -c/--config: give one workload base"),
        (["llama-3.1-8b", "--from-format", "trl"], "error: --from-format: give the file with --from FILE"),
        (["--from", "/nonexistent/run.yaml"], "error: /nonexistent/run.yaml: cannot read"),
    ],
)  # fmt: skip
def test_errors_are_one_line(capsys: Any, args: list[Any], message: str) -> None:
    status, _, err = _run(capsys, "estimate", *args)
    assert status == 2 and err.count("\n") == 1 and err.startswith(message), err


def test_plan_and_simulate_take_from(capsys: Any) -> None:
    status, out, err = _run(capsys, "plan", "--from", EXAMPLES / "axolotl-qlora.yml", "--gpu", "rtx-4090", "--top", "2")
    assert status == 0, err
    assert "  - read axolotl-qlora.yml as axolotl" in out.splitlines()
    status, out, err = _run(capsys, "plan", "--from", EXAMPLES / "axolotl-qlora.yml", "--gpu", "rtx-4090",
                            "--format", "json", "--top", "1")  # fmt: skip
    assert status == 0 and json.loads(out)["source"]["format"] == "axolotl"


@pytest.fixture
def client() -> Iterator[Any]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "web"))
    from web_helpers import web_client

    yield from web_client()


def test_web_upload_reads_like_from(client: Any) -> None:
    text = (EXAMPLES / "torchtune-lora.yaml").read_bytes()
    answer = client.post("/api/from?name=torchtune-lora.yaml", content=text)
    assert answer.status_code == 200
    data = answer.json()
    source = read_run_config(EXAMPLES / "torchtune-lora.yaml")
    assert data["assumptions"] == list(source.assumptions())
    assert data["keys"]["model"] == "llama-3.1-8b"
    estimated = client.post("/api/estimate", json=data["keys"]).json()
    assert estimated["report"]["peak"]["device_bytes"] == estimate(dict(source.keys)).device_bytes
    bad = client.post("/api/from?name=x.yaml", content=b"foo: 1\n")
    assert bad.status_code == 400 and bad.json()["error"].startswith("x.yaml: not a run config vramlens knows")
