"""The estimator against every measurement committed under ``validation/measured/`` (real GPUs,
``benchmarks/gpu_truth.py``).

Per run record (status ``ok``):

* allocated within 3% of ``torch.cuda.max_memory_allocated`` (the H200 battery of 2026-11-27: every
  run within 1.2%, QLoRA without autocast included since SDPA's math backend is counted; it was
  32-46% under before);
* reserved and device between the point estimate (less 5%) and the point estimate plus the run's
  **load hole** (plus 5%). The hole is ``load_reserved - load_allocated``: the battery built its
  models with ``from_config`` on the GPU, which makes the untied LM head and frees it when the
  weights are tied, leaving a vocabulary-sized segment cached that a ``from_pretrained`` load does
  not leave. A training step reuses it (its reserved figure is the estimate's); ``generate`` is too
  small to, so it stays in ``max_memory_reserved`` and nvidia-smi (13% and 11% above the estimate,
  exactly the hole). Later batteries empty the cache after loading (hole 0);
* the safe reserved and device figures, plus the hole, at or above what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramlens.estimator import estimate

MEASURED = Path(__file__).resolve().parents[2] / "validation" / "measured"
#: The battery's results folders and what each holds (a folder lost from the tree fails here).
FOLDERS = {"2026-11-27-h200": 16}


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


def test_every_committed_battery_is_read() -> None:
    counted = {folder: sum(name.startswith(f"{folder}/") for name, _ in RECORDS) for folder in FOLDERS}
    assert counted == FOLDERS


def _load_hole(measured: dict) -> int:
    """Bytes the model's load left cached and free (see the module doc)."""
    return max(0, measured["load_reserved_bytes"] - measured["load_allocated_bytes"])


@pytest.mark.parametrize(("name", "record"), RECORDS, ids=[name for name, _ in RECORDS])
def test_estimate_against_the_measurement(name: str, record: dict) -> None:
    report = estimate(record["workload"])
    measured = record["measured"]
    hole = _load_hole(measured)
    assert report.safe is not None
    assert report.allocated_bytes == pytest.approx(measured["max_allocated_bytes"], rel=0.03)
    assert 0.95 * report.reserved_bytes <= measured["max_reserved_bytes"] <= 1.05 * (report.reserved_bytes + hole)
    assert report.safe.reserved_bytes + hole >= measured["max_reserved_bytes"]
    device = measured["nvidia_smi_bytes"] or measured["device_used_bytes"]
    if device is not None:
        assert 0.95 * report.device_bytes <= device <= 1.05 * (report.device_bytes + hole)
        assert report.safe.device_bytes + hole >= device


#: Training runs whose reserved level has a known, open gap (the 5% bounds above hold for them).
#: (The expandable full fine-tune's -3.9% of issue 20 was the autograd thread's cuBLAS workspace.)
KNOWN_RESERVED_GAPS: dict[str, str] = {}
TRAINING = [(name, record) for name, record in RECORDS if record["workload"].get("mode", "train") == "train"]


@pytest.mark.parametrize(
    ("name", "record"),
    [
        pytest.param(
            name,
            record,
            id=name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_RESERVED_GAPS[name])]
            if name in KNOWN_RESERVED_GAPS
            else [],
        )
        for name, record in TRAINING
    ],
)
def test_a_training_steps_reserved_within_2_percent(name: str, record: dict) -> None:
    """The whole-step replay on real steps: QLoRA's fp32 math-backend attention was 4.2% under
    before its score chain was written in each layer's forward (``estimator/step_layers.py``)."""
    report = estimate(record["workload"])
    measured = record["measured"]
    assert (
        0.98 * report.reserved_bytes
        <= measured["max_reserved_bytes"]
        <= 1.02 * (report.reserved_bytes + _load_hole(measured))
    )


EXPANDABLE = [
    (name, record)
    for name, record in TRAINING
    if "expandable_segments:True" in record["workload"].get("alloc_conf", "")
]


def test_the_battery_has_expandable_training_runs() -> None:
    assert len(EXPANDABLE) >= 3


@pytest.mark.parametrize(("name", "record"), EXPANDABLE, ids=[name for name, _ in EXPANDABLE])
def test_expandable_segments_reserved_within_half_a_percent(name: str, record: dict) -> None:
    """Under expandable segments a pool's reserved bytes are the pages mapped in one segment, so a
    block placed differently moves the level by a whole vocabulary-sized request: the autograd
    thread's cuBLAS workspace, made at the first backward's first matmul in the range the logits
    left, was the full fine-tune's -3.9% (issue 20; ``simulator/_blas.py``)."""
    report = estimate(record["workload"])
    assert report.reserved_bytes == pytest.approx(record["measured"]["max_reserved_bytes"], rel=0.005)
