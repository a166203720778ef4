"""``build_view`` / ``build_ranks`` / ``diff_views`` and ``open_source`` on hand-built records.

Every expected number is worked out by hand next to its assertion.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from test_live import ACT, GRADS, PARAMS, TEMP, build

from conftest import REPO_ROOT
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.forensics.diff import build_ranks, diff_views
from vramlens.forensics.sources import Source, SourceFormat, open_source
from vramlens.forensics.view import NO_PHASE, build_view, categories_status
from vramlens.result.timeline import Timeline, TimelineBuilder
from vramlens.simulator.report import allocated_timeline
from vramlens.trace.timeline_io import save_timeline

MiB = 1 << 20


def small_run(scale: int = 1) -> Timeline:
    """Parameters, two layers' activations, a backward temporary, then a gradient."""
    stack = "train.py:10 in main\nmodel.py:20 in forward"
    return build(
        [
            (1000 * scale, PARAMS, 0, "load", None, None),  # 0
            (3000 * scale, ACT, 1, "forward", "m.layers.0", stack),  # 1
            (2500 * scale, ACT, 2, "forward", "m.layers.1", None),  # 2
            (900 * scale, TEMP, 3, "backward", "m.layers.1", None),  # 3
            (-3000 * scale, ACT, 1, "backward", "m.layers.1", None),  # 4
            (1000 * scale, GRADS, 4, "backward", None, None),  # 5
            (-900 * scale, TEMP, 3, "backward", None, None),  # 6
            (-2500 * scale, ACT, 2, "backward", None, None),  # 7
        ],
        model="tiny",
    )


def test_view_levels_breakdown_phases_and_top_allocations() -> None:
    view = build_view(small_run(), top=3)
    # Tensor level: 1000, 4000, 6500, 7400 (peak, event 3), 4400, 5400, 4500, 2000.
    # Allocated (512 B blocks): 1000 -> 1024, 3000 -> 3072, 2500 -> 2560, 900 -> 1024:
    # 1024, 4096, 6656, 7680 (peak, event 3), ...
    levels = view.levels
    assert (levels.tensor_bytes, levels.allocated_bytes, view.peak_index) == (7400, 7680, 3)
    # Every request is under 1 MiB: one 2 MiB small-pool segment in the allocator replay.
    assert levels.replayed_reserved_bytes == 2 * MiB
    assert levels.reserved_at_dump_bytes is None and levels.device_bytes is None
    report = view.report
    assert (report.engine, report.model, report.peak_phase) == ("measured", "tiny", "backward")
    assert report.breakdown == {PARAMS: 1024, ACT: 3072 + 2560, TEMP: 1024}
    assert [(p.name, p.allocated_bytes) for p in report.phases] == [
        ("load", 1024),
        ("forward", 6656),
        ("backward", 7680),
    ]
    # Modules at the peak, allocated level: layers.1 2560 + 1024, layers.0 3072, none 1024.
    assert view.modules == (("m.layers.1", 3584), ("m.layers.0", 3072), ("", 1024))
    assert [item.nbytes for item in view.top_allocations] == [3000, 2500, 1000]
    assert view.categories == "recorded"
    assert view.steps == () and view.leaks == () and view.ooms == ()


def test_view_dict_is_the_report_contract_plus_forensics() -> None:
    data = build_view(small_run()).to_dict()
    assert data["peak"] == {"allocated_bytes": 7680, "reserved_bytes": 7680, "device_bytes": None, "phase": "backward"}
    assert sum(data["breakdown"].values()) == data["peak"]["allocated_bytes"]
    assert data["levels"]["tensor_peak_bytes"] == 7400 and data["levels"]["replayed_reserved_peak_bytes"] == 2 * MiB
    assert data["levels"]["runtime_bytes"] is None
    assert any("reserved_bytes repeats allocated" in note for note in data["assumptions"])
    assert any("device level not recorded" in note for note in data["assumptions"])
    assert data["top_allocations"][0] == {
        "event": 1,
        "bytes": 3000,
        "category": "activations",
        "module": "m.layers.0",
        "phase": "forward",
        "age_events": 2,
        "stack": ["model.py:20 in forward", "train.py:10 in main"],
    }
    assert data["leaks"] == [] and data["oom"] == [] and data["source"]["categories"] == "recorded"
    json.dumps(data)  # JSON-safe


def test_view_of_snapshot_metadata_measured_reserved_and_oom() -> None:
    timeline = build(
        [(400 * MiB, ACT, 0, None, None, None), (100 * MiB, PARAMS, 1, None, None, None)],
        source="pytorch-snapshot",
        categories="none",
        reserved_bytes=520 * MiB,
        segments_allocated_bytes=500 * MiB,
        oom=[{"event": 1, "requested_bytes": 40 * MiB, "device_free_bytes": 30 * MiB, "time_us": 9, "stream": 0}],
    )
    source = Source(path="x.pickle", format=SourceFormat.SNAPSHOT, timeline=timeline, identities=True)
    view = build_view(source, replay_allocator=False)
    assert view.report.engine == "snapshot" and view.categories == "unknown"
    # Reserved: the segments at dump (520 MiB) are above the allocated peak (500 MiB).
    assert (view.report.reserved_bytes, view.levels.replayed_reserved_bytes) == (520 * MiB, None)
    [oom] = view.ooms
    # Measured at the dump right after the OOM: 520 - 500 = 20 MiB cached; a 40 MiB request
    # needs a 40 MiB segment, 30 MiB free: short by 10 MiB, and the cache would cover it.
    assert (oom.cached_bytes, oom.shortfall_bytes) == (20 * MiB, 10 * MiB)
    assert oom.suggestions[0].change.endswith("expandable_segments:True") and oom.suggestions[0].avoids_oom


def test_base_bytes_phaseless_events_and_category_status() -> None:
    builder = TimelineBuilder()
    builder.append(0, 1000, 8, 0, -1, -1, -1)  # code 8: other
    builder.append(1, -1000, 8, 0, -1, -1, -1)
    timeline = builder.build(base_bytes=4096)
    view = build_view(timeline, replay_allocator=False)
    # Before the events 4096 B existed; the 1000 B allocation is a 1024 B block: peak 5120 B,
    # all "other" (the base is not itemised), in the only phase there is.
    assert view.report.allocated_bytes == 5120 and view.report.breakdown == {Category.OTHER: 5120}
    assert [p.name for p in view.report.phases] == [NO_PHASE] and view.report.peak_phase == NO_PHASE
    assert categories_status(timeline) == "unknown"
    assert categories_status(build([(1, ACT, 0, None, None, None)], categories="inferred")) == "inferred"
    with pytest.raises(InputError, match="has no memory events"):
        build_view(TimelineBuilder().build())


def test_open_source_reads_npz_and_both_profiler_exports(tmp_path: Path) -> None:
    save_timeline(small_run(), tmp_path / "run.npz")
    assert open_source(tmp_path / "run.npz").timeline.peak_bytes == 7400
    # Coalesced export: columns [0, PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION,
    # GRADIENT, AUTOGRAD_DETAIL, unknown] after each microsecond.
    rows = [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 700, 0, 0, 0], [0, 100, 0, 0, 0, 200, 600, 0, 0]]
    (tmp_path / "mem.json").write_text(json.dumps([[10, 11, 12], rows]))
    source = open_source(tmp_path / "mem.json")
    # Totals per timestamp: 100, 800, 900; at t=12 the -500 of activations comes before the
    # +600 of gradients, so the running total never passes the profiler's own totals.
    assert source.format is SourceFormat.PROFILER_JSON and not source.identities
    assert source.timeline.live_bytes.tolist() == [100, 800, 300, 900]
    view = build_view(source)
    assert view.levels.allocated_bytes == 900 and view.top_allocations == () and view.modules == ()
    assert view.report.breakdown == {PARAMS: 100, ACT: 200, GRADS: 600}
    # Raw rows [t_ns, action, numbytes, category]: preexisting parameter, activation created,
    # re-versioned as a gradient (INCREMENT_VERSION: -/+), then destroyed.
    raw = [[-1, 1, 64, 0], [5000, 2, 4096, 4], [6000, 3, -4096, 4], [6000, 3, 4096, 5], [9000, 4, -4096, 5]]
    with gzip.open(tmp_path / "mem.raw.json.gz", "wt") as handle:
        json.dump(raw, handle)
    source = open_source(tmp_path / "mem.raw.json.gz")
    timeline = source.timeline
    assert source.format is SourceFormat.PROFILER_RAW and timeline.time.tolist() == [0, 0, 1000, 1000, 4000]
    assert timeline.live_bytes.tolist() == [64, 4160, 64, 4160, 64]
    assert timeline.storage.tolist() == [0, 1, 1, 3, 3]  # the gradient is its own allocation


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello world", "not a known memory file"),
        (b"[1, 2, 3]", "JSON of an unknown shape"),
        (b"[[1, 2], [[0, 1]]]", "rows of 9 ints"),
        (b"[[0, 9, 10, 1]]", "action 1-4"),
        (b"{bad json", "invalid JSON"),
        (b"\x1f\x8b\x08garbage", "corrupt gzip"),
        (b"PK\x03\x04junk", "not a readable vramlens timeline"),
    ],
)
def test_unreadable_files_are_one_line_input_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "input.bin"
    path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        open_source(path)
    text = str(caught.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_missing_file_names_the_accepted_formats(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot read.*accepted: a vramlens timeline \(\.npz\)"):
        open_source(tmp_path / "missing.npz")


def _rank(path: Path, scale: int, rank: int | None = None) -> Source:
    timeline = small_run(scale)
    if rank is not None:
        timeline = build([(scale * 1024, ACT, 0, "forward", None, None)], rank=rank)
    return Source(path=str(path), format=SourceFormat.TIMELINE, timeline=timeline, identities=True)


def test_ranks_peaks_skew_and_detail_of_the_highest(tmp_path: Path) -> None:
    sources = [
        _rank(tmp_path / "run-rank1.npz", 2),
        _rank(tmp_path / "run-rank0.npz", 1),
        _rank(tmp_path / "x.npz", 3, rank=2),
    ]
    ranks = build_ranks(sources, replay_allocator=False)
    # Allocated peaks: rank 0 7680 (see above); rank 1 scale 2: 2048 + 6144 + 5120 + 2048 = 15360;
    # rank 2 (metadata rank): one 3072 B block.
    assert [(r.rank, r.allocated_bytes) for r in ranks.ranks] == [(0, 7680), (1, 15360), (2, 3072)]
    assert ranks.skew_bytes == 15360 - 3072 and ranks.max_over_median == pytest.approx(15360 / 7680)
    assert ranks.detailed_rank == 1 and ranks.detailed.path.endswith("run-rank1.npz")
    data = ranks.to_dict()
    assert data["ranks"]["detailed_rank"] == 1 and data["peak"]["allocated_bytes"] == 15360


def test_diff_rows_by_section_sorted_by_size() -> None:
    a = build_view(small_run(1), modules=100, replay_allocator=False)
    b = build_view(small_run(2), modules=100, replay_allocator=False)
    diff = diff_views(a, b)
    rows = {(row.section, row.name): row for row in diff.rows}
    allocated = rows[("peak", "allocated")]
    assert (allocated.a_bytes, allocated.b_bytes, allocated.delta_bytes) == (7680, 15360, 7680)
    assert allocated.relative == pytest.approx(1.0)
    # Categories at the peak: activations 5632 -> 2 x 3000 + 2 x 2500 = 11008 (6144 + 5120 B blocks: 11264).
    assert rows[("category", "activations")].b_bytes == 11264
    categories = [row for row in diff.rows if row.section == "category"]
    assert [abs(row.delta_bytes) for row in categories] == sorted(
        (abs(r.delta_bytes) for r in categories), reverse=True
    )
    assert rows[("module", "(no module)")].a_bytes == 1024
    assert diff.to_dict()["rows"][0]["section"] == "peak"


def snapshot_dict(conf: str = "") -> dict[str, object]:
    """A 2.1+-layout snapshot of one 20 MiB segment: 4 MiB and 6 MiB allocated, the 6 MiB freed,
    3 MiB allocated in its place, then a 30 MiB request fails with 2 MiB free on the device."""
    base = 0x7F0000000000

    def frames(line: int, name: str) -> list[dict[str, object]]:
        return [
            {"filename": "/home/u/train.py", "line": line, "name": name},
            {"filename": "/home/u/main.py", "line": 1, "name": "<module>"},
        ]

    def entry(action: str, offset: int, mib: int, time: int, line: int = 0) -> dict[str, object]:
        return {"action": action, "addr": base + offset * MiB, "size": mib * MiB, "stream": 0, "time_us": time,
                "frames": frames(line, "forward") if line else []}  # fmt: skip

    trace = [
        entry("segment_alloc", 0, 20, 1000),
        entry("alloc", 0, 4, 1001, line=10),
        entry("alloc", 4, 6, 1002, line=11),
        entry("free_requested", 4, 6, 1003),
        entry("free_completed", 4, 6, 1003),
        entry("alloc", 4, 3, 1004, line=12),
        {"action": "oom", "size": 30 * MiB, "device_free": 2 * MiB, "stream": 0, "time_us": 1005, "frames": []},
    ]
    blocks = [
        {"address": base, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated", "frames": frames(10, "forward")},
        {"address": base + 4 * MiB, "size": 3 * MiB, "requested_size": 3 * MiB, "state": "active_allocated", "frames": frames(12, "forward")},
        {"address": base + 7 * MiB, "size": 13 * MiB, "requested_size": 0, "state": "inactive", "frames": []},
    ]  # fmt: skip
    segment = {
        "device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 7 * MiB, "active_size": 7 * MiB,
        "requested_size": 7 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [], "blocks": blocks,
    }  # fmt: skip
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf}}


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_view_of_a_pytorch_snapshot(tmp_path: Path, form: str) -> None:
    path = tmp_path / f"snap.{form}"
    snapshot = snapshot_dict("expandable_segments:True")
    if form == "pickle":
        path.write_bytes(pickle.dumps(snapshot, protocol=4))
    else:
        path.write_text(json.dumps(snapshot))
    source = open_source(path)
    assert source.format is SourceFormat.SNAPSHOT and source.allocator is not None
    assert source.allocator.expandable_segments  # the run's own allocator settings drive the replay
    assert any("categories inferred" in note for note in source.notes)
    view = build_view(source)
    levels = view.levels
    # Live: 4, 10 (peak), 4, 7 MiB; whole MiB, so rounding changes nothing.
    assert (levels.tensor_bytes, levels.allocated_bytes, view.peak_index) == (10 * MiB, 10 * MiB, 1)
    # Measured: one 20 MiB segment all along; its active blocks at dump: 4 + 3 MiB.
    assert (levels.reserved_peak_bytes, levels.reserved_at_dump_bytes) == (20 * MiB, 20 * MiB)
    assert levels.allocated_at_dump_bytes == 7 * MiB
    assert view.report.engine == "snapshot" and view.report.reserved_bytes == 20 * MiB
    assert view.categories == "inferred"
    assert view.top_allocations[0].stack == ("/home/u/train.py:11 in forward", "/home/u/main.py:1 in <module>")
    [oom] = view.ooms
    # After the last allocation (event 3): 7 MiB live, 20 - 7 = 13 MiB cached (the dump follows the
    # OOM); 30 MiB needs a 30 MiB segment and 2 MiB were free: short by 28 MiB, which the 13 MiB
    # of cached blocks do not cover.
    assert (oom.event, oom.allocated_bytes, oom.cached_bytes, oom.shortfall_bytes) == (3, 7 * MiB, 13 * MiB, 28 * MiB)
    assert [(s.saves_bytes, s.avoids_oom) for s in oom.suggestions] == [(13 * MiB, False)]
    with pytest.raises(InputError, match=r"^--device: 3 is not in .*its devices: 0$"):
        open_source(path, device=3)


def _layouts() -> Any:
    """tests/snapshot/layouts.py (the snapshot fixtures by code), loaded by path."""
    spec = importlib.util.spec_from_file_location("snapshot_layouts", REPO_ROOT / "tests" / "snapshot" / "layouts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout", ["2.1+", "2.0", "1.13-segments", "json"])
def test_view_of_every_snapshot_layout(tmp_path: Path, layout: str) -> None:
    layouts = _layouts()
    snapshot = layouts.scenario_snapshot(layout)
    path = tmp_path / "scenario"
    if layout == "json":
        path.write_text(snapshot)
    else:
        path.write_bytes(pickle.dumps(snapshot, protocol=4))
    view = build_view(open_source(path))
    levels = view.levels
    assert levels.reserved_at_dump_bytes == layouts.EXPECTED["reserved"]
    # Blocks at dump: G 8192 + D 1024 + B 2048 = 11264 B, the allocated timeline's end.
    assert levels.allocated_at_dump_bytes == 11264 == int(allocated_timeline(view.timeline).live_bytes[-1])
    if layout == "1.13-segments":  # no trace: the live blocks are all there is (G + B + D)
        assert (levels.tensor_bytes, view.ooms) == (layouts.EXPECTED["end"], ())
        return
    # Requested: peak 15644 B at event 4 (layouts.py). Blocks: P 4096, G 8192, A 1024, B 2048,
    # C 512 live at the same event: 15872 B.
    assert (levels.tensor_bytes, levels.allocated_bytes, view.peak_index) == (layouts.EXPECTED["peak"], 15872, 4)
    [oom] = view.ooms
    assert (oom.requested_bytes, oom.device_free_bytes) == (10 << 30, 1 << 30)
    # 10 GiB needs a 10 GiB segment with 1 GiB free: short by 9 GiB; nothing live comes close.
    assert oom.shortfall_bytes == 9 << 30 and all(item.avoids_oom is False for item in oom.suggestions)
    assert view.categories == ("recorded" if layout in ("2.1+", "json") else "inferred")


def test_cuda_recorder_peaks_are_measured_levels() -> None:
    timeline = build(
        [(3000, ACT, 0, "forward", None, None)],
        reserved_bytes=2 * MiB,
        segments_allocated_bytes=3072,
        max_memory_allocated_bytes=5 * MiB,
        max_memory_reserved_bytes=8 * MiB,
    )
    view = build_view(timeline, replay_allocator=False)
    # torch.cuda's own peaks (here from before the events too) are the measured levels; the
    # report's reserved peak is the measured one, not the allocated peak (3072 B).
    assert (view.levels.cuda_max_allocated_bytes, view.levels.reserved_peak_bytes) == (5 * MiB, 8 * MiB)
    assert view.report.reserved_bytes == 8 * MiB and view.to_dict()["levels"]["max_memory_allocated_bytes"] == 5 * MiB
    assert any("torch.cuda.max_memory_reserved()" in note for note in view.report.assumptions)
