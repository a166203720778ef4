"""Speed and memory of reading a large PyTorch memory snapshot and summarising it.

Run: ``python benchmarks/snapshot_read.py [--events 1000000] [--file PATH] [--keep]``. Prints
figures; it is not a pass/fail test. Target (issue 6): read + summarise 10**6 events in at
most 5 s and 2 GiB of resident memory.

A synthetic 2.1+ snapshot pickle is generated first (``tests/snapshot/layouts.py``
``synthetic_snapshot``: ~5 frames per stack from 300 distinct stacks shared through the pickle
memo, LIFO address reuse, 64 MiB segments per size class, blocks allocated before recording,
``user_metadata`` tags), unless ``--file`` names an existing snapshot. The measurement then
runs in a fresh Python process so that its peak RSS (``resource.getrusage``) counts only
the reading: ``load_snapshot`` (opcode check, restricted unpickling, columns),
``Snapshot.timeline()`` and a summary: the peak, the breakdown by category at the peak and
the 10 largest allocations live at the peak with their stacks.
"""

from __future__ import annotations

import argparse
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vramlens.result.timeline import Timeline

ROOT = Path(__file__).resolve().parent.parent


def generate(events: int, path: Path) -> None:
    """Write a synthetic snapshot with ``events`` trace entries to ``path``."""
    sys.path.insert(0, str(ROOT / "tests" / "snapshot"))
    from layouts import synthetic_snapshot

    started = time.perf_counter()
    snapshot = synthetic_snapshot(events, tagged=True)
    with open(path, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)
    size = path.stat().st_size / 2**20
    print(f"generated {events:,} entries -> {path} ({size:.1f} MiB) in {time.perf_counter() - started:.1f} s")


def top_live(timeline: Timeline, index: int, count: int = 10) -> list[tuple[int, str]]:
    """``(bytes, innermost frame)`` of the ``count`` largest allocations live after event ``index``."""
    upto = slice(0, index + 1)
    held = np.bincount(timeline.storage[upto], weights=timeline.nbytes[upto])
    live = np.flatnonzero(held > 0)
    best = live[np.argsort(held[live])[::-1][:count]]
    _, first = np.unique(timeline.storage, return_index=True)  # each storage's allocation event
    stacks = timeline.stack[first[best]].tolist()
    frames = [timeline.stacks[code].splitlines()[-1] if code >= 0 else "?" for code in stacks]
    return [(int(held[s]), frame) for s, frame in zip(best.tolist(), frames, strict=True)]


def measure(path: Path) -> None:
    """Read and summarise ``path``; print the stage times and the peak RSS of this process."""
    from vramlens.snapshot import load_snapshot
    from vramlens.units import format_bytes

    start = time.perf_counter()
    snapshot = load_snapshot(path)
    loaded = time.perf_counter()
    timeline = snapshot.timeline(snapshot.devices[0])
    converted = time.perf_counter()
    peak = timeline.peak_index
    breakdown = timeline.breakdown_at(peak)
    top = top_live(timeline, peak)
    done = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    print(f"trace entries: {timeline.metadata['trace_entries']:,}; timeline events: {len(timeline):,}")
    print(f"peak: {format_bytes(timeline.peak_bytes)} at event {peak:,}")
    print("breakdown at peak: " + ", ".join(f"{c.value} {format_bytes(b)}" for c, b in breakdown.items()))
    print("largest live at peak: " + "; ".join(f"{format_bytes(size)} {frame}" for size, frame in top[:3]))
    print(
        f"load_snapshot: {loaded - start:.2f} s | timeline(): {converted - loaded:.2f} s | "
        f"summary: {done - converted:.2f} s"
    )
    print(f"TOTAL read + summarise: {done - start:.2f} s; peak RSS {rss:.2f} GiB")


def main() -> None:
    """Parse the arguments, generate the snapshot if needed, then measure in a fresh process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--file", type=Path, default=None, help="an existing snapshot (else one is generated)")
    parser.add_argument("--keep", action="store_true", help="keep the generated file")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        measure(args.measure)
        return
    if args.file is not None:
        subprocess.run([sys.executable, __file__, "--measure", str(args.file)], check=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"snapshot_{args.events}.pickle"
        generate(args.events, path)
        subprocess.run([sys.executable, __file__, "--measure", str(path)], check=True)
        if args.keep:
            kept = Path(tempfile.gettempdir()) / path.name
            path.replace(kept)
            print(f"kept {kept}")


if __name__ == "__main__":
    main()
