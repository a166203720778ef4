"""Cold-start time of the light CLI commands, whole process, side by side with llm-analysis.

Run: ``python benchmarks/cold_start.py [--repeat 10] [--llm-analysis-python PATH] [--all]``.
Prints figures and ratios; it is not a pass/fail test.

The yardstick (issue 23, item 5): ``vramlens estimate MODEL --mode train`` cold, the whole
process, at most 0.3x the time llm-analysis 0.2.2 takes to compute the same training estimate
from its own command line. llm-analysis pins ``transformers<5``, so it lives in its own venv,
installed with its declared dependencies::

    python -m venv llma-venv && llma-venv/bin/pip install llm-analysis==0.2.2

and ``--llm-analysis-python llma-venv/bin/python`` names that interpreter. The two sides
compute the same workload: a 7B/8B Llama, batch 1 per GPU, seq 2048, full recomputation,
ZeRO-3 over 8 A100-80GB (llm-analysis refuses the single-GPU full fine-tune: it asserts that the
model does not fit, before estimating anything). Runs alternate (vramlens, llm-analysis,
vramlens, ...) so that a load change on a shared machine hits both; one untimed warm-up run of
each comes first, with bytecode writing allowed, so both sides start from compiled ``.pyc``
files as an installed package does. Each run is a fresh interpreter; its wall time and its CPU
time (user + system, from ``getrusage`` of the child) are recorded; the medians and their ratios
are printed. CPU time is the steadier figure on a loaded machine.

Without ``--llm-analysis-python`` (or with ``--all``) the table of every light command is
printed too, with ``vramlens --version`` (interpreter + click) as its floor.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

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

#: vramlens's side of the comparison: the same training estimate llm-analysis computes below.
VRAMLENS_TRAIN = [
    "estimate", "llama-3.1-8b", "--mode", "train", "--batch", "1", "--seq", "2048", "--recompute", "full",
    "--gpus", "8", "--shard", "zero3", "--gpu", "a100-80gb",
]  # fmt: skip
#: the issue's example command (single GPU, defaults), timed beside it.
VRAMLENS_DEFAULT = ["estimate", "llama-3.1-8b", "--mode", "train"]
#: llm-analysis 0.2.2's command line for that estimate (activation_recomputation 2 is FULL, ds_zero 3 is ZeRO-3).
LLM_ANALYSIS_TRAIN = [
    "-m", "llm_analysis.analysis", "train", "--model_name", "decapoda-research_llama-7b-hf",
    "--gpu_name", "a100-sxm-80gb", "--batch_size_per_gpu", "1", "--seq_len", "2048",
    "--activation_recomputation", "2", "--total_num_gpus", "8", "--ds_zero", "3", "--log_level", "ERROR",
]  # fmt: skip


def _env() -> dict[str, str]:
    """This environment, with bytecode writing allowed (installed packages run from ``.pyc``)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def alternate(sides: dict[str, list[str]], repeat: int) -> dict[str, tuple[list[float], list[float]]]:
    """Each side's (walls, cpus) over ``repeat`` rounds; one untimed warm-up of each first."""
    for argv in sides.values():
        run_once(argv)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
    for _ in range(repeat):
        for name, argv in sides.items():
            wall, cpu = run_once(argv)
            times[name][0].append(wall)
            times[name][1].append(cpu)
    return times


def compare(llm_analysis_python: str, repeat: int) -> None:
    """Print vramlens's and llm-analysis's cold-start medians side by side, with the ratios."""
    sides = {
        "llm-analysis train (7B, ZeRO-3 x8, seq 2048, full recompute)": [llm_analysis_python, *LLM_ANALYSIS_TRAIN],
        "vramlens " + " ".join(VRAMLENS_TRAIN[:2]) + " (same workload)": [
            sys.executable,
            "-m",
            "vramlens",
            *VRAMLENS_TRAIN,
        ],
        "vramlens " + " ".join(VRAMLENS_DEFAULT): [sys.executable, "-m", "vramlens", *VRAMLENS_DEFAULT],
    }
    times = alternate(sides, repeat)
    names = list(sides)
    yard_wall, yard_cpu = (statistics.median(t) for t in times[names[0]])
    print(f"cold start, whole process, {repeat} alternating runs each (medians; target: vramlens <= 0.3x)")
    print(f"{'':64s} {'wall s':>7s} {'cpu s':>7s} {'wall x':>7s} {'cpu x':>7s}")
    for name in names:
        wall, cpu = (statistics.median(t) for t in times[name])
        print(f"{name:64s} {wall:7.3f} {cpu:7.3f} {wall / yard_wall:7.2f} {cpu / yard_cpu:7.2f}")


def table(repeat: int) -> None:
    """Median / min / max wall time of every light command."""
    print(f"{'command':45s} {'median':>8s} {'min':>8s} {'max':>8s}")
    for args in (["--version"], *COMMANDS):
        walls = [run_once([sys.executable, "-m", "vramlens", *args])[0] for _ in range(repeat)]
        label = "vramlens " + " ".join(args)
        print(f"{label:45s} {statistics.median(walls):8.3f} {min(walls):8.3f} {max(walls):8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--llm-analysis-python", default=None, help="interpreter of a venv with llm-analysis==0.2.2")
    parser.add_argument("--all", action="store_true", help="also time every light command")
    args = parser.parse_args()
    if args.llm_analysis_python:
        compare(args.llm_analysis_python, args.repeat)
    if args.all or not args.llm_analysis_python:
        table(args.repeat)


if __name__ == "__main__":
    main()
