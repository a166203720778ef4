"""An interrupted experiment resumes without duplicate or lost rows (issue 10's acceptance).

``vramlens experiment`` runs a four-run matrix of a small user module in a subprocess (each
forward sleeps, so a run lasts about half a second). As soon as the first row is in the store
the process is killed (SIGKILL, or SIGTERM with Python's default action), which lands in the
second run. Running the same command again must skip the stored rows (their lines stay
byte-identical), run the rest, and leave exactly one row per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNS = 4  # the control + bf16, fused-optimizer, chunked-loss

pytestmark = pytest.mark.slow


def _command(store: Path) -> list[str]:
    return [sys.executable, "-m", "vramlens", "experiment", "_tiny_module:make", "--techniques",
            "bf16,fused-optimizer,chunked-loss", "--steps", "3", "--batch", "2", "--seq", "16", "--device", "cpu",
            "--store", str(store), "--format", "json"]  # fmt: skip


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "TINY_MODULE_SLEEP_S": "0.15"}


def _lines(store: Path) -> list[str]:
    if not store.exists():
        return []
    text = store.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def _kill_after_first_row(store: Path, sig: signal.Signals) -> None:
    process = subprocess.Popen(_command(store), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not _lines(store) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -sig, err.decode()[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_matrix_resumes_without_duplicate_or_lost_rows(tmp_path: Path, sig: signal.Signals) -> None:
    store = tmp_path / "runs.jsonl"
    _kill_after_first_row(store, sig)
    before = _lines(store)
    assert 1 <= len(before) < RUNS  # killed during the matrix, after its first row
    done = subprocess.run(_command(store), env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _lines(store)
    assert after[: len(before)] == before  # stored runs were not run again
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == RUNS == len(set(keys))
    rows = json.loads(done.stdout)["rows"]
    assert [row["key"] for row in rows] == keys
    assert [row["name"] for row in rows] == ["control", "bf16", "fused-optimizer", "chunked-loss"]
    assert all(row["measured_peak_bytes"] > 0 for row in rows)
    assert done.stderr.count("(stored, skipped)") == len(before)  # the progress bars say so
