"""The GPU truth battery's dry run (``benchmarks/gpu_truth.py --dry-run``): on CPU it lists every
run, estimates it, and writes records that match the schema; ``check_record`` names what is wrong."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_truth  # noqa: E402


def test_dry_run_writes_a_conforming_record_per_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_truth.main(["--dry-run", "--out", str(tmp_path)])
    written = sorted(path.stem for path in tmp_path.glob("*.json"))
    assert written == sorted(entry["id"] for entry in gpu_truth.BATTERY)
    for path in tmp_path.glob("*.json"):
        record = json.loads(path.read_text())
        assert gpu_truth.check_record(record) == []
        assert record["status"] == "dry-run"
        assert record["estimate"]["safe_device_bytes"] >= record["estimate"]["device_bytes"]
    assert f"{len(gpu_truth.BATTERY)} runs" in capsys.readouterr().out


def test_the_battery_covers_what_the_issue_asks() -> None:
    workloads = [entry["workload"] for entry in gpu_truth.BATTERY]
    train = [w for w in workloads if w.get("mode", "train") == "train"]
    assert {w["method"] for w in train} == {"full", "lora", "qlora"}
    assert {w["precision"] for w in train} == {"bf16", "mixed-bf16"}
    assert {w.get("recompute", "none") for w in train} == {"none", "full"}
    assert len({w["model"] for w in workloads}) == 3
    assert any(w.get("mode") == "infer" for w in workloads)
    assert {w.get("alloc_conf", "") for w in workloads} == {"", "expandable_segments:True"}
    assert len({entry["id"] for entry in gpu_truth.BATTERY}) == len(gpu_truth.BATTERY)


def _record(**changes: object) -> dict[str, object]:
    entry = gpu_truth.BATTERY[0]
    measured = dict.fromkeys(gpu_truth._FIELDS["measured"], 1)
    return {**gpu_truth._record(entry, "ok", measured=measured), **changes}


def test_check_record_names_each_problem() -> None:
    assert gpu_truth.check_record(_record()) == []
    assert gpu_truth.check_record(_record(schema="other/1")) == ["schema: 'other/1', expected 'vramlens.gpu_truth/1'"]
    assert gpu_truth.check_record(_record(measured=None)) == ["measured: required when status is ok"]
    assert gpu_truth.check_record(_record(status="odd"))[0].startswith("status: 'odd'")
    bad = _record(measured={**dict.fromkeys(gpu_truth._FIELDS["measured"], 1), "max_reserved_bytes": "1"})
    assert gpu_truth.check_record(bad) == ["measured.max_reserved_bytes: '1'"]
    assert gpu_truth.check_record({"id": "x"})[0] == "schema: missing"


def test_the_child_module_imports_without_a_gpu() -> None:
    import gpu_truth_child

    found = gpu_truth_child.environment()
    assert set(found["versions"]) >= {"torch", "transformers", "peft", "bitsandbytes"}
    assert callable(gpu_truth_child.measure_run) and callable(gpu_truth_child.simulate_runs)
