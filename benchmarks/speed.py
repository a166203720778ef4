"""Estimates per second of the analytic training estimator on one core.

Run: ``python benchmarks/speed.py [--seconds 3]``. Prints figures; it is not a pass/fail test.
The issue's target is >= 10,000 estimates/s for a 70B ZeRO-3 LoRA workload (llm-analysis,
the fastest peer, does about 4,600 here). Three measurements:

* ``repeat``: the same workload again and again (what a UI re-rendering a report costs);
* ``sweep``: a planner-like sweep over batch and sequence length on one resolved model
  (per-spec memoized pieces are reused across workloads, the report is rebuilt each time);
* ``cold``: a new ModelSpec object each time, so nothing memoized is reused.

The model is resolved once (as a planner would); loading a workload from a dict and
resolving a catalog name are timed separately.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections.abc import Callable

from vramlens.estimator import estimate
from vramlens.model.resolve import load_model, model_from_config
from vramlens.workload.load import load_workload

WORKLOAD = {
    "model": "llama-3-70b",
    "method": "lora",
    "lora": {"rank": 16, "targets": "all-linear"},
    "precision": "bf16",
    "batch": 4,
    "seq": 4096,
    "recompute": "full",
    "parallel": {"gpus": 8, "shard": "zero3"},
    "gpu": "a100-80gb",
}


def rate(func: Callable[[int], object], seconds: float) -> float:
    """Calls per second of ``func(i)`` over about ``seconds`` seconds."""
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(200):
            func(calls)
            calls += 1
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    seconds = parser.parse_args().seconds
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    spec = load_model("llama-3-70b")
    workload = load_workload({**WORKLOAD, "model": spec})
    sweep = [
        load_workload({**WORKLOAD, "model": spec, "batch": b, "seq": s})
        for b, s in itertools.product((1, 2, 4, 8, 16, 32), (1024, 2048, 4096, 8192))
    ]

    def cold(i: int) -> object:
        fresh = model_from_config(_LLAMA_70B_CONFIG, name="llama-3-70b")
        return estimate(load_workload({**WORKLOAD, "model": fresh}))

    figures = {
        "repeat (same Workload, resolved model)": rate(lambda i: estimate(workload), seconds),
        "sweep (24 batch x seq workloads, one model)": rate(lambda i: estimate(sweep[i % len(sweep)]), seconds),
        "cold (new ModelSpec each time)": rate(cold, seconds),
        "load_workload(dict) alone": rate(lambda i: load_workload({**WORKLOAD, "model": spec}), seconds),
        "load_model('llama-3-70b') alone": rate(lambda i: load_model("llama-3-70b"), seconds),
    }
    report = estimate(workload)
    print(f"workload: 70B ZeRO-3 LoRA on 8 GPUs, peak {report.device_bytes / 2**30:.2f} GiB ({report.peak_phase})")
    for name, value in figures.items():
        print(f"{name:48s} {value:10,.0f} /s   {1e6 / value:8.1f} us each")


_LLAMA_70B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
}


if __name__ == "__main__":
    main()
