"""``vramlens.track(device="cuda")`` without a GPU: ``torch.cuda``'s functions are replaced by
fakes whose memory-history snapshots are built from real CPU runs (the storages' real data
pointers and times), so the merge, the device filter, the clock alignment and the metadata are
exercised on real tensors. The CUDA path is untested on a real GPU.

Byte counts are worked out from shapes next to each assertion.
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import vramlens  # noqa: E402
from vramlens.categories import Category  # noqa: E402
from vramlens.errors import InputError  # noqa: E402
from vramlens.trace._allocator import AllocatorRecorder  # noqa: E402
from vramlens.trace._cuda import (  # noqa: E402
    DEFAULT_MAX_ENTRIES,
    CudaMemoryTracker,
    device_addresses,
    trace_events,
)

SEGMENT_BYTES = 512  # the caching allocator's smallest block
IDLE_SEGMENT_BYTES = 2 * 2**20  # one cached, entirely free 2 MiB segment
MAX_ALLOCATED, MAX_RESERVED = 4096, 2_101_248  # what the fake peak statistics report


class FakeCuda:
    """One fake GPU. Its history is what ``build(fake)`` returns when ``_snapshot()`` is called;
    ``entries`` persist across recordings, as the allocator's ring buffer does."""

    def __init__(self, build: Callable[[FakeCuda], list[dict[str, Any]]]) -> None:
        self.build = build
        self.calls: list[tuple[Any, dict[str, Any]]] = []
        self.resets: list[int] = []
        self.entries: list[dict[str, Any]] = []
        self.segments: list[dict[str, Any]] = []
        self.started_ns = 0
        self.tracker: Any = None
        self.taken: dict[str, Any] | None = None
        self.on_start: Callable[[], None] | None = None

    def record(self, enabled: Any = "all", **options: Any) -> None:
        self.calls.append((enabled, options))
        if enabled is not None:
            self.started_ns = time.time_ns()
            if self.on_start is not None:
                self.on_start()

    def snapshot(self, device: Any = None) -> dict[str, Any]:
        self.entries += self.build(self)
        other_device = [{"action": "alloc", "addr": 8, "size": 999, "stream": 0, "time_us": self.started_ns // 1000}]
        segments = [*self.segments, {"device": 1, "address": 0, "total_size": 999, "blocks": []}]
        self.taken = {"segments": segments, "device_traces": [list(self.entries), other_device]}
        return self.taken


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeCuda]]:
    def installed(build: Callable[[FakeCuda], list[dict[str, Any]]]) -> FakeCuda:
        fake = FakeCuda(build)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.resets.append)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: MAX_ALLOCATED)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: MAX_RESERVED)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.snapshot)
        return fake

    yield installed


def entry(action: str, addr: int, size: int, unix_ns: int) -> dict[str, Any]:
    """A trace entry as ``_snapshot()`` gives it (``time_us``: Unix microseconds)."""
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": unix_ns // 1000, "frames": []}


def segment(address: int, requested: int) -> dict[str, Any]:
    """A 512 B segment holding one active block (a tensor made before recording)."""
    block = {"address": address, "size": SEGMENT_BYTES, "requested_size": requested, "state": "active_allocated"}
    return {
        "device": 0,
        "address": address,
        "total_size": SEGMENT_BYTES,
        "allocated_size": SEGMENT_BYTES,
        "blocks": [block],
    }


def mirror_tracker(fake: FakeCuda, *, skip: set[int]) -> list[dict[str, Any]]:
    """The history a GPU would have for what the tracker saw since recording began: each
    allocation 2 us before the tracker noticed it, each free 1 us after; storages at ``skip``
    pointers (host tensors) left out; storages made before recording become segments."""
    tracker = fake.tracker
    timeline = tracker._tracked_timeline(None)
    found = []
    for t, nbytes, serial in zip(
        timeline.time.tolist(), timeline.nbytes.tolist(), timeline.storage.tolist(), strict=True
    ):
        ptr, unix = tracker._pointers[serial], t + tracker._start_ns
        if ptr in skip:
            continue
        if unix < fake.started_ns:  # registered before recording: a pre-existing block
            fake.segments.append(segment(ptr, nbytes))
        elif nbytes > 0:
            found.append(entry("alloc", ptr, nbytes, unix - 2000))
        else:
            found.append(entry("free_requested", ptr, -nbytes, unix + 500))  # ignored: not yet reusable
            found.append(entry("free_completed", ptr, -nbytes, unix + 1000))
    return found


# --- a hand-built history ---------------------------------------------------------------------------


def test_cuda_track_merges_the_history_of_the_device_only(install: Callable[..., FakeCuda], tmp_path: Path) -> None:
    host: dict[str, int] = {}

    def build(fake: FakeCuda) -> list[dict[str, Any]]:
        found = mirror_tracker(fake, skip={host["ptr"]})
        y_alloc = found[0]  # the Linear's output
        inside = (y_alloc["time_us"] + 0) * 1000
        internal = [entry("alloc", 0x1000, 1000, inside), entry("free_completed", 0x1000, 1000, inside)]
        oom = {"action": "oom", "size": 2**30, "device_free": 1234, "stream": 0, "time_us": y_alloc["time_us"]}
        before = [entry("alloc", 0x2000, 5000, fake.started_ns - 10**9), entry("free_completed", 0x2000, 5000, inside)]
        fake.segments.append({"device": 0, "address": 0x100000, "total_size": IDLE_SEGMENT_BYTES, "allocated_size": 0,
                              "blocks": [{"address": 0x100000, "size": IDLE_SEGMENT_BYTES, "state": "inactive"}]})  # fmt: skip
        return [before[0], found[0], *internal, oom, before[1], *found[1:]]

    fake = install(build)
    model = nn.Linear(8, 4)  # weight 8 x 4 floats = 128 B, bias 16 B
    x = torch.randn(2, 8)  # 64 B
    with vramlens.track(model, None, x, device="cuda") as tracker:
        fake.tracker = tracker
        on_host = torch.ones(100)  # 400 B in host memory: not in the device's history
        host["ptr"] = on_host.untyped_storage().data_ptr()
        y = model(x)  # 2 x 4 floats = 32 B
        del y
    assert isinstance(tracker, CudaMemoryTracker)
    timeline = tracker.timeline()
    # Registered 128 + 16 + 64; the output 32; an internal 1000 B buffer; frees. The host tensor,
    # the device-1 entry and the allocation made before recording (and its free) are not there.
    assert timeline.nbytes.tolist() == [128, 16, 64, 32, 1000, -1000, -32]
    assert timeline.peak_bytes == tracker.peak == 128 + 16 + 64 + 32 + 1000
    assert timeline.breakdown_at() == {
        Category.PARAMETERS: 144,
        Category.INPUTS: 64,
        Category.ACTIVATIONS: 32,
        Category.TEMPORARY: 1000,
    }
    meta = timeline.metadata
    assert meta["device"] == "cuda:0"
    assert meta["allocator_events"] is True
    assert meta["reserved_bytes"] == 3 * SEGMENT_BYTES + IDLE_SEGMENT_BYTES  # device 0's segments only
    assert meta["segments_allocated_bytes"] == 3 * SEGMENT_BYTES
    assert (meta["max_memory_allocated_bytes"], meta["max_memory_reserved_bytes"]) == (MAX_ALLOCATED, MAX_RESERVED)
    assert meta["trace_overflowed"] is False
    # The OOM is stamped in the microsecond of the internal buffer: its last event is that buffer's free.
    assert meta["oom"] == [
        {"event": 5, "time_us": build_time(fake), "requested_bytes": 2**30, "device_free_bytes": 1234, "stream": 0}
    ]
    assert fake.resets == [0]
    assert fake.calls == [
        ("all", {"context": "alloc", "stacks": "python", "max_entries": DEFAULT_MAX_ENTRIES}),
        (None, {}),
    ]
    path = tracker.save_snapshot(tmp_path / "run.pickle")
    assert path.read_bytes()[:2] == b"\x80\x04"  # pickle protocol 4
    assert pickle.loads(path.read_bytes()) == fake.taken == tracker.snapshot


def build_time(fake: FakeCuda) -> int:
    """The ``time_us`` of the (only) OOM entry in the fake's history."""
    return next(e["time_us"] for e in fake.entries if e["action"] == "oom")


def test_a_re_entered_cuda_tracker_does_not_count_earlier_history_twice(install: Callable[..., FakeCuda]) -> None:
    """The fake keeps every entry across recordings (the ring buffer is not cleared); entries
    stamped before a stretch began belong to the one before it."""
    fake = install(lambda fake: mirror_tracker(fake, skip=set()))
    tracker = CudaMemoryTracker("cuda")
    fake.tracker = tracker
    with tracker:
        a = torch.ones(100)  # 400 B, kept
    with tracker:
        b = torch.ones(50)  # 200 B
        del b
    assert tracker.timeline().nbytes.tolist() == [400, 200, -200]
    assert tracker.peak == 600  # 400 more if the first stretch's allocation came back as a temporary
    assert a.numel() == 100


def test_a_full_ring_buffer_is_reported(install: Callable[..., FakeCuda]) -> None:
    fake = install(lambda fake: mirror_tracker(fake, skip=set()))
    tracker = CudaMemoryTracker("cuda:0", max_entries=2)
    fake.tracker = tracker
    with tracker:
        kept = [torch.ones(10), torch.ones(20)]  # two entries: as many as the buffer holds
    meta = tracker.timeline().metadata
    assert (meta["trace_overflowed"], meta["trace_entries"], meta["max_entries"]) == (True, 2, 2)
    assert fake.calls[0][1]["max_entries"] == 2
    assert len(kept) == 2


def test_nothing_to_save_before_the_block(install: Callable[..., FakeCuda]) -> None:
    install(lambda fake: [])
    tracker = CudaMemoryTracker("cuda:0")
    assert tracker.snapshot is None
    with pytest.raises(InputError, match=r"^save_snapshot: nothing recorded yet"):
        tracker.save_snapshot("never.pickle")


def test_cuda_ordinal_out_of_range_is_refused(install: Callable[..., FakeCuda]) -> None:
    install(lambda fake: [])
    with pytest.raises(InputError, match=r"^device: 'cuda:1' names no GPU \(this machine has 1\)"):
        CudaMemoryTracker("cuda:1")


# --- parsing helpers -----------------------------------------------------------------------------------


def test_trace_events_keep_allocations_and_completed_frees_since_a_time() -> None:
    snapshot = {
        "device_traces": [
            [
                entry("alloc", 100, 64, 5_000),
                entry("alloc", 200, 32, 9_000),
                entry("free_requested", 200, 32, 10_000),
                entry("free_completed", 200, 32, 11_000),
                entry("segment_alloc", 0, 2**21, 12_000),
                entry("snapshot", 0, 0, 13_000),
                {"action": "oom", "size": 10, "device_free": 0, "stream": 0, "time_us": 14},
                {"action": "alloc", "addr": 300, "size": 8},  # no time: cannot be placed
            ]
        ]
    }
    events = trace_events(snapshot, 0, since_ns=9_000)
    assert [(e.time_ns, e.ptr, e.nbytes) for e in events] == [(9_000, 200, 32), (11_000, 200, -32)]
    assert trace_events(snapshot, 1) == []


def test_device_addresses_fill_in_block_addresses_from_sizes() -> None:
    """2.0-layout blocks carry no address: they lie back to back from the segment's."""
    snapshot = {
        "segments": [
            {"device": 0, "address": 1000, "blocks": [{"size": 512}, {"size": 1024}, {"size": 512}]},
            {"device": 1, "address": 7, "blocks": [{"size": 512}]},
        ],
        "device_traces": [[entry("alloc", 5000, 8, 0)]],
    }
    assert device_addresses(snapshot, 0) == {5000, 1000, 1512, 2536}


# --- the CPU allocator's real events, as a GPU's history ----------------------------------------------


def test_cuda_path_peak_equals_its_allocator_peak_on_a_real_step(install: Callable[..., FakeCuda]) -> None:
    """The fake records the CPU allocator (torch.profiler) while history is on and hands its
    calls back as ``alloc``/``free_completed`` entries: every allocation, operator internals
    included. The merged peak equals that history's own running peak to the byte, and equals
    the CPU path with ``allocator_events=True`` on the same step."""
    recorder = AllocatorRecorder()

    def build(fake: FakeCuda) -> list[dict[str, Any]]:
        recorder.stop()
        mirror_tracker(fake, skip=set())  # only for its segments: the tensors registered before recording
        kinds = {True: "alloc", False: "free_completed"}
        return [entry(kinds[e.nbytes > 0], e.ptr, abs(e.nbytes), e.time_ns) for e in recorder.events]

    fake = install(build)
    fake.on_start = recorder.start
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cuda_start, cuda_timeline = _adamw_run(device="cuda", fake=fake)
        cpu_start, cpu_timeline = _adamw_run(allocator_events=True)
        _, dispatch_only = _adamw_run()
    finally:
        torch.set_num_threads(threads)
    running = list(itertools.accumulate(e["size"] * (1 if e["action"] == "alloc" else -1) for e in fake.entries))
    assert cuda_timeline.peak_bytes - cuda_start == max(running)
    assert cuda_timeline.end_bytes - cuda_start == running[-1]
    assert cuda_timeline.peak_bytes == cpu_timeline.peak_bytes and cuda_start == cpu_start
    # What only an allocator sees, as in test_tracker.py's fp32 case: AdamW's `tensor / float` wraps
    # the float in an 8 B tensor, re-wrapped (8 B) for the dispatch mode, cast to fp32 (4 B) in the kernel.
    assert cuda_timeline.peak_bytes - dispatch_only.peak_bytes == 8 + 8 + 4
    breakdown = cuda_timeline.breakdown_at()
    assert sum(breakdown.values()) == cuda_timeline.peak_bytes
    assert {Category.PARAMETERS, Category.GRADIENTS, Category.INPUTS} <= set(breakdown)
    assert [name for name, _, _ in cuda_timeline.phase_spans()] == ["load", "forward", "backward", "optimizer_step"]


def _adamw_run(fake: FakeCuda | None = None, **options: Any) -> tuple[int, Any]:
    """Two AdamW steps of a small MLP (the second with the state resident): (registered bytes, timeline)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with vramlens.track(model, optimizer, x, **options) as tracker:
        if fake is not None:
            fake.tracker = tracker
        start = tracker.current
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return start, tracker.timeline()
