"""``vramlens experiment``: JSON, Markdown and the table from a user's module and from a config,
a matrix file, the store reused on a second call, the plot, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import requires_hf, tiny_llama_config
from vramlens.cli.app import main

HERE = Path(__file__).resolve().parents[1] / "experiments"
MODULE = "_tiny_module:make"
SMALL = ["--steps", "3", "--batch", "2", "--seq", "16", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["experiment", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_json_rows_then_the_store_is_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "runs.jsonl"
    args = [MODULE, "--techniques", "bf16,fused-optimizer", *SMALL, "--store", str(store), "--format", "json"]
    status, out, err = run([*args, "--plot", str(tmp_path / "e.svg")], capsys)
    assert status == 0, err
    data = json.loads(out)
    assert data["device"] == "cpu"
    assert [row["name"] for row in data["rows"]] == ["control", "bf16", "fused-optimizer"]
    required = {"name", "techniques", "measured_peak_bytes", "predicted_peak_bytes", "simulated_peak_bytes",
                "tokens_per_s", "loss"}  # fmt: skip
    assert all(required <= set(row) for row in data["rows"])
    assert data["rows"][1]["techniques"] == ["bf16"] and data["rows"][0]["predicted_peak_bytes"] is None
    assert (tmp_path / "e.svg").read_text().count('id="measured-') == 3
    status, again, err = run(args, capsys)
    assert status == 0 and err.count("(stored, skipped)") == 3
    assert json.loads(again) == data
    assert len(store.read_text().splitlines()) == 3


def test_matrix_file_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"model: {MODULE}\nsteps: 3\nbatch: 2\nseq: 16\ndevice: cpu\nruns:\n  - control\n"
                      "  - {name: Chunked, techniques: [chunked-loss]}\n")  # fmt: skip
    status, out, err = run(
        ["-c", str(matrix), "--store", str(tmp_path / "r.jsonl"), "--format", "markdown", "--trust-model-code"], capsys
    )
    assert status == 0, err
    assert out.startswith("| Configuration | Peak (MiB) |")
    assert "| Chunked |" in out and "Device: cpu" in out


@requires_hf
@pytest.mark.hf
def test_table_for_a_model_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_llama_config(torch_dtype="float32")))
    status, out, err = run([str(config), "--techniques", "bf16", *SMALL, "--store", str(tmp_path / "r.jsonl"),
                            "--no-simulate"], capsys)  # fmt: skip
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["Configuration", "Peak"]
    control = lines[2].split()
    assert control[0] == "control" and control[7].endswith("%") and control[8] == "-"  # estimated, not simulated


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([MODULE, "--techniques", "bf17"], "error: techniques: unknown technique 'bf17'; accepted: bf16,"),
        ([MODULE, "--steps", "2"], "error: steps: 2; at least 3"),
        (["--techniques", "bf16"], "error: MODEL: required"),
        ([MODULE, "-c", "m.yaml", "--techniques", "bf16"], "error: --techniques: give the runs either in the matrix"),
        ([MODULE, "--plot", "out.gif"], "error: --plot: cannot write 'out.gif'"),
        ([MODULE, "--device", "tpu"], "error: device: 'tpu'; accepted: auto, cpu, cuda, cuda:N"),
    ],
)
def test_errors_are_one_line(args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    status, out, err = run([*args, "--store", str(tmp_path / "r.jsonl")], capsys)
    assert status == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "r.jsonl").exists()
