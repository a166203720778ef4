"""Time of the capacity answers (``--max-batch``, ``--max-context``): a search over the estimator.

Run: ``python benchmarks/capacity_speed.py [--repeat 20]``. Prints figures; it is not a
pass/fail test. Issue 4's target: each answer in <= 50 ms. Two timings per question:
``first`` includes resolving the catalog model and the GPU (a fresh question in a running
process), ``warm`` repeats it (a UI re-asking with another setting). Each line also
prints how many estimates the search evaluated.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from vramlens.estimator import capacity

QUESTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("batch", {"model": "llama-3.1-8b", "engine": "hf", "gpu": "a100-80gb", "prompt": 2048, "generate": 512}),
    ("batch", {"model": "llama-3.1-70b", "engine": "vllm", "gpu": "h100-80gb", "parallel": {"tp": 4, "gpus": 4}}),
    ("context", {"model": "qwen2.5-7b", "engine": "hf", "gpu": "rtx-4090", "quant": "awq-int4"}),
    ("context", {"model": "deepseek-v3", "engine": "vllm", "gpu": "h200", "parallel": {"tp": 8, "gpus": 8}}),
    ("batch", {"model": "gemma-2-9b-it", "engine": "hf", "gpu": "l4", "context": 8192}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    repeat = parser.parse_args().repeat
    print(f"{'question':70s} {'answer':>7s} {'evals':>6s} {'first ms':>9s} {'warm ms':>8s}")
    for key, base in QUESTIONS:
        workload = {"mode": "infer", **base}
        start = time.perf_counter()
        answer = capacity.search_capacity(workload, key)
        first = (time.perf_counter() - start) * 1000
        warm = []
        for _ in range(repeat):
            start = time.perf_counter()
            capacity.search_capacity(workload, key)
            warm.append((time.perf_counter() - start) * 1000)
        label = f"max {key}: " + ", ".join(f"{k}={v}" for k, v in base.items())
        print(f"{label[:70]:70s} {answer.value:7d} {answer.evaluations:6d} {first:9.2f} {statistics.median(warm):8.2f}")


if __name__ == "__main__":
    main()
