"""Time of ``vramlens.estimator.step_time`` (issue 8: 1000 calls in < 0.2 s, i.e. < 0.2 ms each).

Run: ``python benchmarks/step_time_speed.py [--calls 1000]``. Prints figures; it is not a
pass/fail test. Workloads are loaded once (as the planner holds them); each line times
``--calls`` calls of ``step_time`` on one of them and prints the step's parts.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from vramlens.estimator.time import step_time
from vramlens.workload.load import load_workload

WORKLOADS: tuple[dict[str, Any], ...] = (
    {"model": "llama-3.1-8b", "gpu": "h100", "batch": 1, "seq": 2048},
    {"model": "llama-3.1-8b", "gpu": "a100-80gb", "method": "qlora", "recompute": "full"},
    {
        "model": "llama-3.1-70b",
        "gpu": "h100",
        "grad_accum": 8,
        "parallel": {"gpus": 64, "tp": 8, "pp": 4, "shard": "zero1"},
    },
    {"model": "mixtral-8x7b", "gpu": "h200", "parallel": {"gpus": 16, "shard": "hsdp", "shard_degree": 8, "ep": 8}},
    {
        "model": "qwen2.5-7b",
        "gpu": "rtx-4090",
        "parallel": {"gpus": 2, "shard": "zero3", "offload": "optimizer+params"},
    },
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    calls = parser.parse_args().calls
    print(
        f"{'workload':60s} {'step s':>8s} {'comp':>6s} {'comm':>6s} {'offl':>6s} {'bubl':>6s} {f'{calls} calls s':>14s}"
    )
    for raw in WORKLOADS:
        workload = load_workload(raw)
        start = time.perf_counter()
        for _ in range(calls):
            result = step_time(workload)
        elapsed = time.perf_counter() - start
        label = ", ".join(f"{k}={v}" for k, v in raw.items() if k != "gpu")
        print(
            f"{label[:60]:60s} {result.seconds:8.3f} {result.compute_s:6.3f} {result.communication_s:6.3f} "
            f"{result.offload_s:6.3f} {result.bubble_s:6.3f} {elapsed:14.4f}"
        )


if __name__ == "__main__":
    main()
