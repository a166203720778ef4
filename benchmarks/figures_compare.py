"""Every figure of a few thousand training estimates, here and in another source tree: they must be equal.

Run: ``python benchmarks/figures_compare.py --other-src ../main/src [--sizes 6]``. It estimates
the same workloads in this process (this tree's ``vramlens``) and in a child process whose
``PYTHONPATH`` is ``--other-src`` (another checkout's ``src``), and compares, estimate by estimate:

* the figures as the estimate returns them, read before its terms: each phase's name, note,
  allocated bytes and breakdown, the peak phase, the allocated, reserved and device peaks, the
  allocator slack, the runtime parts, the safe levels with their margins, ``fits`` and the headroom;
* then the whole report contract (``to_dict()``: terms, formulas, assumptions and settings too);
* or the one-line error, where the workload is refused.

The workloads: catalog models (dense, MoE, a multimodal wrapper, hybrids) x full / LoRA / QLoRA x one
GPU, or 8 with DDP, ZeRO-2, ZeRO-3 or FSDP x recompute none / full, a few other keys drawn with a
fixed seed (loss, attention, optimizer, framework); each estimated at ``--sizes`` batch x seq x
grad_accum points in turn on one resolved model, so its memo holds the earlier ones and the fast
estimate (``estimator/fast_estimate.py``) makes the later ones. Prints the counts; exits 1 on a difference.
Meant for a change that must not move a figure (speed work): compare with the tree before it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = (
    "llama-3.1-8b", "llama-3-70b", "qwen2.5-0.5b", "mixtral-8x7b", "gpt-oss-20b", "gemma-2-2b", "qwen3-30b-a3b",
    "deepseek-v3", "phi-3-mini", "gemma-3-270m", "falcon-7b", "qwen3-8b",
)  # fmt: skip
#: Families described by a config in tests/model/family_configs.py (multimodal and hybrid).
CONFIGS = (("FAMILY_CONFIGS", "qwen2_5_vl"), ("HYBRID_CONFIGS", "jamba"), ("HYBRID_CONFIGS", "falcon_h1"))
PARALLEL = (
    {"gpus": 1},
    {"gpus": 8, "shard": "ddp"},
    {"gpus": 8, "shard": "zero2"},
    {"gpus": 8, "shard": "zero3"},
    {"gpus": 8, "shard": "fsdp"},
)
EXTRAS = {
    "loss": ["auto", "full", "chunked", "fused-linear"],
    "attention": ["auto", "sdpa", "flash", "eager"],
    "optimizer": ["adamw", "adamw-8bit", "sgd"],
    "framework": ["auto", "hf", "deepspeed", "torchtitan"],
}


def cases(sizes: int) -> list[tuple[str, dict[str, Any], list[tuple[int, int, int]]]]:
    """(model, size-free workload keys, [(batch, seq, grad_accum), ...]) in a fixed order."""
    draw = random.Random(23)
    found = []
    models = [*MODELS, *(f"{table}:{name}" for table, name in CONFIGS)]
    for model, method, parallel, recompute in itertools.product(
        models, ("full", "lora", "qlora"), PARALLEL, ("none", "full")
    ):
        data: dict[str, Any] = {"method": method, "parallel": parallel, "recompute": recompute, "gpu": "h100-80gb"}
        for key, values in EXTRAS.items():
            if draw.random() < 0.3:
                data[key] = draw.choice(values)
        points = [(draw.randint(1, 8), draw.choice([256, 512, 1000, 1024, 2048]) + draw.randint(0, 3) * 64, 1)]
        for _ in range(sizes - 1):
            points.append((draw.randint(1, 8), draw.randint(2, 64) * 32, draw.choice([1, 1, 1, 1, 2, 4])))
        found.append((model, data, points))
    return found


def _spec(model: str) -> Any:
    from vramlens.model.families import parse_config
    from vramlens.model.resolve import load_model

    if ":" not in model:
        spec = load_model(model)
        spec.derived_cache.clear()
        return spec
    sys.path.insert(0, str(ROOT / "tests" / "model"))
    import family_configs

    table, name = model.split(":")
    return parse_config({**getattr(family_configs, table)[name], "max_position_embeddings": 8192})


def _figures(report: Any) -> list[Any]:
    """What an estimate says before its terms are read (see the module docstring)."""
    phases = [
        (p.name, p.note, p.allocated_bytes, [(c.value, b) for c, b in p.breakdown.items()]) for p in report.phases
    ]
    levels = [report.peak_phase, report.allocated_bytes, report.reserved_bytes, report.device_bytes]
    levels += [report.allocator_slack_bytes, sorted(report.runtime.items()), repr(report.safe)]
    return [phases, levels, report.fits, report.headroom_bytes]


def dump(sizes: int) -> list[Any]:
    """Every estimate's figures and report (or its error), in :func:`cases` order."""
    from vramlens.errors import InputError
    from vramlens.estimator import estimate_resolved
    from vramlens.hardware import resolve_gpu
    from vramlens.workload.load import load_workload

    found: list[Any] = []
    for model, data, points in cases(sizes):
        spec = _spec(model)
        for batch, seq, accumulation in points:
            try:
                workload = load_workload(
                    {**data, "model": spec, "batch": batch, "seq": seq, "grad_accum": accumulation}
                )
                report = estimate_resolved(spec, workload, resolve_gpu(workload.gpu))
                fast = hasattr(type(report), "presented")  # made by the fast estimate (terms when read)
                found.append([_figures(report), json.dumps(report.to_dict(), sort_keys=True, default=str), fast])
            except InputError as error:
                found.append(["error", str(error)])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other-src", help="the other tree's src directory")
    parser.add_argument("--sizes", type=int, default=8)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump:
        import vramlens

        Path(args.dump).write_text(json.dumps({"source": vramlens.__file__, "found": dump(args.sizes)}))
        return
    if not args.other_src:
        parser.error("--other-src is required")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "other.json"
        env = {**os.environ, "PYTHONPATH": str(Path(args.other_src).resolve())}
        subprocess.run([sys.executable, __file__, "--sizes", str(args.sizes), "--dump", str(out)], env=env, check=True)
        other = json.loads(out.read_text())
    import vramlens

    print(f"this tree: {vramlens.__file__}; the other: {other['source']}")
    theirs, ours = other["found"], json.loads(json.dumps(dump(args.sizes)))
    labels = [(model, data, point) for model, data, points in cases(args.sizes) for point in points]
    differ = [index for index, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a[:2] != b[:2]]
    refused = sum(1 for entry in ours if entry[0] == "error")
    fast = sum(1 for entry in ours if entry[0] != "error" and entry[2])
    print(
        f"{len(ours)} estimates ({len(ours) - refused} reports, {fast} of them fast here; {refused} refused): "
        f"{len(differ)} differ"
    )
    for index in differ[:5]:
        print("differs:", labels[index])
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
