"""Speed of the caching-allocator replay (``vramlens.allocator.replay``).

Run: ``python benchmarks/allocator_replay.py [--events 1000000] [--seed 0]``. Prints figures; it
is not a pass/fail test. Issue "Allocator replay" target: 10^6 events in <= 5 s on a 2-core
machine. The timeline imitates training steps: persistent parameters and gradients, a forward
pass that saves activations and frees temporaries, a backward pass that frees them in reverse
while making gradient temporaries, an optimizer step; the batch varies by +-10% per step so
that cached blocks do not always fit. Each line replays the same events under one setting.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from vramlens.allocator import AllocatorSettings, replay

MIB = 1 << 20
SETTINGS = (
    ("default", ""),
    ("expandable_segments", "expandable_segments:True"),
    ("max_split_size_mb:128", "max_split_size_mb:128"),
    ("roundup_power2_divisions:4", "roundup_power2_divisions:4"),
)


class _Timeline:
    """Collects (size, key) events; a free repeats the key with the negative size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.keys: list[int] = []
        self.live: dict[int, int] = {}
        self.next_key = 0

    def alloc(self, nbytes: int) -> int:
        key = self.next_key
        self.next_key += 1
        self.sizes.append(nbytes)
        self.keys.append(key)
        self.live[key] = nbytes
        return key

    def free(self, key: int) -> None:
        self.sizes.append(-self.live.pop(key))
        self.keys.append(key)


def _step(
    timeline: _Timeline, rng: np.random.Generator, params: list[int], grads: dict[int, int], scale: float
) -> None:
    """One training step: forward (saved activations + temporaries), backward, optimizer."""
    saved: list[list[int]] = []
    for _layer in range(24):
        widths = rng.integers(1, 64, size=6) * 256 * 1024
        layer = [timeline.alloc(int(w * scale)) for w in widths[:4]]
        for small in rng.integers(512, 300_000, size=10):
            temp = timeline.alloc(int(small))
            timeline.free(temp)
        temp = timeline.alloc(int(widths[4] * scale * 3))
        layer.append(timeline.alloc(int(widths[5] * scale)))
        timeline.free(temp)
        saved.append(layer)
    for layer in reversed(saved):
        grad_temp = timeline.alloc(int(rng.integers(1, 48) * MIB * scale))
        for key in layer:
            timeline.free(key)
        for small in rng.integers(512, 200_000, size=6):
            timeline.free(timeline.alloc(int(small)))
        timeline.free(grad_temp)
    for index, param in enumerate(params):
        if index not in grads:
            grads[index] = timeline.alloc(param)
        temp = timeline.alloc(param)
        timeline.free(temp)


def training_timeline(events: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """At least ``events`` events of repeated training steps (sizes, keys as int64 arrays)."""
    rng = np.random.default_rng(seed)
    timeline = _Timeline()
    params = [int(s) for s in rng.choice([4096, 65536, 4 * MIB, 16 * MIB, 64 * MIB], size=200)]
    for nbytes in params:
        timeline.alloc(nbytes)
    grads: dict[int, int] = {}
    while len(timeline.sizes) < events:
        _step(timeline, rng, params, grads, float(rng.uniform(0.9, 1.1)))
    return np.array(timeline.sizes[:events], dtype=np.int64), np.array(timeline.keys[:events], dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    sizes, keys = training_timeline(args.events, args.seed)
    built = time.perf_counter() - start
    allocs = int((sizes > 0).sum())
    print(f"timeline: {len(sizes):,} events ({allocs:,} allocations), built in {built:.2f} s")
    print(
        f"{'setting':28s} {'seconds':>8s} {'events/s':>11s} {'peak alloc':>11s} {'peak resv':>10s} {'frag':>6s} {'segments':>9s}"
    )
    for label, conf in SETTINGS:
        settings = AllocatorSettings.from_conf(conf)
        start = time.perf_counter()
        result = replay(sizes, keys, settings=settings)
        seconds = time.perf_counter() - start
        print(
            f"{label:28s} {seconds:8.2f} {len(sizes) / seconds:11,.0f} "
            f"{result.peak_allocated_bytes / 2**30:8.2f} GiB {result.peak_reserved_bytes / 2**30:6.2f} GiB "
            f"{result.fragmentation:6.1%} {result.segments_created:9,d}"
        )
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak_rss_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
