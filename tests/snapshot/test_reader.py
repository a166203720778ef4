"""Every snapshot layout reads into the same events and the same timeline; bad fields are one-line errors.

Expected figures come from the scenario worked by hand in ``layouts.py``; where torch is
installed, its own ``torch.cuda._memory_viz`` readers are run on the same dicts and must agree.
"""

from __future__ import annotations

import copy
import gc
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from layouts import EXPECTED, LAYOUTS, S0, S1, T0, reference_peak_end, scenario_snapshot, synthetic_snapshot

from vramlens.errors import InputError
from vramlens.snapshot import Snapshot, load_snapshot
from vramlens.snapshot.model import ACTIONS, ALLOC, OOM


def _load(layout: str) -> Snapshot:
    raw = scenario_snapshot(layout)
    return load_snapshot(raw.encode() if isinstance(raw, str) else pickle.dumps(raw))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_gives_the_hand_computed_timeline(layout: str) -> None:
    snapshot = _load(layout)
    assert snapshot.layout == ("2.1+" if layout == "json" else layout)
    assert snapshot.devices == (0,)
    assert snapshot.reserved_bytes(0) == EXPECTED["reserved"]
    timeline = snapshot.timeline()
    assert timeline.end_bytes == EXPECTED["end"] == timeline.metadata["segments_requested_bytes"]
    if layout == "1.13-segments":  # no trace: the three live blocks, all pre-existing
        assert timeline.nbytes.tolist() == [8000, 900, 2048]
        return
    assert (timeline.peak_bytes, timeline.peak_index) == (EXPECTED["peak"], EXPECTED["peak_index"])
    assert len(timeline) == EXPECTED["events"]
    sizes = np.bincount(timeline.storage, weights=np.maximum(timeline.nbytes, 0)).astype(int).tolist()
    assert sizes == EXPECTED["storage_sizes"]


def test_old_and_new_layouts_parse_to_the_same_events() -> None:
    new_snapshot, old_snapshot = _load("2.1+"), _load("2.0")
    new, old = new_snapshot.trace(0), old_snapshot.trace(0)
    keep = (new.action != -1) & (new.action != ACTIONS.index("annotate"))  # 2.0 had neither
    for column in ("action", "addr", "size", "stream"):
        assert getattr(new, column)[keep].tolist() == getattr(old, column).tolist(), column
    new_stacks = [new_snapshot.stack_text(code) for code in new.stack[keep].tolist()]
    assert new_stacks == [old_snapshot.stack_text(code) for code in old.stack.tolist()]
    assert old.time_us is None and new.time_us is not None
    assert new.unknown_actions == {"workspace_snapshot": 1} and not old.unknown_actions
    new_timeline, old_timeline = _load("2.1+").timeline(), _load("2.0").timeline()
    assert new_timeline.nbytes.tolist() == old_timeline.nbytes.tolist()
    assert new_timeline.storage.tolist() == old_timeline.storage.tolist()
    assert (old_timeline.time_unit, new_timeline.time_unit) == ("event", "ns")


@pytest.mark.parametrize("layout", ["2.1+", "2.0", "1.13-segments"])
def test_block_addresses_sizes_and_states(layout: str) -> None:
    segments = _load(layout).segments
    # 2.0 and 1.13 blocks carry no address: segment address + sizes of the blocks before.
    assert [b.address for b in segments[0].blocks] == [S0, S0 + 8192]
    assert [b.address for b in segments[1].blocks] == [S1, S1 + 1024, S1 + 3072]
    assert [b.requested_size for b in segments[1].blocks if b.active] == [900, 2048]
    assert [b.state for b in segments[1].blocks] == ["active_allocated", "active_allocated", "inactive"]
    assert [s.allocated_bytes for s in segments] == [8192, 1024 + 2048]
    assert segments[1].stack >= 0 if layout == "2.1+" else segments[1].stack == -1


def test_awaiting_free_is_read_as_pending_free() -> None:
    raw = scenario_snapshot("2.1+")
    raw["segments"][1]["blocks"][1]["state"] = "active_awaiting_free"
    block = load_snapshot(raw).segments[1].blocks[1]
    assert block.state == "active_pending_free" and block.active


def test_frames_are_interned_by_identity_and_content() -> None:
    raw = scenario_snapshot("2.1+")
    # Same content, different list objects (what a JSON file gives): still one stack.
    raw["device_traces"][0][2]["frames"] = copy.deepcopy(raw["device_traces"][0][2]["frames"])
    snapshot = load_snapshot(raw)
    # fwd, param, bwd, load, seg: five distinct stacks in the scenario.
    assert len(snapshot.stacks) == 5
    trace = snapshot.trace(0)
    assert trace.stack[1] == trace.stack[3]  # both "fwd"
    assert snapshot.stack_text(int(trace.stack[1])) == (
        "/work/train_step.py:12 in train_step\n/work/forward.py:11 in forward\n/work/linear.py:10 in linear"
    )
    assert trace.stack[6] == -1  # no frames recorded


def test_user_metadata_strings_and_ooms() -> None:
    snapshot = _load("2.1+")
    trace = snapshot.trace(0)
    tags = [snapshot.strings[c] if c >= 0 else "" for c in trace.user_metadata.tolist()]
    assert tags[1] == "vramlens;phase=forward;module=model.fc;category=activations"
    assert tags[0] == ""  # empty metadata is -1
    (oom,) = trace.ooms
    assert (oom.index, oom.requested_bytes, oom.device_free_bytes, oom.time_us) == (9, 10 << 30, 1 << 30, T0 + 70)
    assert trace.action[9] == OOM and trace.addr[9] == 0


def test_annotations_and_allocator_settings() -> None:
    snapshot = _load("2.1+")
    assert [(a.name, a.stage, a.time_us) for a in snapshot.annotations] == [
        ("ProfilerStep#3", "START", T0 + 5),
        ("ProfilerStep#3", "END", T0 + 55),
        ("ProfilerStep#4", "START", T0 + 56),
    ]
    assert snapshot.allocator_settings["expandable_segments"] is False


def test_sources_path_bytes_dict_and_bare_list(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(scenario_snapshot("2.1+")))
    for source in (path, str(path), path.read_bytes(), scenario_snapshot("2.1+")):
        assert load_snapshot(source).timeline().peak_bytes == EXPECTED["peak"]
    assert load_snapshot(path).source == str(path)
    assert load_snapshot(scenario_snapshot("1.13-segments")).layout == "1.13-segments"


def test_two_devices_are_kept_apart() -> None:
    raw = scenario_snapshot("2.1+")
    other = [{"action": "alloc", "addr": 0x9000_0000_0000, "size": 77, "stream": 0, "time_us": T0}]
    raw["device_traces"].append(other)
    raw["segments"].append(
        {"device": 1, "address": 0x9000_0000_0000, "total_size": 1 << 20, "blocks": [
            {"address": 0x9000_0000_0000, "size": 512, "requested_size": 77, "state": "active_allocated"},
            {"address": 0x9000_0000_0200, "size": (1 << 20) - 512, "requested_size": 0, "state": "inactive"},
        ]}
    )  # fmt: skip
    snapshot = load_snapshot(raw)
    assert snapshot.devices == (0, 1)
    assert snapshot.timeline(1).nbytes.tolist() == [77]
    assert snapshot.timeline(0).end_bytes == EXPECTED["end"]
    assert snapshot.reserved_bytes(1) == 1 << 20
    with pytest.raises(InputError, match=r"device: 5 has no segments .* devices: 0, 1"):
        snapshot.timeline(5)


def test_addresses_above_2_63_are_exact() -> None:
    high = 0xFFFF_8000_0000_0000
    raw = {"device_traces": [[{"action": a, "addr": high, "size": 10} for a in ("alloc", "free_completed")]]}
    snapshot = load_snapshot(pickle.dumps(raw))
    assert int(snapshot.trace(0).addr[0]) == high
    assert snapshot.timeline().nbytes.tolist() == [10, -10]
    assert snapshot.reserved_bytes(0) is None and not snapshot.has_segments


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["segments"][1]["blocks"][1].update(state="busy"), r"segments\[1\]\.blocks\[1\]\.state: 'busy'"),
        (lambda s: s["segments"][0].update(total_size="big"), r"segments\[0\]\.total_size must be an integer"),
        (lambda s: s["segments"].append([1]), r"segments\[2\] is a list; segments are dicts"),
        (lambda s: s.update(segments={}), "segments must be a list"),
        (lambda s: s["device_traces"][0].insert(3, "alloc"), r"device_traces\[0\]\[3\] is a str"),
        (lambda s: s["device_traces"][0][4].pop("action"), r"device_traces\[0\]\[4\] has no 'action'"),
        (lambda s: s["device_traces"][0][3].update(addr="abc"), r"device_traces\[0\]\[3\]\.addr: 'abc'"),
        (lambda s: s["device_traces"][0][3].update(addr=-5), r"device_traces\[0\]\[3\]\.addr: '-5'"),
        (
            lambda s: s["device_traces"][0][2].update(frames="main.py"),
            r"device_traces\[0\]\[2\]\.frames must be a list",
        ),
        (lambda s: s["device_traces"][0][9].update(device_free="lots"), r"device_traces\[0\]\[9\]: an oom entry needs"),
        (lambda s: s["device_traces"][0][9].update(size=None), r"device_traces\[0\]\[9\]\.size: 'None'"),
        (lambda s: s.update(allocator_settings=[1]), "allocator_settings must be a dict"),
        (lambda s: s.update(external_annotations=[3]), r"external_annotations\[0\] is a int"),
        (lambda s: s.update(device_traces={}), "device_traces must be a list"),
    ],
)
def test_malformed_fields_are_named(edit: Any, message: str) -> None:
    raw = scenario_snapshot("2.1+")
    edit(raw)
    with pytest.raises(InputError, match=message) as caught:
        load_snapshot(pickle.dumps(raw))
    assert "\n" not in str(caught.value) and str(caught.value).startswith("<bytes>: ")


def test_empty_snapshot_has_an_empty_device_0() -> None:
    for raw in ({"segments": [], "device_traces": []}, [], {"device_traces": [[]]}):
        snapshot = load_snapshot(raw)
        assert snapshot.devices == () and len(snapshot.timeline(0)) == 0
        with pytest.raises(InputError, match="devices: none"):
            snapshot.timeline(1)


def test_not_a_snapshot_object() -> None:
    with pytest.raises(InputError, match="a int, not a memory snapshot"):
        load_snapshot(pickle.dumps(3))


def test_synthetic_snapshot_reads_consistently() -> None:
    raw = synthetic_snapshot(20_000, seed=3)
    snapshot = load_snapshot(pickle.dumps(raw))
    trace = snapshot.trace(0)
    assert len(trace) == len(raw["device_traces"][0])
    assert int((trace.action == ALLOC).sum()) == sum(e["action"] == "alloc" for e in raw["device_traces"][0])
    assert len(snapshot.stacks) <= 300
    assert snapshot.timeline().peak_bytes == reference_peak_end(raw)[0]


# --- torch's own readers of the same dicts ---------------------------------------------------


def _viz() -> Any:
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    return _memory_viz


@pytest.mark.parametrize("layout", ["2.1+", "2.0", "1.13-segments", "synthetic"])
def test_segment_figures_match_memory_viz(layout: str) -> None:
    viz = _viz()
    raw = synthetic_snapshot(5_000, seed=1) if layout == "synthetic" else scenario_snapshot(layout)
    data = {"segments": raw, "traces": []} if isinstance(raw, list) else raw
    snapshot = load_snapshot(raw)
    for theirs, ours in zip(data["segments"], snapshot.segments, strict=True):
        assert viz.calc_active(theirs) == ours.allocated_bytes
        for block, mine in zip(theirs["blocks"], ours.blocks, strict=True):
            if block["state"] == "active_allocated":
                assert viz._block_extra(block)[1] == mine.requested_size
    text = viz.segsum(data)
    totals = dict(re.findall(r"^(segments|total_reserved|total_allocated): (\S+)$", text, re.MULTILINE))
    timeline = snapshot.timeline()
    assert int(totals["segments"]) == len(snapshot.segments)
    assert totals["total_reserved"] == repr(viz.Bytes(timeline.metadata["reserved_bytes"]))
    assert totals["total_allocated"] == repr(viz.Bytes(timeline.metadata["segments_requested_bytes"]))


@pytest.mark.parametrize("layout", ["2.1+", "2.0", "synthetic"])
def test_trace_figures_match_memory_viz(layout: str) -> None:
    viz = _viz()
    raw = synthetic_snapshot(5_000, seed=2) if layout == "synthetic" else scenario_snapshot(layout)
    text = viz.trace(raw)
    trace = load_snapshot(raw).trace(0)
    assert f"{len(trace)} entries" in text.splitlines()[1]
    allocs = re.findall(r"^\w+ = (?:seg_\d+|MEM|\w+)\[\d+:([\d.]+\w*B)\]$", text, re.MULTILINE)
    assert allocs == [repr(viz.Bytes(int(size))) for size in trace.size[trace.action == ALLOC]]
    ooms = re.findall(r"raise OutOfMemoryError # (\S+) requested, (\S+) free", text)
    assert ooms == [(repr(viz.Bytes(o.requested_bytes)), repr(viz.Bytes(o.device_free_bytes))) for o in trace.ooms]


def test_no_garbage_collection_runs_while_a_snapshot_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unpickled dicts are no garbage: the collector stays paused from the unpickling until
    the reader has its columns (it would otherwise traverse every dict once per generation), and
    is on again after."""
    import vramlens.snapshot.reader as reader

    data = pickle.dumps(synthetic_snapshot(20_000), protocol=4)
    reading, collections = [False], []
    read_source, from_object = reader.read_source, reader.snapshot_from_object

    def opened(*args: Any) -> Any:
        reading[0] = True
        return read_source(*args)

    def converted(*args: Any) -> Any:
        result = from_object(*args)
        reading[0] = False
        return result

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and reading[0]:
            collections.append(info["generation"])

    monkeypatch.setattr(reader, "read_source", opened)
    monkeypatch.setattr(reader, "snapshot_from_object", converted)
    gc.callbacks.append(record)
    try:
        assert gc.isenabled()
        snapshot = load_snapshot(data)
    finally:
        gc.callbacks.remove(record)
    assert len(snapshot.trace(0)) > 10_000 and gc.isenabled() and not reading[0]
    assert collections == []
