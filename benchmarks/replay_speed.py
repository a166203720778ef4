"""What one GPU's whole-step replay (``reserved_replay: true``, the default since the H200 battery of
2026-11-27 showed the closed form up to 13% under) costs beside the closed form (``false``).

Run: ``python benchmarks/replay_speed.py [--count 30] [--rounds 3]``. Prints figures and ratios,
measured in this process; it is not a pass/fail test.

The yardstick (issue 20 item 1, issue 23 speed): the replay was to become the default if an estimate
with it cost at most about 2x the fitted closed form (it costs 20-90x; it became the default on the
evidence of real GPUs, and the planner's search and the web page keep the closed form) on a 70B and an 8B
single-GPU workload. Each workload (8B LoRA, 8B full fine-tune, 70B QLoRA, on one H100) is swept
over ``--count`` distinct (batch, seq) points per round, so that no replay is found memoized (a
planner or the web page asks about a new size each time); rounds alternate the closed form and the
replay, and the medians per estimate are printed with their ratio. Times are CPU time of this
process (``time.process_time``: this machine is shared). The model is resolved once, as a planner
holds it.

Then the replay alone on one point of each workload: its requests (events), the replay before
(``pattern_peaks`` of the finished event list) and now (``step_pattern(..., into=replaying_pattern())``:
each request replayed as it is written), their ratio, and a check that both give the same peaks.

Last, what bounds any exact replay from below, on the same points: writing the step's requests
alone (into a pattern that drops them), and replaying the small pool's requests alone (<= 1 MiB:
2 MiB segments; pools never meet, so its segments must be replayed whatever is done with the rest).
And, for the 8B LoRA, the small pool's segments after a step of 1..40 layers: their increments are
not periodic at any short period, so no extrapolation from a few layers gives them exactly.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable

from vramlens.allocator import AllocatorSettings, round_size
from vramlens.allocator._blocks import K_SMALL_BUFFER, K_SMALL_SIZE
from vramlens.allocator.pattern import Pattern, pattern_peaks
from vramlens.allocator.replaying import ReplayingPattern, replaying_pattern
from vramlens.estimator import estimate
from vramlens.estimator.layout import param_layout
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.reserved import allocator_settings, training_loss_script
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload
from vramlens.workload.spec import Workload

WORKLOADS = {
    "8B LoRA": {"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048},
    "8B full": {"model": "llama-3.1-8b", "method": "full", "batch": 1, "seq": 2048},
    "70B QLoRA": {"model": "llama-3-70b", "method": "qlora", "batch": 1, "seq": 2048},
}


def _points(base: Workload, first: int, count: int) -> list[Workload]:
    """``count`` distinct sizes of ``base``: batch 1..8, seq 512 + 64k (none repeated in a run)."""
    return [dataclasses.replace(base, batch=1 + i % 8, seq=512 + 64 * (i // 8)) for i in range(first, first + count)]


def _per_call(calls: list[Callable[[], object]]) -> float:
    """CPU seconds per call, over the list."""
    start = time.process_time()
    for call in calls:
        call()
    return (time.process_time() - start) / len(calls)


def sweep(name: str, data: dict[str, object], count: int, rounds: int) -> None:
    spec = load_model(str(data["model"]))
    base = load_workload({**data, "model": spec, "gpu": "h100-80gb"})
    estimate(base)
    estimate(dataclasses.replace(base, reserved_replay=True))  # per-model memo warm, as in a planner
    default, replay = [], []
    for round_index in range(rounds):
        points = _points(base, 2 * round_index * count, 2 * count)
        closed = [dataclasses.replace(w, reserved_replay=False) for w in points[:count]]
        default.append(_per_call([lambda w=w: estimate(w) for w in closed]))
        replayed = [dataclasses.replace(w, reserved_replay=True) for w in points[count:]]
        replay.append(_per_call([lambda w=w: estimate(w) for w in replayed]))
    ours, theirs = statistics.median(replay), statistics.median(default)
    print(
        f"{name:10s} closed form {1e3 * theirs:7.2f} ms   with replay {1e3 * ours:7.2f} ms   "
        f"ratio {ours / theirs:5.1f}x (target <= ~2x)"
    )


def _best(call: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times)


def _step(data: dict[str, object]) -> tuple[Callable[..., Pattern], AllocatorSettings, int]:
    """(write the step's pattern into a given pattern or a new one, the allocator settings, layers)."""
    workload = load_workload(data)
    ctx = resolve_training(load_model(workload.model), workload)
    layout = param_layout(ctx)
    mem = stage_memory(ctx, layout.stages[0], layout.targets)
    shape, loss = step_shape(ctx, mem, layout.targets), training_loss_script(ctx, mem, layout.targets)
    settings, micro = allocator_settings(workload.alloc_conf), min(workload.grad_accum, 2)

    def write(into: Pattern | None = None, layers: int = shape.layers) -> Pattern:
        return step_pattern(shape, loss, layers=layers, micro_steps=micro, into=into)

    return write, settings, shape.layers


def replay_alone(name: str, data: dict[str, object]) -> None:
    write, settings, _ = _step(data)

    def before() -> object:
        return pattern_peaks(write(), settings)

    def now() -> object:
        sink = replaying_pattern(settings)
        write(sink)
        return sink.peaks()

    events = len(write())
    old, new = _best(before), _best(now)
    same = "same peaks" if before() == now() else "PEAKS DIFFER"
    print(
        f"{name:10s} {events:6,d} events   before {1e3 * old:6.2f} ms   now {1e3 * new:6.2f} ms "
        f"({1e6 * new / events:.2f} us/event)   speed-up {old / new:4.2f}x   {same}"
    )


class _Dropped(Pattern):
    """A pattern that hands out keys and keeps nothing (the cost of writing the requests alone)."""

    def alloc(self, nbytes: int, stream: int = 0) -> int:
        if nbytes <= 0:
            return -1
        self._next += 1
        return self._next - 1

    def free(self, key: int) -> None:
        pass


def _small_pool(pattern: Pattern, settings: AllocatorSettings) -> list[tuple[int, int, int]]:
    """The events of ``pattern`` in small pools (rounded request <= 1 MiB), their frees included."""
    small = {key for nbytes, key, _ in pattern.events if nbytes > 0 and round_size(nbytes, settings) <= K_SMALL_SIZE}
    return [event for event in pattern.events if event[1] in small]


def _replay(events: list[tuple[int, int, int]], settings: AllocatorSettings) -> ReplayingPattern:
    sink, keys = replaying_pattern(settings), {}
    for nbytes, key, stream in events:
        if nbytes > 0:
            keys[key] = sink.alloc(nbytes, stream)
        else:
            sink.free(keys.pop(key, -1))
    return sink


def floors(name: str, data: dict[str, object]) -> None:
    write, settings, _ = _step(data)
    small = _small_pool(write(), settings)
    writing, replaying = _best(lambda: write(_Dropped())), _best(lambda: _replay(small, settings))
    print(
        f"{name:10s} writing the requests alone {1e3 * writing:6.2f} ms   "
        f"the small pool's {len(small):6,d} events alone {1e3 * replaying:6.2f} ms"
    )


def small_segments(data: dict[str, object], most: int) -> None:
    write, settings, _ = _step(data)
    counts = [
        _replay(_small_pool(write(layers=layers), settings), settings).levels()[1] // K_SMALL_BUFFER
        for layers in range(1, most + 1)
    ]
    steps = [later - earlier for earlier, later in itertools.pairwise(counts)]
    print(f"8B LoRA small-pool segments after a step of 1..{most} layers: {counts}")
    print(f"  increments: {steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=30, help="distinct workloads per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("Estimates of distinct workloads on one H100, CPU time per estimate (medians of the rounds):")
    for name, data in WORKLOADS.items():
        sweep(name, data, args.count, args.rounds)
    print("The replay alone, one workload each (best of 5):")
    for name, data in WORKLOADS.items():
        replay_alone(name, data)
    print("Lower bounds of any exact replay (best of 5):")
    for name, data in WORKLOADS.items():
        floors(name, data)
    small_segments(WORKLOADS["8B LoRA"], 40)


if __name__ == "__main__":
    main()
