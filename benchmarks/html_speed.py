"""Speed and size of the HTML report of a 10**7-event timeline, and how fast Chromium draws it.

Run: ``python benchmarks/html_speed.py [--events 10000000] [--points 4000] [--out PATH] [--no-browser]``.
Prints figures; it is not a pass/fail test. Targets (issue 7): the file written in at most
5 s, at most 5 MB, opened and drawn in Chromium in at most 3 s.

The timeline is built with numpy: ``events // 2`` storages, each allocated and later freed
(log-uniform sizes from 512 B to 64 MiB, lifetimes of up to a few thousand events), six
categories, three phases repeating per step (forward, backward, optimizer), 200 modules and
300 distinct five-frame stacks, stamped in nanoseconds. The report around it is built as
``vramlens view`` would (phases at their high points), without the view's slower forensics.
The browser part needs playwright (pip) and Debian's chromium (``/usr/bin/chromium``); it
opens the file from a ``file://`` URL with every network request aborted and waits for the
flag the page sets after uPlot's first draw (``window.vramlens.drawnAt``, milliseconds since
navigation started).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from vramlens.categories import Category
from vramlens.report.html import save_html
from vramlens.result.report import MemoryReport, PhaseMemory
from vramlens.result.timeline import CATEGORY_ORDER, Timeline

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_CATEGORIES = (
    Category.PARAMETERS,
    Category.GRADIENTS,
    Category.OPTIMIZER_STATE,
    Category.ACTIVATIONS,
    Category.TEMPORARY,
    Category.INPUTS,
)


def build_timeline(events: int, seed: int = 0) -> Timeline:
    """``events`` events: ``events // 2`` allocations, each freed later (module docstring)."""
    rng = np.random.default_rng(seed)
    storages = events // 2
    sizes = np.exp(rng.uniform(np.log(512), np.log(64 * 2**20), storages)).astype(np.int64)
    born = np.arange(storages, dtype=np.int64) * 2
    dies = born + 1 + 2 * rng.integers(0, 4000, storages)
    order = np.argsort(np.concatenate([born, dies]), kind="stable")
    storage = np.concatenate([np.arange(storages), np.arange(storages)])[order].astype(np.int64)
    nbytes = np.concatenate([sizes, -sizes])[order]
    codes = np.array([CATEGORY_ORDER.index(c) for c in _CATEGORIES], dtype=np.int8)
    category = codes[rng.integers(0, len(codes), storages)][storage]
    step = np.arange(len(nbytes), dtype=np.int64) * 6 // max(1, len(nbytes) // 50)  # 50 steps, 3 phases each
    phase = np.minimum(step % 6 // 2, 2).astype(np.int32)
    module = rng.integers(0, 200, storages).astype(np.int32)[storage]
    stack = rng.integers(0, 300, storages).astype(np.int32)[storage]
    stacks = tuple(
        "\n".join(f"/src/train/file_{s % 17}.py:{10 + f * s % 400} in frame_{f}_{s}" for f in range(5))
        for s in range(300)
    )
    return Timeline(
        time=np.arange(len(nbytes), dtype=np.int64) * 137,
        nbytes=nbytes,
        category=category,
        phase=phase,
        module=module,
        stack=stack,
        storage=storage,
        phases=("forward", "backward", "optimizer"),
        modules=tuple(f"model.layers.{i // 8}.block.{i % 8}" for i in range(200)),
        stacks=stacks,
        time_unit="ns",
        level="allocated",
    )


def build_report(timeline: Timeline) -> MemoryReport:
    """A measured MemoryReport around ``timeline``: each phase at its high point."""
    live = timeline.live_bytes
    phases = []
    for code, name in enumerate(timeline.phases):
        where = np.flatnonzero(timeline.phase == code)
        at = int(where[np.argmax(live[where])])
        phases.append(PhaseMemory(name=name, allocated_bytes=int(live[at]), breakdown=timeline.breakdown_at(at)))
    peak = max(phases, key=lambda phase: phase.allocated_bytes)
    return MemoryReport(
        engine="measured",
        model="synthetic-10M",
        workload={"model": "synthetic-10M", "events": len(timeline)},
        phases=tuple(phases),
        peak_phase=peak.name,
        allocated_bytes=peak.allocated_bytes,
        reserved_bytes=peak.allocated_bytes,
        device_bytes=peak.allocated_bytes,
        gpu="h100-80gb",
        capacity_bytes=80 * 2**30,
        assumptions=("synthetic timeline (benchmarks/html_speed.py)",),
        timeline=timeline,
    )


def open_in_chromium(path: Path) -> tuple[float, float, int]:
    """``(ms from navigation start to the first draw, wall seconds from launch to drawn,
    network requests)`` for the report at ``path``."""
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    started = time.perf_counter()
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        context.route(
            "**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort()
        )
        page = context.new_page()
        page.on("request", lambda request: requests.append(request.url))
        page.goto(path.resolve().as_uri())
        page.wait_for_function("window.vramlens && window.vramlens.drawn", timeout=30_000)
        drawn_ms = float(page.evaluate("window.vramlens.drawnAt"))
        wall = time.perf_counter() - started
        context.close()
    return drawn_ms, wall, sum(not url.startswith("file:") for url in requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10**7)
    parser.add_argument("--points", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: a temp file)")
    parser.add_argument("--no-browser", action="store_true", help="skip opening the report in Chromium")
    args = parser.parse_args()

    started = time.perf_counter()
    timeline = build_timeline(args.events)
    report = build_report(timeline)
    print(f"built {len(timeline):,} events and the report in {time.perf_counter() - started:.1f} s")

    with tempfile.TemporaryDirectory() as folder:
        path = args.out or Path(folder) / "report.html"
        started = time.perf_counter()
        save_html(report, path, max_points=args.points)
        seconds = time.perf_counter() - started
        size = path.stat().st_size
        print(f"save_html: {seconds:.2f} s (target <= 5 s); {size / 1e6:.2f} MB (target <= 5 MB) -> {path}")
        if args.no_browser:
            return
        if not Path(CHROMIUM).exists():
            print(f"browser: skipped ({CHROMIUM} not installed)")
            return
        drawn_ms, wall, requests = open_in_chromium(path)
        print(
            f"chromium: drawn {drawn_ms / 1000:.2f} s after navigation started (target <= 3 s); "
            f"{wall:.2f} s from launch; {requests} network requests"
        )


if __name__ == "__main__":
    main()
