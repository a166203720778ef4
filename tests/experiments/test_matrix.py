"""Experiment matrices: the CLI list and YAML forms, run keys (what they hash and what they do
not), the workload each run hands the estimator, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import tiny_llama_config
from vramlens.errors import InputError
from vramlens.experiments.matrix import RunSpec, is_module_reference, load_matrix, matrix_from_list
from vramlens.experiments.techniques import parse_combo
from vramlens.model.spec import ModelSpec


def test_list_gives_the_control_then_one_run_per_item() -> None:
    matrix = matrix_from_list("llama-3.2-1b", "bf16, checkpoint+bf16", steps=4, device="cpu")
    assert [run.name for run in matrix.runs] == ["control", "bf16", "bf16+checkpoint"]
    assert all(run.steps == 4 and run.device == "cpu" for run in matrix.runs)
    assert len({run.key for run in matrix.runs}) == 3


def test_key_hashes_the_configuration_not_the_name() -> None:
    base = {"techniques": parse_combo("bf16"), "model": "llama-3.2-1b", "device": "cpu"}
    assert RunSpec(name="a", **base).key == RunSpec(name="b", **base).key
    assert RunSpec(name="a", **base).key != RunSpec(name="a", **base | {"seq": 512}).key
    assert RunSpec(name="a", **base).key != RunSpec(name="a", **base | {"device": "cuda"}).key


def test_workload_follows_the_contract_and_the_device() -> None:
    run = RunSpec(name="x", techniques=parse_combo("checkpoint+fused-optimizer"), model="llama-3.2-1b",
                  device="cpu", batch=2, seq=128, workload_extra={"attention": "efficient"})  # fmt: skip
    assert run.workload() == {
        "model": "llama-3.2-1b", "mode": "train", "framework": "hf", "precision": "fp32", "optimizer": "adamw",
        "optimizer_impl": "per-tensor", "batch": 2, "seq": 128, "attention": "efficient", "recompute": "full",
        "optimizer_in_backward": True,
    }  # fmt: skip
    cuda = RunSpec(name="x", techniques=(), model=tiny_llama_config(), device="cuda")
    workload = cuda.workload()
    assert workload is not None and workload["optimizer_impl"] == "foreach"
    assert isinstance(workload["model"], ModelSpec)
    assert RunSpec(name="x", techniques=(), model="pkg.mod:make").workload() is None


def test_module_references_are_told_apart_from_paths(tmp_path: Path) -> None:
    assert is_module_reference("pkg.models:build")
    assert not is_module_reference("llama-3.2-1b")
    assert not is_module_reference("a:b:c")
    odd = tmp_path / "a:b"
    odd.write_text("{}")
    assert not is_module_reference(str(odd))


def test_yaml_matrix_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "model: llama-3.2-1b\nsteps: 5\nseq: 64\ndevice: cpu\nworkload: {attention: eager}\nruns:\n"
        "  - control\n  - bf16+checkpoint\n  - {name: Budget, techniques: [memory-budget=0.6]}\n"
    )
    matrix = load_matrix(path, {"steps": 3, "batch": None})
    assert [run.name for run in matrix.runs] == ["control", "bf16+checkpoint", "Budget"]
    assert {run.steps for run in matrix.runs} == {3} and matrix.runs[0].seq == 64
    assert matrix.runs[2].memory_budget == 0.6 and matrix.runs[2].compiled
    assert matrix.runs[0].workload_extra == {"attention": "eager"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: m\nruns: [control, control]\n", r"^runs: 'control' and 'control' are the same configuration"),
        ("model: m\nsteps: 2\nruns: [control]\n", r"^steps: 2; at least 3"),
        ("model: m\nlr: 1\nruns: [control]\n", r"^--config: unknown key 'lr'; accepted: model, steps"),
        ("runs: [control]\n", r"^model: required"),
        ("model: m\nruns: [{techniques: [bf16], extra: 1}]\n", r"^runs: .*each run is a technique label"),
        ("model: m\noptimizer: adam\nruns: [control]\n", r"^optimizer: 'adam'; accepted: adamw, adafactor, sgd"),
        ("model: m\ndevice: tpu\nruns: [control]\n", r"^device: 'tpu'; accepted: auto, cpu, cuda, cuda:N"),
        ("[1, 2]\n", r"^--config: .* must be a mapping with a 'runs' list"),
        ("model: [\n", r"^--config: .* invalid YAML at line 2"),
    ],
)
def test_bad_matrix_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_matrix(path)
