"""``vramlens simulate`` and ``vramlens compare`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import requires_hf
from vramlens.cli.app import main
from vramlens.trace.timeline_io import load_timeline

pytestmark = [requires_hf, pytest.mark.hf]

_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 1024,
}


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_CONFIG))
    return str(path)


def test_simulate_json_and_timeline(config_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "run"
    code = main(["simulate", config_path, "--batch", "2", "--seq", "32", "--format", "json", "--timeline", str(target)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["engine"] == "simulate" and data["peak"]["phase"] in ("forward", "backward", "optimizer_step")
    timeline = load_timeline(tmp_path / "run.npz")
    assert len(timeline) == data["timeline"]["events"] and timeline.peak_bytes == data["timeline"]["peak_bytes"]
    assert "events written to" in captured.err


def test_compare_json_has_both_engines(config_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", config_path, "--batch", "2", "--seq", "32", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["engines"] == ["estimate", "simulate"]
    allocated = next(row for row in data["rows"] if row["section"] == "peak" and row["name"] == "allocated")
    assert abs(allocated["relative"]["simulate"]) < 0.05


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--alloc-conf", "bogus:1"], "error: alloc_conf: "),
        (["--mode", "infer", "--engine", "vllm", "--prompt", "8", "--generate", "4"], "error: engine: "),
        (["--steps", "0"], "error: "),
    ],
)
def test_errors_are_one_line(config_path: str, args: list[str], start: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", config_path, "--batch", "1", "--seq", "16", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(start) and "\n" not in err and "Traceback" not in err
