"""``vramlens view`` and ``vramlens diff`` from the command line: hand-built records, a real
tracked CPU training step, and torch profiler memory exports of a real CPU run."""

from __future__ import annotations

import gzip
import itertools
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

from vramlens.categories import Category
from vramlens.cli.app import main
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.simulator.report import allocated_timeline
from vramlens.trace.timeline_io import save_timeline

PARAMS, ACT, TEMP, GRADS = Category.PARAMETERS, Category.ACTIVATIONS, Category.TEMPORARY, Category.GRADIENTS


def small_run(scale: int = 1) -> Timeline:
    """Parameters, two layers' activations, a backward temporary, then a gradient (the same run
    as tests/report/test_view.py: allocated peak 7680 B x scale in backward)."""
    builder = TimelineBuilder()
    stack = builder.code("stack", "train.py:10 in main\nmodel.py:20 in forward")
    events = [
        (1000, PARAMS, 0, "load", None, -1),
        (3000, ACT, 1, "forward", "m.layers.0", stack),
        (2500, ACT, 2, "forward", "m.layers.1", -1),
        (900, TEMP, 3, "backward", "m.layers.1", -1),
        (-3000, ACT, 1, "backward", "m.layers.1", -1),
        (1000, GRADS, 4, "backward", None, -1),
        (-900, TEMP, 3, "backward", None, -1),
        (-2500, ACT, 2, "backward", None, -1),
    ]
    for time, (nbytes, category, storage, phase, module, code) in enumerate(events):
        builder.append(
            time, nbytes * scale, CATEGORY_ORDER.index(category), storage, builder.code("phase", phase),
            builder.code("module", module), code,
        )  # fmt: skip
    return builder.build(metadata={"model": "tiny"})


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_view_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_timeline(small_run(), tmp_path / "run.npz")
    code, out, err = run(capsys, "view", str(path))
    assert code == 0, err
    # The allocated peak of small_run is 7680 B = 7.50 KiB, in backward (test_view.py).
    assert "tiny - measured (vramlens-timeline): peak 7.50 KiB allocated in backward" in out
    for section in ("memory levels", "by module at the peak", "largest allocations live at the peak"):
        assert section in out
    assert "model.py:20 forward" in out  # innermost frame of the largest allocation, shortened
    code, out, err = run(capsys, "view", str(path), "--format", "json", "--no-replay", "--top", "2")
    data = json.loads(out)
    assert code == 0 and data["peak"]["allocated_bytes"] == 7680 and len(data["top_allocations"]) == 2
    assert data["levels"]["replayed_reserved_peak_bytes"] is None


def test_view_of_several_ranks_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = save_timeline(small_run(1), tmp_path / "run.rank0.npz")
    second = save_timeline(small_run(2), tmp_path / "run.rank1.npz")
    code, out, _ = run(capsys, "view", str(first), str(second))
    # Peaks 7680 and 15360 B: skew 7.50 KiB, max/median 15360 / 11520.
    assert code == 0 and "skew: 7.50 KiB (max - min), max/median 1.333; details of rank 1" in out
    code, out, _ = run(capsys, "view", str(first), str(second), "--format", "json")
    assert code == 0 and [r["rank"] for r in json.loads(out)["ranks"]["per_rank"]] == [0, 1]
    code, out, _ = run(capsys, "diff", str(first), str(second), "--format", "json")
    rows = json.loads(out)["rows"]
    allocated = next(row for row in rows if row["section"] == "peak" and row["name"] == "allocated")
    assert code == 0 and (allocated["delta_bytes"], allocated["relative"]) == (7680, 1.0)
    code, out, _ = run(capsys, "diff", str(first), str(second))
    assert code == 0 and "+100.0%" in out and "m.layers.1" in out


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing.npz", None, "cannot read"),
        ("notes.txt", b"just text", "not a known memory file"),
        ("broken.json", b"[[1, 2], [[0]]]", "rows of 9 ints"),
    ],
)
def test_bad_files_give_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes | None, fragment: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    for command in (["view", str(path)], ["diff", str(path), str(path)]):
        code, _, err = run(capsys, *command)
        line = err.strip()
        assert code == 2 and line.startswith(f"error: {path}: ") and fragment in line
        assert "\n" not in line and "Traceback" not in line and "accepted:" in line


def _training(torch: Any, kept: list[Any] | None = None) -> tuple[Any, Any, Any, Any]:
    """A 64-256-64 MLP, AdamW, a batch of 32, and a function that runs one training step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters())
    inputs = torch.randn(32, 64)

    def step() -> None:
        loss = model(inputs).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if kept is not None:
            kept.append(model(inputs))  # a leak: one output (and its graph) kept per step

    return model, optimizer, inputs, step


def test_view_of_a_real_tracked_cpu_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from vramlens.trace.tracker import track

    kept: list[Any] = []
    model, optimizer, inputs, step = _training(torch, kept)
    with track(model, optimizer, inputs, capture_stacks=True) as tracker:
        for _ in range(4):
            step()
    timeline = tracker.timeline({"model": "mlp"})
    path = save_timeline(timeline, tmp_path / "mlp.npz")
    code, out, err = run(capsys, "view", str(path), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["levels"]["tensor_peak_bytes"] == tracker.peak
    assert data["peak"]["allocated_bytes"] == allocated_timeline(timeline).peak_bytes
    assert sum(data["breakdown"].values()) == data["peak"]["allocated_bytes"]
    assert data["steps"]["found_by"] == "end of each optimizer_step" and data["steps"]["count"] == 4
    # The kept outputs: relu output (32 x 256 x 4 B = 32 KiB, saved for backward) and the final
    # output (32 x 64 x 4 B = 8 KiB) per step, allocated on the line that appends them.
    [leak] = data["leaks"]
    assert leak["bytes_per_step"] == 40 * 1024 and "in step" in leak["stack"][0]
    assert data["top_allocations"][0]["bytes"] >= data["top_allocations"][-1]["bytes"]
    del kept


@pytest.mark.parametrize("suffix", [".json", ".raw.json.gz"])
def test_view_of_torch_profiler_memory_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    *_, step = _training(torch)
    path = tmp_path / f"memory{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # export_memory_timeline is deprecated upstream
        with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
        ) as prof:
            for _ in range(2):
                step()
        prof.export_memory_timeline(str(path), device="cpu")
    if suffix == ".json":
        _, sizes = json.loads(path.read_text())
        expected = max(sum(row) for row in sizes)  # the profiler's own peak: its largest total
    else:
        with gzip.open(path, "rt") as handle:
            rows = json.load(handle)
        expected = max(itertools.accumulate(row[2] for row in rows))  # running total of its events
    code, out, err = run(capsys, "view", str(path), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["levels"]["tensor_peak_bytes"] == expected
    assert data["source"]["categories"] == "inferred" and data["engine"] == "measured"
    # AdamW on a 64-256-64 MLP: two moments of its 33,088 parameters, 2 x 132,352 B, live at the peak.
    assert data["breakdown"]["optimizer_state"] >= 2 * 132_352


def _snapshot(tmp_path: Path) -> Path:
    """A 2.1+ snapshot: 4 and 6 MiB allocated, the 6 MiB freed, then a 20 MiB request fails with
    1 MiB free (the same shape as tests/report/test_view.py's, without frames)."""
    base, mib = 0x7F0000000000, 1 << 20
    trace = [
        {"action": action, "addr": base + offset * mib, "size": size * mib, "stream": 0, "time_us": time}
        for action, offset, size, time in [
            ("segment_alloc", 0, 20, 1), ("alloc", 0, 4, 2), ("alloc", 4, 6, 3), ("free_completed", 4, 6, 4),
        ]
    ]  # fmt: skip
    trace.append({"action": "oom", "size": 20 * mib, "device_free": mib, "stream": 0, "time_us": 5})
    block = {"address": base, "size": 4 * mib, "requested_size": 4 * mib, "state": "active_allocated"}
    segment = {"device": 0, "address": base, "total_size": 20 * mib, "stream": 0, "blocks": [block]}
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]}, protocol=4))
    return path


def test_view_of_a_snapshot_with_an_oom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _snapshot(tmp_path)
    code, out, err = run(capsys, "view", str(path))
    assert code == 0, err
    # Peak 10 MiB; at the OOM 4 MiB live in a 20 MiB segment: 16 MiB cached; 20 MiB needs a
    # 20 MiB segment with 1 MiB free: short by 19 MiB.
    assert "oom - snapshot (pytorch-snapshot): peak 10.00 MiB allocated" in out
    assert "OOM 1: requested 20.00 MiB with 1.00 MiB free on the device" in out
    assert "cached (unallocated) 16.00 MiB" in out and "short by 19.00 MiB" in out
    code, out, _ = run(capsys, "view", str(path), "--format", "json")
    data = json.loads(out)
    assert data["engine"] == "snapshot" and data["peak"]["reserved_bytes"] == 20 << 20
    assert data["oom"][0]["suggestions"][0]["saves_bytes"] == 16 << 20


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "ran"))


def test_a_malicious_pickle_is_refused_without_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Evil(marker)]}, protocol=4))
    code, _, err = run(capsys, "view", str(path))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not marker.exists()


def _many_modules(scale: int, modules: int = 30) -> Timeline:
    """One allocation per module (module k: (k + 1) x 100 B x scale), all live at the end."""
    builder = TimelineBuilder()
    forward = builder.code("phase", "forward")
    for k in range(modules):
        builder.append(
            k, (k + 1) * 100 * scale, CATEGORY_ORDER.index(ACT), k, forward, builder.code("module", f"m.{k}"), -1
        )
    return builder.build()


def test_diff_prints_the_top_rows_with_totals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """30 modules differ: the table shows the 20 largest differences (--top 20 by default), one row
    summing the 10 others, and each section's total; it used to print every module."""
    a = save_timeline(_many_modules(1), tmp_path / "a.npz")
    b = save_timeline(_many_modules(2), tmp_path / "b.npz")
    code, out, _ = run(capsys, "diff", str(a), str(b), "--no-replay")
    assert code == 0
    modules = [line for line in out.splitlines() if line.strip().startswith("module")]
    assert len(modules) == 22  # 20 rows, "(10 more ...)", "total"
    assert modules[0].split()[1] in ("m.28", "m.29") and "(10 more; --top to show)" in modules[20]
    # allocated bytes (512-byte blocks): the total of every module is the allocated peak of each run
    peak = next(line for line in out.splitlines() if line.strip().startswith("peak") and "allocated" in line)
    assert modules[21].split()[1] == "total" and modules[21].split()[2:6] == peak.split()[2:6]
    code, out, _ = run(capsys, "diff", str(a), str(b), "--no-replay", "--top", "5")
    assert len([line for line in out.splitlines() if line.strip().startswith("module")]) == 7
    code, out, _ = run(capsys, "diff", str(a), str(b), "--no-replay", "--format", "json")
    assert len([row for row in json.loads(out)["rows"] if row["section"] == "module"]) == 30
