"""Measured runs on many processes, on CPU with two gloo processes under ``torchrun``: every rank
measures its own peak and writes its own record; rank 0 merges them (per-rank peak, skew) -
for ``vramlens.track()`` (:func:`vramlens.save_ranks`) and for ``vramlens experiment`` with the
DDP and FSDP techniques."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_hf, tiny_llama_config
from vramlens.trace.timeline_io import load_timeline

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("torchrun") is None and not
                                                   (Path(sys.executable).parent / "torchrun").exists(),
                                                   reason="needs torchrun (torch)")]  # fmt: skip
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun) if torchrun.exists() else "torchrun", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(port), *args]  # fmt: skip
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_track_on_two_ranks_writes_one_record_each_and_rank_0_merges(tmp_path: Path) -> None:
    _torchrun(str(HERE / "_torchrun_track.py"), str(tmp_path / "ranks"), cwd=tmp_path)
    merged = json.loads((tmp_path / "ranks" / "vramlens-ranks.json").read_text())
    peaks = [load_timeline(tmp_path / "ranks" / f"vramlens-rank{r}.npz").peak_bytes for r in (0, 1)]
    assert merged["world"] == 2 and merged["per_rank_peak_bytes"] == peaks
    assert peaks[1] > peaks[0]  # rank 1 ran a batch twice as large
    assert merged["skew_bytes"] == peaks[1] - peaks[0] and merged["peak_bytes"] == peaks[1]


@requires_hf
def test_experiment_ddp_and_fsdp_on_two_ranks(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama_config()))
    store = tmp_path / "store.jsonl"
    result = _torchrun("-m", "vramlens", "experiment", str(tmp_path / "config.json"), "--techniques", "ddp,fsdp",
                       "--steps", "3", "--batch", "2", "--seq", "32", "--device", "cpu", "--store", str(store),
                       "--no-simulate", cwd=tmp_path)  # fmt: skip
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    assert [row["name"] for row in rows] == ["control", "ddp", "fsdp"]
    for row in rows:
        assert row["world"] == 2 and [r["rank"] for r in row["ranks"]] == [0, 1]
        peaks = [r["measured_peak_bytes"] for r in row["ranks"]]
        assert row["measured_peak_bytes"] == max(peaks) and row["skew_bytes"] == max(peaks) - min(peaks)
    notes = {row["name"]: " ".join(row["notes"]) for row in rows}
    assert "DistributedDataParallel over 2 ranks (gloo)" in notes["ddp"] and "FSDP2 fully_shard" in notes["fsdp"]
    for rank in (0, 1):  # every rank its own record
        own = [json.loads(line) for line in (tmp_path / f"store.rank{rank}.jsonl").read_text().splitlines()]
        assert [row["rank"] for row in own] == [rank] * 3
    assert "ddp: rank 0 " in result.stdout and "skew" in result.stdout  # rank 0's report; other ranks print nothing
    assert result.stdout.count("Configuration") == 1
