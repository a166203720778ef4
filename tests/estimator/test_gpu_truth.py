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


def test_a_battery_without_a_gpu_writes_what_did_not_run_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestration on CPU: every child (the bare context first, then each run) fails as it would
    without a GPU; battery.json says so per run and the records are written with their estimates."""
    calls: list[list[str]] = []

    def child(args: list[str], env: dict[str, str], timeout: float) -> tuple[str, str | None]:
        calls.append(args)
        return "failed", "no CUDA device"

    monkeypatch.setattr(gpu_truth, "_child", child)
    monkeypatch.setattr(gpu_truth, "BATTERY", gpu_truth.BATTERY[:2])
    gpu_truth.battery(tmp_path, budget=60, run_timeout=5, sim_workers=0)
    summary = json.loads((tmp_path / "battery.json").read_text())
    assert calls[0][0] == "--context" and summary["bare_context"] == {"status": "failed"}
    assert {run: outcome["status"] for run, outcome in summary["runs"].items()} == dict.fromkeys(
        (entry["id"] for entry in gpu_truth.BATTERY), "failed"
    )
    for entry in gpu_truth.BATTERY:
        record = json.loads((tmp_path / f"{entry['id']}.json").read_text())
        assert record["status"] == "failed" and gpu_truth.check_record(record) == []
