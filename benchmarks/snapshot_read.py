"""Speed and memory of reading a large PyTorch memory snapshot and summarising it.

Run: ``python benchmarks/snapshot_read.py [--events 1000000] [--file PATH] [--keep] [--rounds 3]``.
Prints figures and ratios; it is not a pass/fail test. Target (issue 23, item 5): reading a
10**6-event snapshot safely and summarising it, ``vramlens view FILE --format json`` as a whole
process, no slower than a plain, unsafe ``pickle.load`` of the same file (a fresh process that
only loads it), measured in the same run, and at most 1 GiB of resident memory. The two
processes alternate for ``--rounds`` rounds (after an untimed one that writes the bytecode
caches); the wall time, CPU time (user + system) and peak RSS of each child come from
``os.wait4``; the medians and the ratios are printed (CPU time is the steadier figure on a
loaded machine).

The stage breakdown below (the older measurement, issue 6: at most 5 s and 2 GiB) runs after it,
then the time of each stage of ``view`` as a multiple of a plain ``pickle.loads`` in that process.

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
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def stages(path: Path) -> None:
    """Where ``vramlens view`` spends its time, stage by stage, each as a multiple of a plain
    ``pickle.loads`` of the same bytes timed first in this process (the yardstick: collector on)."""
    import gc
    import io

    from vramlens._untrusted import check_tree
    from vramlens.allocator import replay
    from vramlens.forensics.view import build_view
    from vramlens.snapshot._unpickle import _DataOnlyUnpickler, check_opcodes, expanded_budget
    from vramlens.snapshot.reader import snapshot_from_object

    data = path.read_bytes()
    started = time.perf_counter()
    pickle.loads(data)
    yardstick = time.perf_counter() - started
    times: dict[str, float] = {}

    def timed(stage: str, work: Any) -> Any:
        begun = time.perf_counter()
        result = work()
        times[stage] = time.perf_counter() - begun
        return result

    timed("opcode check", lambda: check_opcodes(data, "x"))
    gc.disable()
    reader = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)
    obj = timed("C unpickler (collector paused)", lambda: _DataOnlyUnpickler(reader).load())
    timed("check_tree", lambda: check_tree(obj, name="x", max_values=expanded_budget(len(data))))
    snapshot = timed("columns (snapshot_from_object)", lambda: snapshot_from_object(obj, "x"))
    timed("freeing the unpickled object", lambda: obj.clear())
    gc.enable()
    timeline = timed("timeline()", lambda: snapshot.timeline(snapshot.devices[0]))
    timed("allocator replay", lambda: replay(timeline.nbytes, timeline.storage))
    timed("build_view without the replay", lambda: build_view(timeline, replay_allocator=False))
    print(f"stages, as multiples of a plain pickle.loads in this process ({yardstick:.2f} s):")
    for stage, seconds in times.items():
        print(f"  {stage:34s} {seconds:6.2f} s {seconds / yardstick:6.2f}x")
    print(f"  {'sum':34s} {sum(times.values()):6.2f} s {sum(times.values()) / yardstick:6.2f}x")


_PLAIN_LOAD = "import pickle, sys\nwith open(sys.argv[1], 'rb') as f:\n    pickle.load(f)\n"


#: Children run with bytecode caches, as an installed package has them: without this, a shell
#: with PYTHONDONTWRITEBYTECODE set recompiles every vramlens module (and the dataclass methods
#: of ``vramlens._dataclass_cache``) in each run, 0.1-0.2 s the plain pickle.load never pays.
_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def child(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS GiB) of one child process running ``argv`` (output discarded)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_ENV)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{argv[:4]} failed: {process.stderr.read().decode() if process.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 2**20  # ru_maxrss: KiB on Linux


def compare(path: Path, rounds: int) -> None:
    """``vramlens view PATH --format json`` against a plain ``pickle.load`` of PATH, alternating."""
    sides = {
        "plain pickle.load (unsafe)": [sys.executable, "-c", _PLAIN_LOAD, str(path)],
        "vramlens view --format json (safe)": [sys.executable, "-m", "vramlens", "view", str(path), "--format", "json"],
    }
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    for argv in sides.values():  # an untimed first round writes the bytecode caches
        child(argv)
    for _ in range(rounds):
        for name, argv in sides.items():
            runs[name].append(child(argv))
    base_wall, base_cpu, _ = (
        statistics.median(column) for column in zip(*runs["plain pickle.load (unsafe)"], strict=True)
    )
    print(f"{rounds} alternating rounds, medians (target: view <= 1.0x pickle.load, <= 1 GiB RSS)")
    print(f"{'':36s} {'wall s':>8s} {'cpu s':>8s} {'RSS GiB':>8s} {'wall x':>7s} {'cpu x':>7s}")
    for name, values in runs.items():
        wall, cpu, rss = (statistics.median(column) for column in zip(*values, strict=True))
        print(f"{name:36s} {wall:8.2f} {cpu:8.2f} {rss:8.2f} {wall / base_wall:7.2f} {cpu / base_cpu:7.2f}")


def main() -> None:
    """Parse the arguments, generate the snapshot if needed, then measure in fresh processes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--file", type=Path, default=None, help="an existing snapshot (else one is generated)")
    parser.add_argument("--keep", action="store_true", help="keep the generated file")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of view and pickle.load")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        measure(args.measure)
        stages(args.measure)
        return
    if args.file is not None:
        compare(args.file, args.rounds)
        subprocess.run([sys.executable, __file__, "--measure", str(args.file)], check=True)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"snapshot_{args.events}.pickle"
        generate(args.events, path)
        compare(path, args.rounds)
        subprocess.run([sys.executable, __file__, "--measure", str(path)], check=True)
        if args.keep:
            kept = Path(tempfile.gettempdir()) / path.name
            path.replace(kept)
            print(f"kept {kept}")


if __name__ == "__main__":
    main()
