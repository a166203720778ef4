"""Time of ``vramlens plan``: configurations covered, estimated, and seconds per plan.

Run: ``python benchmarks/plan_speed.py [--repeat 3]``. Prints figures; it is not a pass/fail
test. Issue 8's target: a full plan over >= 5,000 candidate configurations in <= 2 s.
``considered`` counts every configuration the search covered (estimated, implied to fit by
monotonicity, or skipped with a group whose most memory-saving point does not fit);
``estimated`` counts estimator calls; ``seconds`` is the median wall time of a whole
``plan()`` call (model and GPU resolved, search, step times, Pareto filter).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from vramlens.planner import plan

SCENARIOS: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("8B full, 1 x A100-80GB", {"model": "llama-3.1-8b"}, {"gpu": "a100-80gb", "gpus": 1}),
    ("8B full, 4 x A100-80GB", {"model": "llama-3.1-8b"}, {"gpu": "a100-80gb", "gpus": 4}),
    ("8B full, 8 x H100, method change", {"model": "llama-3.1-8b"}, {"gpu": "h100-80gb", "gpus": 8, "allow_method_change": True}),
    ("70B full, 8 x A100-80GB", {"model": "llama-3.1-70b"}, {"gpu": "a100-80gb", "gpus": 8}),
    ("70B, 1 x A100-80GB, method change", {"model": "llama-3.1-70b"}, {"gpu": "a100-80gb", "gpus": 1, "allow_method_change": True}),
    ("405B full, 1 x A100-80GB (impossible)", {"model": "llama-3.1-405b"}, {"gpu": "a100-80gb", "gpus": 1}),
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    print(f"{'scenario':42s} {'considered':>10s} {'estimated':>9s} {'entries':>7s} {'seconds':>8s}")
    for label, workload, options in SCENARIOS:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = plan(workload, **options)
            times.append(time.perf_counter() - start)
        print(
            f"{label:42s} {result.considered:10d} {result.estimated:9d} {len(result.candidates):7d}"
            f" {statistics.median(times):8.3f}"
        )


if __name__ == "__main__":
    main()
