"""Estimates per second of the analytic training estimator on one core, beside llm-analysis.

Run: ``python benchmarks/speed.py [--seconds 3] [--llm-analysis-python PATH] [--rounds 3]``.
Prints figures and ratios; it is not a pass/fail test.

The yardstick (issue 23, item 5): on a 70B ZeRO-3 LoRA workload, at least 4x the rate of
llm-analysis 0.2.2's ``LLMAnalysis(...).training(...)`` on the same machine in the same run.
llm-analysis pins ``transformers<5``, so it runs in its own venv
(``python -m venv llma-venv && llma-venv/bin/pip install llm-analysis==0.2.2``),
named by ``--llm-analysis-python``; a subprocess there calls it in a loop and prints its rate.
Both sides run the same sweep of distinct workloads, one per call, none repeated in the whole
run (a planner's capacity search asks about a new batch or length each time): batch 1..8 x
gradient accumulation 1..4 x seq 512..4096 in steps of 1 (:func:`sweep_points`; llm-analysis
allows seq up to 4096 and batch 9 there for this model), full recomputation, ZeRO-3, bf16, one
core. So what is measured is computing estimates, not looking one up: nothing that depends on
batch or seq can be reused from an earlier call, only what depends on the model, the method and
the parallelism (memoized on the resolved model, as in a planner). vramlens
computes ``llama-3-70b`` with LoRA (rank 16, all linear layers) on 8 A100-80GB; llm-analysis
has no LoRA and refuses a full fine-tune of 70B on 8 GPUs (its states do not fit), so it
computes the same model shape (``upstage_Llama-2-70b-instruct-v2``) as a full fine-tune over
32 ranks: the same formulas run whatever the rank count. Cached on vramlens's side: the
resolved model (as a planner holds it) and the per-model pieces the estimator memoises; each
call computes the report for its workload (``estimate`` keeps no cache of whole reports, and no
workload comes twice): every figure (the phases' bytes and breakdowns, the allocator slack, the
reserved, device and safe levels, whether it fits), with the terms, formulas and notes made when
first read, which a sweep does not (``estimator/fast_estimate.py``; llm-analysis returns no
formulas either). An allocator slack is replayed once per distinct token count, about one call
in four here. The workloads are built before each timed round (``dataclasses.replace``
of one loaded workload, as the capacity search does). llm-analysis builds a new ``LLMAnalysis``
per call from configs loaded once. Rounds alternate (llm-analysis, vramlens, ...); medians and
the ratio are printed. A vramlens round stops early when its ``ROUND_WORKLOADS`` distinct workloads
are used up (about 1.5 s at 24,000 estimates per second): its rate is over the calls it made.

Three more measurements of vramlens alone:

* ``repeat``: the same workload again and again (what a UI re-rendering a report costs);
* ``sweep``: a planner-like sweep over batch and sequence length on one resolved model
  (per-spec memoized pieces are reused across workloads, the report is rebuilt each time);
* ``cold``: a new ModelSpec object each time, so nothing memoized is reused.

The model is resolved once (as a planner would); loading a workload from a dict and
resolving a catalog name are timed separately.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import subprocess
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


def rate(func: Callable[[int], object], seconds: float, limit: int | None = None) -> float:
    """Calls per second of ``func(i)`` over about ``seconds`` seconds (stopping before ``i`` reaches
    ``limit``, when given: the distinct workloads a round has)."""
    calls, start = 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline and (limit is None or calls + 200 <= limit):
        for _ in range(200):
            func(calls)
            calls += 1
    return calls / (time.perf_counter() - start)


#: The sweep of the plain (non-comparing) mode: one workload per call in turn.
GRID = tuple(itertools.product((1, 2, 4, 8), (1024, 2048, 4096)))


#: Distinct points of the sweep: batch 1..8 x grad_accum 1..4 x seq 512..4096.
SWEEP_POINTS = 8 * 4 * 3585


def sweep_points(start: int, count: int) -> list[tuple[int, int, int]]:
    """``count`` (batch, grad_accum, seq) points from the ``start``-th of batch 1..8 x grad_accum
    1..4 x seq 512..4096 (batch fastest, then grad_accum): distinct while ``start + count`` <=
    :data:`SWEEP_POINTS`."""
    return [(1 + index % 8, 1 + index // 8 % 4, 512 + index // 32) for index in range(start, start + count)]


#: llm-analysis's loop (run by the bench-venv interpreter; argv: seconds, first pair index).
_LLM_ANALYSIS_LOOP = """
import itertools, logging, sys, time
from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
from llm_analysis.config import ParallelismConfig, get_dtype_config_by_name, get_gpu_config_by_name
from llm_analysis.config import get_model_config_by_name
from llm_analysis.logger import logger
logger.setLevel(logging.CRITICAL)
model = get_model_config_by_name("upstage_Llama-2-70b-instruct-v2")
gpu, dtype = get_gpu_config_by_name("a100-sxm-80gb"), get_dtype_config_by_name("w16a16e16")
parallel = ParallelismConfig(dp_size=32)
first = int(sys.argv[2])
def one(i):
    index = first + i
    batch, accumulation, seq = 1 + index % 8, 1 + index // 8 % 4, 512 + index // 32
    return LLMAnalysis(model, gpu, dtype, parallel).training(
        batch_size_per_gpu=batch, seq_len=seq, gradient_accumulation_steps=accumulation,
        activation_recomputation=ActivationRecomputation.FULL, ds_zero=DSZeRO.STAGE_3,
    )
for i in range(12):
    one(i)
calls, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[1]):
    for _ in range(50):
        one(calls)
        calls += 1
print(calls / (time.perf_counter() - start))
"""


def llm_analysis_rate(python: str, seconds: float, first: int) -> float:
    """llm-analysis's training estimates per second over the sweep from pair ``first`` (a subprocess in its venv)."""
    done = subprocess.run(
        [python, "-c", _LLM_ANALYSIS_LOOP, str(seconds), str(first)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


#: Workloads built for each timed round of vramlens (more than a round computes).
ROUND_WORKLOADS = 36_000


def compare(python: str, seconds: float, rounds: int) -> None:
    """Alternate rounds of llm-analysis and vramlens on the sweep; print the medians and the ratio."""
    spec = load_model("llama-3-70b")
    base = load_workload({**WORKLOAD, "model": spec, "gpu": "a100-80gb"})
    for batch, seq in GRID:
        estimate(dataclasses.replace(base, batch=batch, seq=seq))  # the per-model memo is warm, as in a planner
    if rounds * ROUND_WORKLOADS > SWEEP_POINTS:
        raise SystemExit(f"--rounds {rounds}: at most {SWEEP_POINTS // ROUND_WORKLOADS} rounds of distinct workloads")
    theirs, ours = [], []
    for round_index in range(rounds):
        first = round_index * ROUND_WORKLOADS
        theirs.append(llm_analysis_rate(python, seconds, first))
        points = sweep_points(first, ROUND_WORKLOADS)
        workloads = [dataclasses.replace(base, batch=b, grad_accum=g, seq=s) for b, g, s in points]
        ours.append(rate(lambda i, round_workloads=workloads: estimate(round_workloads[i]), seconds, ROUND_WORKLOADS))
    them, us = statistics.median(theirs), statistics.median(ours)
    print(
        f"70B ZeRO-3 sweep (batch 1..8 x grad_accum 1..4 x seq 512..4096, a new workload every call), "
        f"{rounds} alternating rounds, medians"
    )
    print(f"{'llm-analysis 0.2.2 training()':48s} {them:10,.0f} /s   {1e6 / them:8.1f} us each")
    print(f"{'vramlens estimate() (LoRA)':48s} {us:10,.0f} /s   {1e6 / us:8.1f} us each")
    print(f"ratio vramlens / llm-analysis: {us / them:.2f}x (target >= 4x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--llm-analysis-python", default=None, help="interpreter of a venv with llm-analysis==0.2.2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seconds = args.seconds
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core (the subprocess inherits it)
    if args.llm_analysis_python:
        compare(args.llm_analysis_python, seconds, args.rounds)
        return
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
