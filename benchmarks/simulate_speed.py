"""Speed of simulated training steps against a bare fake-tensor step of the same model.

Run: ``python benchmarks/simulate_speed.py [--ratio-only] [--big] [--case NAME]``. Prints
figures; it is not a pass/fail test.

Ratio (issue 23 item 5): in one process, one simulated training step of llama-3.1-8b
(batch 1, seq 2048, bf16, HF profile) - the whole ``simulate(workload, steps=1)`` call: model
build, tracked step, replayed layers, report - against the yardstick, a bare step of the same
model: the model built by the simulator's builder on fake tensors, then one untracked forward,
backward and optimizer step (fused AdamW, the profile's), no tracker. Build time is not in the
yardstick. One untimed run of each warms the imports and fake-tensor caches; then they
alternate, three times, and the fastest of each is compared (the figure least disturbed by
other work on a shared machine). Target: at most 0.25x. ``replay=False`` (every layer runs)
is printed beside it. ``--big`` adds llama-3.1-405b: its simulated step's seconds and its
ratio to its own bare step.

Cases (issue 5): each runs in a fresh subprocess so its peak RSS is its own (imports
included): 8B at batch 1, seq 2048 in <= 15 s and <= 2 GiB RSS; 70B LoRA in <= 60 s; QLoRA
(NF4 base, simulate/quant.py) and FSDP2 on 8 fake ranks (simulate/distributed.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b full bf16 b1 s2048": {
        "model": "llama-3.1-8b",
        "precision": "bf16",
        "batch": 1,
        "seq": 2048,
        "framework": "hf",
    },
    "llama-3.1-70b lora bf16 b1 s2048": {
        "model": "llama-3.1-70b",
        "precision": "bf16",
        "method": "lora",
        "batch": 1,
        "seq": 2048,
        "framework": "hf",
    },
    "llama-3.1-70b qlora mixed b1 s2048 ckpt": {
        "model": "llama-3.1-70b",
        "precision": "mixed-bf16",
        "method": "qlora",
        "recompute": "full",
        "batch": 1,
        "seq": 2048,
        "framework": "hf",
    },
    "llama-3.1-8b fsdp 8 ranks bf16 b1 s2048": {
        "model": "llama-3.1-8b",
        "precision": "bf16",
        "batch": 1,
        "seq": 2048,
        "framework": "hf",
        "parallel": {"gpus": 8, "shard": "fsdp"},
    },
}

_CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from vramlens.simulator import simulate
imported = time.perf_counter()
report = simulate(json.loads(sys.argv[1]), steps=int(sys.argv[2]))
done = time.perf_counter()
print(json.dumps({
    "import_s": imported - start, "simulate_s": done - imported, "total_s": done - start,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "events": len(report.timeline), "allocated_gib": report.allocated_bytes / 2**30,
}))
"""


def run_case(workload: dict[str, Any], steps: int) -> dict[str, float]:
    """Simulate ``workload`` in a child process and return its timings and peak RSS."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(workload), str(steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


RATIO_WORKLOAD: dict[str, Any] = {"precision": "bf16", "batch": 1, "seq": 2048, "framework": "hf"}


def bare_step(model_name: str) -> Callable[[], None]:
    """The yardstick: the simulator's model of ``model_name`` on fake tensors (built once, here)
    and a function running one untracked forward, backward and optimizer step of it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens.model.resolve import load_model
    from vramlens.resolve.context import resolve_training
    from vramlens.simulator.build import build_model, real_code_paths, torch_dtype
    from vramlens.simulator.train import OPTIMIZERS
    from vramlens.workload.load import load_workload

    workload = load_workload({**RATIO_WORKLOAD, "model": model_name}, {})
    ctx = resolve_training(load_model(workload.model), workload)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    dtype = torch_dtype(workload.precision, ctx.frozen_bytes)
    with real_code_paths():
        model = build_model(ctx.spec, workload, dtype=dtype, attention=ctx.attention, fake_mode=fake)
    model.train()
    optimizer = OPTIMIZERS[workload.optimizer](
        torch, [p for p in model.parameters() if p.requires_grad], ctx.optimizer_impl
    )
    with fake:
        ids = torch.randint(0, ctx.spec.vocab_size, (workload.batch, workload.seq))

    def step() -> None:
        amp = torch.autocast("cpu", dtype=torch_dtype(workload.precision, 2)) if ctx.autocast else None
        with real_code_paths(), fake:
            with amp if amp is not None else contextlib.nullcontext():
                out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            del out
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def _fastest(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Each run once untimed, then all of them in turn ``repeats`` times: the fastest of each."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def ratios(model_name: str, *, full: bool, repeats: int = 3) -> None:
    """Print the simulated step's time against the bare step's, in this process."""
    from vramlens.simulator import simulate

    workload = {**RATIO_WORKLOAD, "model": model_name}
    runs: dict[str, Callable[[], Any]] = {
        "bare fake step (yardstick)": bare_step(model_name),
        "simulate(steps=1)": lambda: simulate(workload, steps=1),
        "simulate(steps=2) (default)": lambda: simulate(workload),
    }
    if full:
        runs["simulate(steps=1, replay=False)"] = lambda: simulate(workload, steps=1, replay=False)
    best = _fastest(runs, repeats)
    yardstick = best["bare fake step (yardstick)"]
    print(f"{model_name} b1 s2048 bf16 (fastest of {repeats}, same process)")
    for name, seconds in best.items():
        print(f"  {name:34} {seconds:7.2f} s  {seconds / yardstick:5.2f}x the bare step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=list(CASES), help="Run one case only.")
    parser.add_argument("--ratio-only", action="store_true", help="Print the ratios only, not the cases.")
    parser.add_argument("--big", action="store_true", help="Add llama-3.1-405b to the ratios.")
    args = parser.parse_args()
    if not args.case:
        ratios("llama-3.1-8b", full=True)
        if args.big:
            ratios("llama-3.1-405b", full=False, repeats=1)
    if args.ratio_only:
        return
    names = [args.case] if args.case else list(CASES)
    print(f"{'case':42} {'steps':>5} {'import s':>9} {'simulate s':>11} {'total s':>8} {'RSS MiB':>8} {'events':>8}")
    for name in names:
        for steps in (1, 2):
            r = run_case(CASES[name], steps)
            print(
                f"{name:42} {steps:>5} {r['import_s']:>9.1f} {r['simulate_s']:>11.1f} {r['total_s']:>8.1f} "
                f"{r['rss_mib']:>8.0f} {int(r['events']):>8}"
            )


if __name__ == "__main__":
    main()
