"""Cold-start wall time of the light CLI commands (target: < 0.3 s each, no torch import;
``vramlens estimate llama-3.1-8b --mode train`` is issue 3's target command, the inference
estimate and a capacity search issue 4's).

Run: ``python benchmarks/cold_start.py [--repeat 10]``. Prints figures; it is not a pass/fail test.
Each run is a fresh interpreter (``python -m vramlens ...``), so import time is included.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (
    ["estimate", "llama-3.1-8b", "--mode", "train"],
    ["estimate", "llama-3-70b", "--method", "lora", "--gpus", "8", "--shard", "zero3", "--format", "json"],
    ["estimate", "llama-3.1-8b", "--mode", "infer", "--engine", "vllm", "--gpu", "h100-80gb"],
    ["estimate", "llama-3.1-70b", "--mode", "infer", "--tp", "2", "--gpus", "2", "--gpu", "a100-80gb", "--max-batch"],
    ["models", "list"],
    ["models", "list", "--format", "json"],
    ["models", "show", "llama-3.1-8b"],
    ["models", "show", "deepseek-v3", "--format", "json"],
)


def time_command(args: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "vramlens", *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    repeat = parser.parse_args().repeat
    baseline = time_command(["--version"], repeat)
    print(f"{'command':45s} {'median':>8s} {'min':>8s} {'max':>8s}")
    print(
        f"{'vramlens --version (interpreter + click)':45s} {statistics.median(baseline):8.3f} {min(baseline):8.3f} {max(baseline):8.3f}"
    )
    for args in COMMANDS:
        times = time_command(args, repeat)
        print(f"{'vramlens ' + ' '.join(args):45s} {statistics.median(times):8.3f} {min(times):8.3f} {max(times):8.3f}")
    for args in (
        ["models", "list"],
        ["estimate", "llama-3.1-8b", "--mode", "train"],
        ["estimate", "llama-3.1-8b", "--mode", "infer", "--gpu", "h100-80gb", "--max-context"],
    ):
        print(f"heavy modules imported by `vramlens {' '.join(args)}`: {_heavy_modules(args)}")


def _heavy_modules(args: list[str]) -> str:
    probe = (
        "import sys\n"
        "from vramlens.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'matplotlib')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return result.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    main()
