"""The estimator against every measurement committed under ``validation/measured/`` (real GPUs,
``benchmarks/gpu_truth.py``): allocated within 10% of ``max_memory_allocated``, and the safe
reserved and device figures at or above ``max_memory_reserved`` and nvidia-smi's figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramlens.estimator import estimate

MEASURED = Path(__file__).resolve().parents[2] / "validation" / "measured"


def _records() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(MEASURED.glob("*/*.json")):
        if path.name == "battery.json":
            continue
        record = json.loads(path.read_text())
        if record.get("status") == "ok":
            found.append((f"{path.parent.name}/{path.stem}", record))
    return found


RECORDS = _records()


def test_records_match_the_battery_schema() -> None:
    import sys

    sys.path.insert(0, str(MEASURED.parents[1] / "benchmarks"))
    from gpu_truth import check_record

    for name, record in RECORDS:
        assert check_record(record) == [], name


@pytest.mark.skipif(not RECORDS, reason="no GPU measurement committed under validation/measured yet")
@pytest.mark.parametrize(("name", "record"), RECORDS, ids=[name for name, _ in RECORDS])
def test_estimate_against_the_measurement(name: str, record: dict) -> None:
    report = estimate(record["workload"])
    measured = record["measured"]
    assert report.safe is not None
    assert report.allocated_bytes == pytest.approx(measured["max_allocated_bytes"], rel=0.10)
    assert report.safe.reserved_bytes >= measured["max_reserved_bytes"]
    device = measured["nvidia_smi_bytes"] or measured["device_used_bytes"]
    if device is not None:
        assert report.safe.device_bytes >= device
