"""``vramlens plan``: table and JSON output, the impossible case, --plot, errors, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramlens.cli import main
from vramlens.estimator import estimate


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_table_lists_changes_peak_headroom_and_relative_time(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["plan", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "1", "--top", "3"], capsys)
    assert status == 0, err
    assert "plan for llama-3.1-8b on 1 x a100" in out
    assert "peak/GPU" in out and "headroom" in out and "rel. time" in out
    rows = [line for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    assert 1 <= len(rows) <= 3
    assert "parallel.offload=" in out or "optimizer=" in out or "recompute=" in out


def test_json_candidates_carry_full_workloads_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    """Each JSON entry's workload, estimated again on its own, gives the same peak and fits
    with the requested 20% headroom; entries come fastest first."""
    args = ["plan", "llama-3.2-3b", "--gpu", "rtx-4090", "--seq", "4096", "--headroom", "0.2", "--format", "json"]
    status, out, err = run(args, capsys)
    assert status == 0, err
    data: dict[str, Any] = json.loads(out)
    assert "impossible" not in data and data["candidates"]
    times = [c["relative_step_time"] for c in data["candidates"]]
    assert times == sorted(times)
    for entry in data["candidates"]:
        assert set(entry) >= {"workload", "peak", "headroom_bytes", "relative_step_time", "changes"}
        report = estimate(entry["workload"])
        assert report.device_bytes == entry["peak"]["device_bytes"]
        assert report.capacity_bytes is not None and report.device_bytes <= 0.8 * report.capacity_bytes
        assert report.fit_bytes <= report.capacity_bytes  # the safe device figure fits; headroom is against it
        assert entry["headroom_bytes"] == report.capacity_bytes - report.fit_bytes


def test_impossible_request_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # 405B on one 24 GB L4: even ZeRO-3 with everything offloaded holds two gathered layers
    # (one A100-80GB does: tests/planner/test_plan.py::test_impossible_request_names_the_smallest_setup)
    status, out, _ = run(["plan", "llama-3.1-405b", "--gpu", "l4", "--format", "json"], capsys)
    assert status == 0
    data = json.loads(out)
    assert data["candidates"] == [] and "smallest setup that fits" in data["impossible"]
    status, out, _ = run(["plan", "llama-3.1-405b", "--gpu", "l4"], capsys)
    assert "impossible: nothing fits" in out


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "plan.png"
    status, _, err = run(["plan", "llama-3.1-8b", "--gpu", "a100-80gb", "--gpus", "4", "--plot", str(target)], capsys)
    assert status == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "llama-3.2-1b"], "gpu"),
        (["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--top", "0"], "--top"),
        (["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--gpus", "two"], "--gpus"),
        (["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--headroom", "1"], "headroom"),
    ],
)
def test_errors_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(args, capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


def test_plan_does_not_import_torch() -> None:
    code = (
        "import sys; from vramlens.cli import main; "
        "main(['plan', 'llama-3.2-1b', '--gpu', 'a100-80gb', '--format', 'json']); "
        "assert 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_gpus_with_tp_keeps_the_users_layout_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """``--gpus 2 --tp 2`` is one data-parallel rank; ``--gpus 4`` alone means DDP over 4 (the
    contract refuses several ranks with shard none), and the global batch is batch x dp."""
    status, out, err = run(["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--gpus", "2", "--tp", "2"], capsys)
    assert status == 0, err
    assert "on 2 x" in out
    status, out, err = run(["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--gpus", "4", "--format", "json"], capsys)
    assert status == 0, err
    for entry in json.loads(out)["candidates"]:
        workload, parallel = entry["workload"], entry["workload"]["parallel"]
        dp = parallel["gpus"] // (parallel["tp"] * parallel["pp"] * parallel["cp"])
        assert workload["batch"] * workload["grad_accum"] * dp == 4 * 4


def test_progress_bar_appears_on_a_slow_search(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the 1 s threshold at 0 the rich bar runs (on stderr) and the table is unchanged."""
    from vramlens.cli import plan as plan_cli

    args = ["plan", "llama-3.2-1b", "--gpu", "a100-80gb", "--gpus", "2"]
    status, quiet, _ = run(args, capsys)
    monkeypatch.setattr(plan_cli, "PROGRESS_AFTER_S", -1.0)
    status_bar, shown, _ = run(args, capsys)
    assert status == status_bar == 0 and quiet == shown


def test_cheapest_prints_the_steps_and_json_matches_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    from vramlens.planner import cheapest_change

    args = ["plan", "llama-3.2-1b", "--batch", "16", "--seq", "4096", "--gpu", "rtx-4090", "--cheapest"]
    status, out, err = run(args, capsys)
    assert status == 0, err
    assert out.startswith("cheapest change for llama-3.2-1b to fit 1 x rtx-4090")
    assert out.count(" yes ") == 1  # the last step fits (which changes: the planner's, on the safe figure)
    status, out, err = run([*args, "--format", "json"], capsys)
    assert status == 0, err
    answer = cheapest_change({"model": "llama-3.2-1b", "batch": 16, "seq": 4096}, gpu="rtx-4090", gpus=1)
    assert answer is not None
    assert json.loads(out)["cheapest"] == json.loads(json.dumps(answer.to_dict()))


def test_min_gpus_answers_in_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from vramlens.planner import min_gpus

    expected = min_gpus({"model": "qwen2.5-32b", "batch": 1}, "a100-80gb")
    status, out, err = run(["plan", "qwen2.5-32b", "--batch", "1", "--gpu", "a100-80gb", "--min-gpus"], capsys)
    assert status == 0, err
    assert out.strip() == f"smallest number of a100-80gb that fits with 10% headroom: {expected}"
    status, out, _ = run(
        ["plan", "qwen2.5-32b", "--batch", "1", "--gpu", "a100-80gb", "--min-gpus", "--format", "json"], capsys
    )
    assert json.loads(out) == {"gpu": "a100-80gb", "headroom": 0.1, "min_gpus": expected}
    status, _, err = run(["plan", "qwen2.5-32b", "--gpu", "a100-80gb", "--min-gpus", "--cheapest"], capsys)
    assert status != 0 and "--cheapest, --min-gpus: give one of them" in err and "Traceback" not in err
