"""``vramlens estimate``: table, JSON and Markdown output, -c files and flags, errors, no torch import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import tiny_llama_config
from vramlens.cli import main
from vramlens.estimator import estimate
from vramlens.units import format_bytes

MODEL = "llama-3.1-8b"

#: Every key of the workload contract (shared/docs/WORKLOAD.md) with its documented default.
CONTRACT_DEFAULTS: dict[str, Any] = {
    "mode": "train",
    "gpu": None,
    "framework": "auto",
    "method": "full",
    "lora": {"rank": 16, "alpha": 32, "dropout": 0.0, "targets": "all-linear", "modules_to_save": []},
    "precision": "mixed-bf16",
    "quant": "none",
    "float8": False,
    "optimizer": "adamw",
    "optimizer_impl": "auto",
    "optimizer_in_backward": False,
    "batch": 4,
    "seq": 2048,
    "grad_accum": 1,
    "packing": False,
    "recompute": "none",
    "recompute_every": 1,
    "attention": "auto",
    "loss": "auto",
    "compile": False,
    "parallel": {
        "gpus": 1,
        "shard": "none",
        "shard_degree": None,
        "tp": 1,
        "pp": 1,
        "pp_schedule": "1f1b",
        "cp": 1,
        "ep": 1,
        "offload": "none",
    },
    "prompt": 1024,
    "generate": 256,
    "kv_dtype": "auto",
    "engine": "hf",
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 256,
    "block_size": 16,
}


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep rich from emitting colour codes or picking a width from the environment."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    status, out, err = run(["estimate", *args, "--format", "json"], capsys)
    assert status == 0, err
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_contract(data: dict[str, Any]) -> None:
    """The report contract of WORKLOAD.md, structure and types."""
    assert {"peak", "breakdown", "phases", "fits", "headroom_bytes", "assumptions", "engine", "workload"} <= set(data)
    peak = data["peak"]
    assert {"allocated_bytes", "reserved_bytes", "device_bytes", "phase"} <= set(peak)
    assert all(is_int(peak[k]) for k in ("allocated_bytes", "reserved_bytes", "device_bytes"))
    assert isinstance(peak["phase"], str)
    assert isinstance(data["breakdown"], dict) and data["breakdown"]
    assert all(isinstance(k, str) and is_int(v) for k, v in data["breakdown"].items())
    assert isinstance(data["phases"], list) and data["phases"]
    for phase in data["phases"]:
        assert {"name", "allocated_bytes", "breakdown"} <= set(phase)
        assert isinstance(phase["name"], str) and is_int(phase["allocated_bytes"])
        assert all(isinstance(k, str) and is_int(v) for k, v in phase["breakdown"].items())
    assert data["fits"] is None or isinstance(data["fits"], bool)
    assert data["headroom_bytes"] is None or is_int(data["headroom_bytes"])
    assert isinstance(data["assumptions"], list) and all(isinstance(a, str) for a in data["assumptions"])
    assert data["engine"] == "estimate"
    workload = data["workload"]
    assert set(CONTRACT_DEFAULTS) | {"model"} <= set(workload)
    for block in ("lora", "parallel"):
        assert set(CONTRACT_DEFAULTS[block]) <= set(workload[block])


def assert_invariants(data: dict[str, Any]) -> None:
    """Breakdown at the peak is the allocated level; levels are ordered."""
    peak = data["peak"]
    assert sum(data["breakdown"].values()) == peak["allocated_bytes"]
    assert peak["allocated_bytes"] <= peak["reserved_bytes"] <= peak["device_bytes"]
    by_name = {phase["name"]: phase for phase in data["phases"]}
    assert by_name[peak["phase"]]["breakdown"] == data["breakdown"]
    assert by_name[peak["phase"]]["allocated_bytes"] == peak["allocated_bytes"]
    assert max(phase["allocated_bytes"] for phase in data["phases"]) == peak["allocated_bytes"]
    for phase in data["phases"]:
        assert sum(phase["breakdown"].values()) == phase["allocated_bytes"], phase["name"]


def test_table_shows_peak_levels_categories_and_assumptions(capsys: pytest.CaptureFixture[str]) -> None:
    report = estimate({"model": MODEL})
    status, out, err = run(["estimate", MODEL], capsys)
    assert status == 0 and err == ""
    assert f"{report.peak_phase} <- peak" in out
    for level, value in (
        ("allocated", report.allocated_bytes),
        ("reserved", report.reserved_bytes),
        ("device", report.device_bytes),
    ):
        assert re.search(rf"^\s*{level}\s+{re.escape(format_bytes(value))}\s", out, re.M), level
    names = [c.value for c, b in report.breakdown.items() if b] + ["allocator_slack", "runtime"]
    for name in names:
        row = re.search(rf"^\s*{name.replace('_', ' ')}\s+[\d.]+ \w+\s+[\d.]+%\s+(█+|▏)\s*$", out, re.M)
        assert row is not None, name
    assert "no GPU given" in out
    assert re.search(r"^\s*- framework auto: .*\bhf\b", out, re.M)
    for note in report.assumptions:
        assert note in out


def test_table_with_a_gpu_that_fits_shows_the_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--gpu", "h100-80gb", "--method", "qlora", "--batch", "1", "--seq", "512"]
    report = estimate({"model": MODEL, "gpu": "h100-80gb", "method": "qlora", "batch": 1, "seq": 512})
    assert report.fits is True and report.headroom_bytes is not None and report.capacity_bytes is not None
    status, out, _ = run(["estimate", MODEL, *flags], capsys)
    assert status == 0
    expected = (
        f"fits h100-sxm-80gb ({format_bytes(report.capacity_bytes)}): headroom {format_bytes(report.headroom_bytes)}"
    )
    assert expected in out


def test_table_with_a_tiny_gpu_says_it_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    report = estimate({"model": MODEL, "gpu": "8GiB"})
    assert report.fits is False and report.headroom_bytes is not None
    status, out, _ = run(["estimate", MODEL, "--gpu", "8GiB"], capsys)
    assert status == 0
    assert f"does NOT fit 8GiB (8.00 GiB): short by {format_bytes(-report.headroom_bytes)}" in out


def test_json_matches_the_contract_and_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json([MODEL], capsys)
    assert_contract(data)
    assert_invariants(data)
    assert data["fits"] is None and data["headroom_bytes"] is None
    assert data == estimate({"model": MODEL}).to_dict()
    workload = data["workload"]
    for key, default in CONTRACT_DEFAULTS.items():  # every default of WORKLOAD.md filled in
        if isinstance(default, dict):
            assert {k: workload[key][k] for k in default} == default, key
        else:
            assert workload[key] == default, key


def test_json_with_flags_equals_the_same_workload_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--gpu", "h100-80gb", "--method", "lora", "--lora-rank", "8", "--gpus", "8", "--shard", "fsdp"]
    flags += ["--seq", "4k", "--batch", "2", "--lora-targets", "q_proj,v_proj", "--compile"]
    data = run_json([MODEL, *flags], capsys)
    workload = {
        "model": MODEL,
        "gpu": "h100-80gb",
        "method": "lora",
        "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        "parallel": {"gpus": 8, "shard": "fsdp"},
        "seq": 4096,
        "batch": 2,
        "compile": True,
    }
    assert data == estimate(workload).to_dict()
    assert_contract(data)
    assert_invariants(data)
    assert isinstance(data["fits"], bool)
    assert data["headroom_bytes"] == data["gpu"]["capacity_bytes"] - data["safe"]["device_bytes"]
    assert data["workload"]["lora"]["rank"] == 8 and data["workload"]["parallel"]["gpus"] == 8


def test_markdown_has_tables_with_the_json_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json([MODEL], capsys)
    status, out, _ = run(["estimate", MODEL, "--format", "markdown"], capsys)
    assert status == 0
    lines = out.splitlines()
    separators = [i for i, line in enumerate(lines) if re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", line)]
    assert separators and all(lines[i - 1].startswith("| ") and lines[i - 1].endswith(" |") for i in separators)
    peak = data["peak"]
    for level in ("allocated", "reserved", "device"):
        assert f"| {level} | {format_bytes(peak[f'{level}_bytes'])} |" in lines
    for category, value in data["breakdown"].items():
        assert f"| {category} | {format_bytes(value)} |" in lines
    assert f"{format_bytes(peak['device_bytes'])} per GPU" in lines[0]


def test_config_file_is_loaded_and_flags_override_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"model: {MODEL}\nbatch: 4\nseq: 1024\ncompile: true\nparallel:\n  gpus: 8\n  shard: fsdp\n  tp: 1\n"
    )
    from_file = run_json(["-c", str(path)], capsys)["workload"]
    assert (from_file["batch"], from_file["seq"], from_file["compile"]) == (4, 1024, True)
    assert from_file["parallel"]["gpus"] == 8 and from_file["parallel"]["shard"] == "fsdp"
    overridden = run_json(["-c", str(path), "--batch", "8", "--tp", "2", "--no-compile"], capsys)["workload"]
    assert (overridden["batch"], overridden["seq"], overridden["compile"]) == (8, 1024, False)
    assert overridden["parallel"] == {**from_file["parallel"], "tp": 2}


def test_json_config_file_and_model_argument_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"model": "llama-9000", "batch": 2, "lora": {"rank": 4, "alpha": 8}}))
    data = run_json([MODEL, "-c", str(path), "--method", "lora", "--lora-alpha", "16"], capsys)
    assert data["workload"]["model"] == MODEL and data["workload"]["batch"] == 2
    assert data["workload"]["lora"]["rank"] == 4 and data["workload"]["lora"]["alpha"] == 16


ERRORS: list[tuple[list[str], list[str]]] = [
    (["llama-9000"], ["model 'llama-9000'"]),
    ([MODEL, "--batch", "0"], ["batch:", "0"]),
    ([MODEL, "--optimizer", "adamq"], ["optimizer:", "adamq"]),
    ([MODEL, "--precision", "fp12"], ["precision:", "fp12"]),
    ([MODEL, "--seq", "1000000"], ["seq:", "1000000", "131072"]),
    ([MODEL, "--tp", "3", "--gpus", "3"], ["parallel.tp:", "3"]),
    ([MODEL, "--method", "lora", "--lora-rank", "0"], ["lora.rank:", "0"]),
    ([MODEL, "--mode", "infer", "--tp", "3", "--gpus", "3"], ["parallel.tp:", "KV heads"]),
    ([MODEL, "--gpu", "h100-90gb"], ["gpu:", "h100-90gb"]),
    ([], ["model:"]),
    ([MODEL, "--format", "xml"], ["--format", "xml"]),
    (["-c", "{tmp}/absent.yaml"], ["absent.yaml"]),
    (["-c", "{tmp}/unknown_key.yaml"], ["batchsize", "batch"]),
    (["-c", "{tmp}/unknown_parallel_key.yaml"], ["parallel", "tpp"]),
    (["-c", "{tmp}/broken.yaml"], ["broken.yaml", "YAML"]),
]


@pytest.mark.parametrize(("args", "expected"), ERRORS)
def test_errors_are_one_line_naming_the_key(
    args: list[str], expected: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "unknown_key.yaml").write_text(f"model: {MODEL}\nbatchsize: 3\n")
    (tmp_path / "unknown_parallel_key.yaml").write_text(f"model: {MODEL}\nparallel:\n  tpp: 2\n")
    (tmp_path / "broken.yaml").write_text("model: [\n")
    argv = ["estimate", "--format", "json", *(arg.replace("{tmp}", str(tmp_path)) for arg in args)]
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and err.strip().count("\n") == 0 and "Traceback" not in err
    for fragment in expected:
        assert fragment in err


def test_estimate_does_not_import_torch_and_prints_the_same_json() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from vramlens.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['estimate', '{MODEL}', '--explain']) == 0\n"
        f"    assert main(['estimate', '{MODEL}', '--format', 'markdown']) == 0\n"
        f"assert main(['estimate', '{MODEL}', '--format', 'json']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'matplotlib', 'safetensors') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == estimate({"model": MODEL}).to_dict()


def test_explain_lists_the_terms_that_make_each_level_and_their_sums(capsys: pytest.CaptureFixture[str]) -> None:
    report = estimate({"model": MODEL})
    terms = report.peak_terms("device")
    assert terms
    status, plain, _ = run(["estimate", MODEL], capsys)
    assert status == 0 and "what makes the peak" not in plain
    status, table, _ = run(["estimate", MODEL, "--explain"], capsys)
    assert status == 0 and "what makes the peak" in table
    # the table wraps long cells across lines, so check that every word of every term is there
    words = set(table.split())
    for term in terms:
        assert set(term.name.split()) <= words and set(term.formula.split()) <= words, term.name
        assert format_bytes(term.bytes) in table
    for level in ("allocated", "reserved", "device"):
        assert re.search(rf"= {level} peak\s+{re.escape(format_bytes(report.level_bytes(level)))}", table), level
    status, markdown, _ = run(["estimate", MODEL, "--format", "markdown", "--explain"], capsys)
    lines = markdown.splitlines()
    assert status == 0 and "| term | memory | alive | formula |" in lines
    for term in terms:
        assert f"| {term.name} | {format_bytes(term.bytes)} | {term.alive} | {term.formula} |" in lines
    for level in ("allocated", "reserved", "device"):
        total = f"| **= {level} peak** | {format_bytes(report.level_bytes(level))} |  | the sum of the terms above |"
        assert total in lines
    status, markdown, _ = run(["estimate", MODEL, "--format", "markdown"], capsys)
    assert "| term | memory | alive | formula |" not in markdown.splitlines()


#: Every enumerated value of WORKLOAD.md, by flag: these must keep working (maybe refused in context, never unknown).
DOCUMENTED_VALUES = {
    "mode": "train infer",
    "framework": "auto hf torchtitan torchtune litgpt megatron deepspeed vllm",
    "method": "full lora qlora freeze",
    "precision": "fp32 bf16 fp16 mixed-bf16 mixed-fp16",
    "quant": "none int8 nf4 nf4-dq gptq-int4 gptq-int8 awq-int4 fp8",
    "optimizer": "adamw adamw-8bit paged-adamw paged-adamw-8bit adafactor sgd lion",
    "optimizer-impl": "auto per-tensor foreach fused",
    "recompute": "none selective full offload",
    "attention": "auto flash efficient sdpa eager",
    "loss": "auto full chunked fused-linear",
    "shard": "none ddp zero1 zero2 zero3 fsdp hsdp",
    "offload": "none optimizer optimizer+params",
    "kv-dtype": "auto bf16 fp16 fp8",
    "engine": "hf vllm",
}


@pytest.mark.parametrize(
    ("flag", "value"), [(flag, value) for flag, values in DOCUMENTED_VALUES.items() for value in values.split()]
)
def test_documented_values_are_known(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["estimate", MODEL, f"--{flag}", value, "--format", "json"], capsys)
    assert "unknown value" not in err
    if status == 0:
        assert json.loads(out)["workload"]
    else:
        assert status == 2 and err.startswith("error: ") and err.strip().count("\n") == 0


def test_a_config_json_path_as_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_llama_config()))
    data = run_json([str(path), "--seq", "128"], capsys)
    assert data == estimate({"model": str(path), "seq": 128}).to_dict()
    assert_contract(data)
    assert_invariants(data)
    status, _, err = run(["estimate", str(path)], capsys)  # default seq 2048 > the config's 256 positions
    assert status == 2 and "seq:" in err and "256" in err
