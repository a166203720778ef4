"""Wall time and memory of simulated training steps (issue 5's speed targets).

Run: ``python benchmarks/simulate_speed.py [--case NAME]``. Each case runs in a fresh
subprocess so its peak RSS is its own (imports included). Prints figures; it is not a
pass/fail test. Targets on the project's 2-core machine: one simulated training step of
an 8B model at batch 1, seq 2048 in <= 15 s and <= 2 GiB RSS; 70B LoRA in <= 60 s. QLoRA
(NF4 base, simulate/quant.py) and FSDP2 on 8 fake ranks (simulate/distributed.py) are
measured too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=list(CASES), help="Run one case only.")
    args = parser.parse_args()
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
