"""Snapshot -> Timeline: pairing with address reuse, pre-existing and ghost blocks, the ring
buffer, OOMs, annotations and vramlens tags. Expected values are worked by hand in comments."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest
from layouts import EXPECTED, T0, reference_peak_end, scenario_snapshot, synthetic_snapshot

from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.snapshot import load_snapshot, snapshot_timeline

A, B, C = 0x7000_0000_0000, 0x7000_0000_1000, 0x7000_0000_2000


def _entry(action: str, addr: int, size: int, t: int | None = None, meta: str = "", **extra: Any) -> dict[str, Any]:
    entry = {"action": action, "addr": addr, "size": size, "stream": 0, "user_metadata": meta, **extra}
    if t is not None:
        entry["time_us"] = T0 + t
    return entry


def _segment(address: int, total: int, blocks: list[tuple[int, int, int, str]]) -> dict[str, Any]:
    """A segment with blocks (address, size, requested, state)."""
    rows = [{"address": a, "size": s, "requested_size": r, "state": st} for a, s, r, st in blocks]
    return {"device": 0, "address": address, "total_size": total, "stream": 0, "blocks": rows}


def _timeline(entries: list[dict[str, Any]], **top: Any) -> Timeline:
    return load_snapshot({"device_traces": [entries], **top}).timeline()


def _live(timeline: Timeline) -> list[int]:
    return timeline.live_bytes.tolist()


def _names(timeline: Timeline, column: str, table: str) -> list[str | None]:
    names = getattr(timeline, table)
    return [names[code] if code >= 0 else None for code in getattr(timeline, column).tolist()]


def test_scenario_events_labels_and_metadata() -> None:
    timeline = load_snapshot(scenario_snapshot("2.1+")).timeline()
    # P (orphan, 4096) and G (ghost, 8000) first, then the trace: see layouts.py.
    assert _live(timeline) == [4096, 12096, 13096, 15144, 15644, 14644, 10548, 11448, 10948]
    assert timeline.storage.tolist() == [0, 1, 2, 3, 4, 2, 0, 5, 4]
    categories = [CATEGORY_ORDER[c].value for c in timeline.category.tolist()]
    # B was annotated as optimizer state after its allocation (the "annotate" entry).
    assert categories == [
        "other", "other", "activations", "optimizer_state", "temporary", "activations", "other", "gradients", "temporary"
    ]  # fmt: skip
    # Tags first; untagged frees fall in the annotated ProfilerStep scopes by time.
    assert _names(timeline, "phase", "phases") == [
        None, None, "forward", "forward", "forward", "backward", "ProfilerStep#3", "backward", "ProfilerStep#4"
    ]  # fmt: skip
    assert _names(timeline, "module", "modules") == [
        None, None, "model.fc", "model", "model.fc", None, None, "model.fc", None
    ]  # fmt: skip
    assert timeline.time.tolist() == [0, 0, 10_000, 20_000, 30_000, 41_000, 51_000, 60_000, 81_000]
    assert timeline.time_unit == "ns" and timeline.level == "tensor"
    stacks = _names(timeline, "stack", "stacks")
    assert stacks[1] == "/work/main.py:11 in main\n/work/load_state_dict.py:10 in load_state_dict"  # the ghost's block
    assert stacks[0] is None and stacks[6] is None  # P: allocation unknown, free without frames
    meta = timeline.metadata
    assert json.loads(json.dumps(meta)) == meta
    assert meta["categories"] == "recorded" and meta["layout"] == "2.1+" and meta["device"] == 0
    assert meta["reserved_bytes"] == meta["reserved_peak_bytes"] == meta["reserved_at_peak_bytes"] == 22 << 20
    assert meta["segments_allocated_bytes"] == 8192 + 1024 + 2048
    assert meta["segments_requested_bytes"] == timeline.end_bytes == EXPECTED["end"]
    assert meta["preexisting_bytes"] == EXPECTED["preexisting"] and meta["trace_overflowed"] is True
    assert meta["unknown_actions"] == {"workspace_snapshot": 1}
    # The OOM (entry 9) comes after 8 timeline events: P, G, A, B, C, free A, free P, D.
    assert meta["oom"] == [
        {"event": 7, "time_us": T0 + 70, "requested_bytes": 10 << 30, "device_free_bytes": 1 << 30, "stream": 0}
    ]
    assert meta["annotations"][-1] == {
        "name": "vramlens;category=optimizer_state",
        "stage": "annotate",
        "time_us": T0 + 85,
    }
    assert [a["name"] for a in meta["annotations"][:3]] == ["ProfilerStep#3"] * 2 + ["ProfilerStep#4"]


def test_snapshot_timeline_function_equals_method() -> None:
    snapshot = load_snapshot(scenario_snapshot("2.0"))
    assert snapshot_timeline(snapshot).nbytes.tolist() == snapshot.timeline().nbytes.tolist()
    assert snapshot.timeline().metadata["categories"] == "none"
    assert snapshot.timeline().time.tolist() == list(range(EXPECTED["events"]))  # "event" order


def test_address_reuse_gives_a_new_storage_each_time() -> None:
    entries = [
        _entry("alloc", A, 100),
        _entry("free_completed", A, 100),
        _entry("alloc", A, 200),
        _entry("alloc", B, 50),
        _entry("free_completed", A, 200),
        _entry("alloc", A, 300),
    ]
    timeline = _timeline(entries)
    assert timeline.nbytes.tolist() == [100, -100, 200, 50, -200, 300]
    assert timeline.storage.tolist() == [0, 0, 1, 2, 1, 3]
    assert (timeline.peak_bytes, timeline.end_bytes) == (350, 350)
    assert timeline.metadata["trace_overflowed"] is False and timeline.metadata["preexisting_bytes"] == 0


def test_free_requested_is_not_the_free_when_completions_exist() -> None:
    entries = [
        _entry("alloc", A, 100, 0),
        _entry("free_requested", A, 100, 1),
        _entry("alloc", B, 40, 2),
        _entry("free_completed", A, 100, 3),
    ]
    timeline = _timeline(entries)
    # The memory comes back at free_completed (t=3), after B's allocation: peak 140.
    assert _live(timeline) == [100, 140, 40] and timeline.time.tolist() == [0, 2000, 3000]


def test_free_requested_is_the_free_in_traces_without_completions() -> None:
    # skip_actions=["free_completed"]: every free_requested is the free.
    entries = [_entry("alloc", A, 100), _entry("free_requested", A, 100), _entry("alloc", B, 40)]
    assert _live(_timeline(entries)) == [100, 0, 40]


def test_open_allocation_closed_at_its_request_only_when_segments_show_it_gone() -> None:
    entries = [
        _entry("alloc", A, 100),
        _entry("alloc", B, 40),
        _entry("free_requested", A, 100),
        _entry("free_requested", B, 40),
        _entry("free_completed", B, 40),
    ]
    gone = [_segment(A, 4096, [(A, 512, 0, "inactive"), (A + 512, 3584, 0, "inactive")])]
    assert _live(_timeline(entries, segments=gone)) == [100, 140, 40, 0]
    # A's block still waits on another stream (record_stream): it stays live, as the segments say.
    pending = [_segment(A, 4096, [(A, 512, 100, "active_pending_free"), (A + 512, 3584, 0, "inactive")])]
    timeline = _timeline(entries, segments=pending)
    assert _live(timeline) == [100, 140, 100] and timeline.end_bytes == timeline.metadata["segments_requested_bytes"]
    assert _live(_timeline(entries)) == [100, 140, 100]  # without segments nothing says it went


def test_an_address_allocated_twice_lost_its_free() -> None:
    # A's free is missing; it is closed at the free_requested between the two allocations ...
    with_request = [_entry("alloc", A, 100), _entry("free_requested", A, 100), _entry("alloc", A, 60)]
    with_request.append(_entry("free_completed", B, 1))  # the trace does record completions
    timeline = _timeline([_entry("alloc", B, 1), *with_request])
    assert timeline.nbytes.tolist() == [1, 100, -100, 60, -1]
    # ... or, without one, just before the second allocation.
    timeline = _timeline([_entry("alloc", A, 100), _entry("alloc", A, 60), _entry("free_completed", A, 60)])
    assert timeline.nbytes.tolist() == [100, -100, 60, -60] and timeline.storage.tolist() == [0, 0, 1, 1]


def test_frees_without_allocations_are_preexisting() -> None:
    entries = [
        _entry("alloc", A, 100, 10),
        _entry("free_completed", B, 700, 20),  # allocated before recording began
        _entry("free_completed", C, 300, 30),
        _entry("free_completed", A, 100, 40),
    ]
    timeline = _timeline(entries)
    # 700 + 300 live from the start (time of the first entry), freed at their entries.
    assert timeline.nbytes.tolist() == [700, 300, 100, -700, -300, -100]
    assert timeline.time.tolist() == [0, 0, 0, 10_000, 20_000, 30_000]
    assert timeline.peak_bytes == 1100 and timeline.peak_index == 2
    assert timeline.metadata["preexisting_bytes"] == 1000 and timeline.metadata["trace_overflowed"] is True


def test_ghost_blocks_live_from_start_to_end() -> None:
    blocks = [
        (C, 1024, 1000, "active_allocated"),
        (C + 1024, 512, 0, "inactive"),
        (C + 1536, 512, 400, "active_allocated"),
        (C + 2048, 6144, 0, "inactive"),
    ]
    segments = [_segment(C, 8192, blocks)]
    timeline = _timeline([_entry("alloc", A, 10), _entry("free_completed", A, 10)], segments=segments)
    assert timeline.nbytes.tolist() == [1000, 400, 10, -10]
    assert timeline.end_bytes == 1400 == timeline.metadata["segments_requested_bytes"]
    assert timeline.metadata["preexisting_bytes"] == 1400
    assert timeline.metadata["trace_overflowed"] is False  # ghosts alone prove no loss


def test_ring_buffer_overflow_matches_the_plain_reference() -> None:
    raw = synthetic_snapshot(30_000, seed=5, max_entries=12_000)
    timeline = load_snapshot(pickle.dumps(raw)).timeline()
    peak, end = reference_peak_end(raw)
    assert (timeline.peak_bytes, timeline.end_bytes) == (peak, end)
    assert timeline.end_bytes == timeline.metadata["segments_requested_bytes"]
    assert timeline.metadata["trace_overflowed"] is True and timeline.metadata["preexisting_bytes"] > 0


def test_overflow_from_allocator_settings_alone() -> None:
    entries = [_entry("alloc", A, 1), _entry("alloc", B, 1)]
    assert _timeline(entries, allocator_settings={"trace_alloc_max_entries": 2}).metadata["trace_overflowed"] is True
    assert _timeline(entries, allocator_settings={"trace_alloc_max_entries": 3}).metadata["trace_overflowed"] is False
    assert _timeline(entries, allocator_settings={"trace_alloc_overflowed": True}).metadata["trace_overflowed"] is True


def test_oom_before_any_allocation() -> None:
    entries = [{"action": "oom", "device_free": 5, "size": 99, "stream": 7}, _entry("alloc", A, 1)]
    (oom,) = _timeline(entries).metadata["oom"]
    assert oom == {"event": -1, "time_us": None, "requested_bytes": 99, "device_free_bytes": 5, "stream": 7}


def test_annotation_scopes_nest_and_may_be_open() -> None:
    entries = [_entry("alloc", A + i, 1, t) for i, t in enumerate([0, 10, 20, 30, 40, 50])]
    scopes = [
        ("before", "END", 5),  # began before recording
        ("step", "START", 8),
        ("inner", "START", 15),
        ("inner", "END", 25),
        ("step", "END", 35),
        ("last", "START", 45),  # never ended
    ]
    annotations = [{"name": n, "stage": s, "device": 0, "time_us": T0 + t} for n, s, t in scopes]
    annotations.append({"name": "elsewhere", "stage": "START", "device": 1, "time_us": T0})
    timeline = _timeline(entries, external_annotations=annotations)
    assert _names(timeline, "phase", "phases") == ["before", "step", "inner", "step", None, "last"]


@pytest.mark.parametrize(
    ("meta", "category", "phase", "module"),
    [
        ("vramlens;phase=forward;module=m.fc;category=activations", Category.ACTIVATIONS, "forward", "m.fc"),
        ("vramlens;category=parameters", Category.PARAMETERS, None, None),
        ("vramlens;phase=optimizer_step", Category.OTHER, "optimizer_step", None),
        ("user text\nvramlens;category=kv_cache;module=attn", Category.KV_CACHE, None, "attn"),
        ("vramlens;category=made_up;phase=p", Category.OTHER, "p", None),
        ("not vramlens;category=gradients", Category.OTHER, None, None),
        ("", Category.OTHER, None, None),
    ],
)
def test_vramlens_tags(meta: str, category: Category, phase: str | None, module: str | None) -> None:
    timeline = _timeline([_entry("alloc", A, 8, meta=meta), _entry("free_completed", A, 8)])
    assert CATEGORY_ORDER[timeline.category[0]] == category == CATEGORY_ORDER[timeline.category[1]]
    assert _names(timeline, "phase", "phases")[0] == phase
    assert _names(timeline, "module", "modules")[0] == module
    assert timeline.metadata["categories"] == ("none" if category == Category.OTHER else "recorded")


@pytest.mark.parametrize(
    ("field", "category"),
    [("parameter", Category.PARAMETERS), ("autograd_detail", Category.TEMPORARY), ("gradients", Category.GRADIENTS)],
)
def test_category_fields_of_profiler_and_vramlens_snapshots(field: str, category: Category) -> None:
    timeline = _timeline([_entry("alloc", A, 8, category=field), _entry("alloc", B, 8, category="unknown")])
    assert [CATEGORY_ORDER[c] for c in timeline.category.tolist()] == [category, Category.OTHER]
    # A vramlens tag wins over the field.
    tagged = _timeline([_entry("alloc", A, 8, meta="vramlens;category=inputs", category=field)])
    assert CATEGORY_ORDER[tagged.category[0]] == Category.INPUTS


def test_reserved_curve_from_segment_entries() -> None:
    seg = 0x5000_0000_0000
    entries = [
        _entry("segment_alloc", seg, 4 << 20),
        _entry("alloc", seg, 3 << 20),
        _entry("segment_alloc", seg + (8 << 20), 2 << 20),
        _entry("free_completed", seg, 3 << 20),
        _entry("segment_free", seg, 4 << 20),
    ]
    segments = [_segment(seg + (8 << 20), 2 << 20, [(seg + (8 << 20), 2 << 20, 0, "inactive")])]
    meta = _timeline(entries, segments=segments).metadata
    # Reserved walks back from 2 MiB at the end: 6 after the second segment, 4 at the allocated peak.
    assert (meta["reserved_bytes"], meta["reserved_peak_bytes"], meta["reserved_at_peak_bytes"]) == (
        2 << 20,
        6 << 20,
        4 << 20,
    )


def test_synthetic_100k_events_match_a_plain_reference() -> None:
    raw = synthetic_snapshot(100_000, seed=11, tagged=True)
    timeline = load_snapshot(pickle.dumps(raw)).timeline()
    peak, end = reference_peak_end(raw)
    assert (timeline.peak_bytes, timeline.end_bytes) == (peak, end)
    assert end == timeline.metadata["segments_requested_bytes"]
    assert sum(timeline.breakdown_at().values()) == peak  # every byte has a category
    assert timeline.metadata["categories"] == "recorded"
    assert set(timeline.phases) == {"forward", "backward", "optimizer_step"}
    # Each allocation is one storage: its events net to zero or to its live size.
    per_storage = np.bincount(timeline.storage, weights=timeline.nbytes)
    assert per_storage.min() >= 0 and int(per_storage.sum()) == end
