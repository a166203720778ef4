"""Snapshot fixtures built by code, in every historical layout (no GPU, no torch needed).

``scenario_snapshot(layout)`` writes one short hand-written run as PyTorch of that era would
have dumped it (``docs/snapshot-format.md``); ``synthetic_snapshot(n)`` makes a large,
realistic 2.1+ snapshot (shared stacks, address reuse, several segments, blocks allocated
before recording). Both give dicts; pickle them (``pickle.dumps``) for file-level tests.

The scenario, device 0 (S0, S1 are segments; sizes are requested bytes, blocks rounded to 512):

* before recording: segment S0 (20 MiB) holds G (8000 B, block 8192, live to the end: a
  "ghost" block) and P (4096 B, freed during the trace: an "orphan" free);
* trace: 0 segment_alloc S1 (2 MiB) | 1 alloc A S1+0 1000 B | 2 alloc B S1+1024 2048 B |
  3 alloc C S1+3072 500 B | 4-5 free A | 6-7 free P | 8 alloc D S1+0 900 B (A's address
  reused) | 9 oom 10 GiB requested, 1 GiB free | 10-11 free C | 12 annotate B as optimizer
  state (newest layout only) | 13 snapshot | 14 an unknown action (2.1+ only);
* annotations (2.1+): ProfilerStep#3 from t+5 to t+55, ProfilerStep#4 from t+56, never ended.

Expected, worked by hand: pre-existing 4096 + 8000 = 12096 B; live after each timeline event
P 4096, G 12096, A 13096, B 15144, C 15644 (the peak, event 4), -A 14644, -P 10548, D 11448,
-C 10948 (the end = G + B + D = 8000 + 2048 + 900). Reserved 20 MiB + 2 MiB = 23068672 B.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = [
    "EXPECTED",
    "LAYOUTS",
    "S0",
    "S1",
    "T0",
    "reference_peak_end",
    "scenario_snapshot",
    "synthetic_snapshot",
]

S0, S1 = 0x7F00_0000_0000, 0x7F00_0200_0000
T0 = 1_700_000_000_000_000
MIB = 1 << 20
LAYOUTS = ("2.1+", "2.0", "1.13-segments", "json")
EXPECTED = {
    "peak": 15644,
    "peak_index": 4,
    "end": 10948,
    "preexisting": 12096,
    "reserved": 22 * MIB,
    "events": 9,
    "storage_sizes": [4096, 8000, 1000, 2048, 500, 900],
}


def _frames(*names: str) -> list[dict[str, Any]]:
    """A stack, innermost frame first (as PyTorch writes it)."""
    return [{"filename": f"/work/{name}.py", "line": 10 + i, "name": name} for i, name in enumerate(names)]


STACKS = {
    "fwd": _frames("linear", "forward", "train_step"),
    "param": _frames("init_weights", "__init__", "main"),
    "bwd": _frames("backward", "train_step"),
    "load": _frames("load_state_dict", "main"),
    "seg": _frames("malloc_segment", "train_step"),
}
TAG = "vramlens;phase={};module={};category={}"

#: (action, address, size, stack, user_metadata, time offset in us)
_TRACE: list[tuple[str, int, int, str | None, str, int]] = [
    ("segment_alloc", S1, 2 * MIB, "seg", "", 0),
    ("alloc", S1, 1000, "fwd", TAG.format("forward", "model.fc", "activations"), 10),
    ("alloc", S1 + 1024, 2048, "param", TAG.format("forward", "model", "parameters"), 20),
    ("alloc", S1 + 3072, 500, "fwd", TAG.format("forward", "model.fc", "temporary"), 30),
    ("free_requested", S1, 1000, "bwd", "vramlens;phase=backward", 40),
    ("free_completed", S1, 1000, "bwd", "vramlens;phase=backward", 41),
    ("free_requested", S0 + 8192, 4096, None, "", 50),
    ("free_completed", S0 + 8192, 4096, None, "", 51),
    ("alloc", S1, 900, "bwd", TAG.format("backward", "model.fc", "gradients"), 60),
    ("oom", 1 << 30, 10 << 30, "bwd", "", 70),  # address slot holds device_free
    ("free_requested", S1 + 3072, 500, None, "", 80),
    ("free_completed", S1 + 3072, 500, None, "", 81),
    ("annotate", S1 + 1024, 0, None, "vramlens;category=optimizer_state", 85),
    ("snapshot", 0, 0, None, "", 90),
    ("workspace_snapshot", 0, 0, None, "", 95),
]
#: Segments at dump time: (address, total size, type, [(offset, block size, requested, state, stack)]).
_SEGMENTS = [
    (
        S0,
        20 * MIB,
        "large",
        [(0, 8192, 8000, "active_allocated", "load"), (8192, 20 * MIB - 8192, 0, "inactive", None)],
    ),
    (
        S1,
        2 * MIB,
        "small",
        [
            (0, 1024, 900, "active_allocated", "bwd"),
            (1024, 2048, 2048, "active_allocated", "param"),
            (3072, 2 * MIB - 3072, 0, "inactive", None),
        ],
    ),
]


def _segment(address: int, total: int, kind: str, blocks: list[Any], layout: str) -> dict[str, Any]:
    """One segment dict with the keys of ``layout`` (blocks with ``address``/``frames`` from 2.1,
    ``history`` before)."""
    allocated = sum(size for _, size, _, state, _ in blocks if state == "active_allocated")
    segment: dict[str, Any] = {"device": 0, "address": address, "total_size": total, "allocated_size": allocated}
    segment |= {"active_size": allocated, "stream": 0, "segment_type": kind}
    out = []
    for offset, size, requested, state, stack in blocks:
        if layout == "2.1+":
            frames = STACKS[stack] if stack else []
            out.append({"address": address + offset, "size": size, "requested_size": requested, "state": state})
            out[-1]["frames"] = frames
        else:
            block: dict[str, Any] = {"size": size, "state": state}
            if state != "inactive":
                block["history"] = [
                    {"addr": address + offset, "real_size": requested, "frames": STACKS[stack or "fwd"]}
                ]
            out.append(block)
    if layout == "2.1+":
        segment |= {"requested_size": sum(r for _, _, r, s, _ in blocks if s != "inactive"), "is_expandable": False}
        segment |= {"segment_pool_id": (0, 0), "frames": STACKS["seg"] if address == S1 else []}
    segment["blocks"] = out
    return segment


def _entry(action: str, addr: int, size: int, stack: str | None, meta: str, dt: int, layout: str) -> dict[str, Any]:
    """One trace entry with the keys of ``layout``."""
    entry: dict[str, Any] = {"action": action, ("device_free" if action == "oom" else "addr"): addr, "size": size}
    entry["stream"] = 0
    if stack is not None:
        entry["frames"] = STACKS[stack]
    if layout == "2.1+":
        entry |= {"time_us": T0 + dt, "compile_context": "", "user_metadata": meta}
    return entry


def scenario_snapshot(layout: str = "2.1+") -> Any:
    """The scenario of the module docstring in ``layout`` (one of :data:`LAYOUTS`; ``json`` gives a str)."""
    if layout == "json":
        return json.dumps(scenario_snapshot("2.1+"))
    style = "2.1+" if layout == "2.1+" else "old"
    segments = [_segment(*spec, layout=style) for spec in _SEGMENTS]
    if layout == "1.13-segments":
        return segments
    newest_only = {"annotate", "workspace_snapshot"}
    rows = [row for row in _TRACE if style == "2.1+" or row[0] not in newest_only]
    snapshot: dict[str, Any] = {"segments": segments, "device_traces": [[_entry(*row, layout=style) for row in rows]]}
    if style == "2.1+":
        snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}
        snapshot["external_annotations"] = [
            {"name": "ProfilerStep#3", "stage": "START", "device": 0, "time_us": T0 + 5},
            {"name": "ProfilerStep#3", "stage": "END", "device": 0, "time_us": T0 + 55},
            {"name": "ProfilerStep#4", "stage": "START", "device": 0, "time_us": T0 + 56},
        ]
    return snapshot


def reference_peak_end(snapshot: dict[str, Any], device: int = 0) -> tuple[int, int]:
    """(peak, end) live requested bytes, computed the plain way: one dict of live addresses,
    frees without an allocation and never-mentioned active blocks counted from the start."""
    entries = snapshot["device_traces"][device] if len(snapshot["device_traces"]) > device else []
    live: dict[int, int] = {}
    orphans = 0
    mentioned = set()
    for entry in entries:
        if entry["action"] in ("alloc", "free_completed"):
            mentioned.add(entry["addr"])
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
        elif entry["action"] == "free_completed" and live.pop(entry["addr"], None) is None:
            orphans += entry["size"]
    ghosts = sum(
        block["requested_size"]
        for segment in snapshot["segments"]
        if segment["device"] == device
        for block in segment["blocks"]
        if block["state"] == "active_allocated" and block["address"] not in mentioned
    )
    current = peak = orphans + ghosts
    live.clear()
    for entry in entries:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            current += entry["size"]
        elif entry["action"] == "free_completed":
            current -= live.pop(entry["addr"], entry["size"])
        peak = max(peak, current)
    return peak, current


def synthetic_snapshot(
    n_events: int, *, seed: int = 0, tagged: bool = False, max_entries: int | None = None
) -> dict[str, Any]:
    """A realistic 2.1+ snapshot with about ``n_events`` trace entries (see the module docstring).

    Size classes each get their own segments (64 MiB) cut into equal blocks; freed blocks are
    reused last-in first-out, so addresses recur. 300 stacks of 5 frames (from 600 distinct
    frames) are shared objects, as in real dumps. Allocations come in steps (allocation-heavy
    then free-heavy halves). ``max_entries`` keeps only the newest entries (a ring buffer).
    """
    rng = random.Random(seed)
    pool = [{"filename": f"/src/pkg/mod{i % 40}.py", "line": 1 + i, "name": f"fn{i}"} for i in range(600)]
    stacks = [[rng.choice(pool) for _ in range(5)] for _ in range(300)]
    kinds = (("forward", "activations"), ("backward", "gradients"), ("optimizer_step", "optimizer_state"))
    tags = [TAG.format(phase, f"model.layers.{layer}", category) for layer in range(4) for phase, category in kinds]
    state = _Allocator(rng)
    for _ in range(400):  # before recording: some stay (ghosts), some are freed in the trace (orphans)
        state.allocate(rng.choice(_CLASSES), None, 0)
    entries: list[dict[str, Any]] = []
    time = T0
    operations = 0
    while len(entries) < n_events:
        time += rng.randrange(1, 20)
        operations += 1
        want_alloc = rng.random() < (0.7 if (operations // 1000) % 2 == 0 else 0.3)
        stack = stacks[rng.randrange(300)]
        meta = tags[rng.randrange(len(tags))] if tagged else ""
        if want_alloc or len(state.live) < 50:
            entries += state.allocate(rng.choice(_CLASSES), stack, time, meta)
        else:
            entries += state.free(stack, time, meta)
    if max_entries is not None:
        entries = entries[-max_entries:]
    settings: dict[str, Any] = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}
    if max_entries is not None:
        settings["trace_alloc_max_entries"] = max_entries
    return {"segments": state.segments(), "device_traces": [entries], "allocator_settings": settings}


#: (block size, largest requested size) of the synthetic allocator's size classes.
_CLASSES = ((512, 512), (4096, 4096), (65536, 65536), (1 << 20, 1 << 20), (4 << 20, 4 << 20))
_SEGMENT = 64 << 20


class _Allocator:
    """Equal-block segments per size class with LIFO reuse: enough allocator to make a
    consistent trace and final ``segments``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.free_slots: dict[int, list[int]] = {block: [] for block, _ in _CLASSES}
        self.live: dict[int, tuple[int, int, list[Any] | None]] = {}  # addr -> (block, requested, stack)
        self.order: list[int] = []
        self.owner: list[tuple[int, int]] = []  # (segment address, block size)
        self.next_segment = S0

    def allocate(self, cls: tuple[int, int], stack: Any, time: int, meta: str = "") -> list[dict[str, Any]]:
        """Entries for one allocation (and a segment_alloc when a new segment is needed)."""
        block, largest = cls
        out: list[dict[str, Any]] = []
        if not self.free_slots[block]:
            address = self.next_segment
            self.next_segment += _SEGMENT
            self.owner.append((address, block))
            self.free_slots[block] = list(range(address + _SEGMENT - block, address - 1, -block))
            out.append(_raw("segment_alloc", address, _SEGMENT, stack, time, meta))
        address = self.free_slots[block].pop()
        requested = largest - self.rng.randrange(0, min(largest, 512))
        self.live[address] = (block, requested, stack)
        self.order.append(address)
        out.append(_raw("alloc", address, requested, stack, time, meta))
        return out if stack is not None else []

    def free(self, stack: Any, time: int, meta: str) -> list[dict[str, Any]]:
        """Entries for freeing a random live allocation (free_requested, then free_completed)."""
        index = self.rng.randrange(len(self.order))
        self.order[index], self.order[-1] = self.order[-1], self.order[index]
        address = self.order.pop()
        block, requested, _ = self.live.pop(address)
        self.free_slots[block].append(address)
        return [_raw(action, address, requested, stack, time, meta) for action in ("free_requested", "free_completed")]

    def segments(self) -> list[dict[str, Any]]:
        """The segments at dump time; runs of free blocks merged into one inactive block."""
        result = []
        for address, block in self.owner:
            blocks: list[dict[str, Any]] = []
            for slot in range(address, address + _SEGMENT, block):
                held = self.live.get(slot)
                if held is None and blocks and blocks[-1]["state"] == "inactive":
                    blocks[-1]["size"] += block
                    continue
                requested, frames = (held[1], held[2] or []) if held else (0, [])
                state = "active_allocated" if held else "inactive"
                blocks.append(
                    {"address": slot, "size": block, "requested_size": requested, "state": state, "frames": frames}
                )
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            result.append(
                {
                    "device": 0,
                    "address": address,
                    "total_size": _SEGMENT,
                    "allocated_size": allocated,
                    "active_size": allocated,
                }
                | {
                    "requested_size": 0,
                    "stream": 0,
                    "segment_type": "large",
                    "segment_pool_id": (0, 0),
                    "blocks": blocks,
                }
            )
        return result


def _raw(action: str, addr: int, size: int, stack: Any, time: int, meta: str) -> dict[str, Any]:
    """A newest-layout trace entry."""
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": time,
        "frames": stack,
        "compile_context": "",
        "user_metadata": meta,
    }
