"""GPU truth battery: real CUDA runs measured at every level, beside vramlens's estimate and simulation.

Run on a machine with one NVIDIA GPU (H100/H200: about 8 minutes)::

    python benchmarks/gpu_truth.py --out validation/measured/<date>-<gpu>

and commit the folder (the ``sim-<n>.log`` files are the simulation workers' output: read, not
committed). Without vramlens installed there, ``PYTHONPATH=src``; bitsandbytes (QLoRA) can travel
as an unpacked wheel on ``PYTHONPATH`` (the 2026-11-27 battery: bitsandbytes 0.50.2 with only its
CUDA 13 library, 8 MiB). ``--dry-run`` (CPU, CI) lists the battery, estimates every run and checks
that the records it would write match the schema (:func:`check_record`).

The battery (:data:`BATTERY`): HF + PEFT training steps - full, LoRA, QLoRA when bitsandbytes is
installed; bf16 and mixed (fp32 weights under autocast); checkpointing on and off; three model
sizes built from the catalog's configs with random weights (nothing is downloaded) - HF
``generate`` (prefill and decode), and runs repeated with ``expandable_segments:True``. Each run
is a child process of its own (clean allocator statistics, its own CUDA context, a crash or hang
costs only that run) under ``--run-timeout`` seconds, with the run's ``alloc_conf`` as
``PYTORCH_CUDA_ALLOC_CONF``; the whole battery stops starting runs after ``--budget`` seconds.
Simulations of the same runs go on in parallel on the CPU (``CUDA_VISIBLE_DEVICES=""``) with the
same deadline. Whatever finished is written: one ``<id>.json`` per run (:data:`SCHEMA`), a
``<id>.snapshot.pickle`` (``torch.cuda.memory._snapshot()``, the last 4,000 events, no stacks),
and ``battery.json`` (environment, budget, what did not run and why, and ``bare_context``: a bare
process's device level at four points, :func:`gpu_truth_child.measure_context`).

Measured per run, over the training steps (or the generate call) after the model is loaded:
``torch.cuda.max_memory_allocated``/``max_memory_reserved``; after the run, nvidia-smi's
``used_memory`` of the process and ``total - free`` of ``cudaMemGetInfo`` (the caching allocator
keeps its segments, so both are at their peak then); allocated and reserved right after loading.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEMA = "vramlens.gpu_truth/1"
EXPANDABLE = "expandable_segments:True"
_SIZES = {"small": "qwen2.5-0.5b", "medium": "llama-3.2-1b", "large": "qwen2.5-3b"}


def _train(run: str, size: str, method: str, precision: str, batch: int, seq: int, **extra: Any) -> dict[str, Any]:
    workload = {"model": _SIZES[size], "framework": "hf", "method": method, "precision": precision,
                "batch": batch, "seq": seq, "optimizer_impl": "fused", **extra}  # fmt: skip
    return {"id": run, "kind": "train", "workload": workload}


def _infer(run: str, size: str, batch: int, prompt: int, generate: int, **extra: Any) -> dict[str, Any]:
    workload = {"model": _SIZES[size], "mode": "infer", "precision": "bf16", "batch": batch, "prompt": prompt,
                "generate": generate, **extra}  # fmt: skip
    return {"id": run, "kind": "infer", "workload": workload}


BATTERY: tuple[dict[str, Any], ...] = (
    _train("small-full-bf16", "small", "full", "bf16", 4, 1024),
    _train("small-full-mixed", "small", "full", "mixed-bf16", 4, 1024),
    _train("small-full-mixed-ckpt", "small", "full", "mixed-bf16", 4, 2048, recompute="full"),
    _train("small-full-bf16-expandable", "small", "full", "bf16", 4, 1024, alloc_conf=EXPANDABLE),
    _train("medium-full-bf16", "medium", "full", "bf16", 2, 2048),
    _train("medium-lora-bf16", "medium", "lora", "bf16", 4, 2048),
    _train("medium-lora-mixed", "medium", "lora", "mixed-bf16", 4, 2048),
    _train("medium-lora-bf16-ckpt", "medium", "lora", "bf16", 4, 4096, recompute="full"),
    _train("medium-lora-bf16-expandable", "medium", "lora", "bf16", 4, 2048, alloc_conf=EXPANDABLE),
    _train("medium-qlora", "medium", "qlora", "bf16", 4, 2048),
    _train("large-lora-bf16", "large", "lora", "bf16", 2, 2048),
    _train("large-full-bf16-ckpt", "large", "full", "bf16", 2, 2048, recompute="full"),
    _train("large-qlora", "large", "qlora", "bf16", 2, 2048),
    _train("large-lora-bf16-expandable", "large", "lora", "bf16", 2, 2048, alloc_conf=EXPANDABLE),
    _infer("medium-generate", "medium", 1, 1024, 128),
    _infer("small-generate-long", "small", 4, 4096, 128),
    _infer("small-generate-long-expandable", "small", 4, 4096, 128, alloc_conf=EXPANDABLE),
    _infer("large-generate-batch", "large", 8, 2048, 128),
)

_NUMBER = (int, type(None))
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "measured": {
        "max_allocated_bytes": _NUMBER, "max_reserved_bytes": _NUMBER, "nvidia_smi_bytes": _NUMBER,
        "device_used_bytes": _NUMBER, "load_allocated_bytes": _NUMBER, "load_reserved_bytes": _NUMBER,
    },
    "estimate": {"allocated_bytes": (int,), "reserved_bytes": (int,), "device_bytes": (int,),
                 "safe_reserved_bytes": (int,), "safe_device_bytes": (int,)},
    "simulation": {"allocated_bytes": (int,), "reserved_bytes": (int,)},
}  # fmt: skip
_STATUSES = ("ok", "dry-run", "skipped", "failed", "timeout")


def check_record(record: dict[str, Any]) -> list[str]:
    """Problems of one run record against :data:`SCHEMA` (empty when it conforms)."""
    problems = [f"{key}: missing" for key in ("schema", "id", "kind", "workload", "status") if key not in record]
    if problems:
        return problems
    if record["schema"] != SCHEMA:
        problems.append(f"schema: {record['schema']!r}, expected {SCHEMA!r}")
    if record["status"] not in _STATUSES:
        problems.append(f"status: {record['status']!r} is not one of {_STATUSES}")
    if record["kind"] not in ("train", "infer"):
        problems.append(f"kind: {record['kind']!r}")
    for block, fields in _FIELDS.items():
        value = record.get(block)
        if value is None:
            if block == "measured" and record["status"] == "ok":
                problems.append("measured: required when status is ok")
            continue
        for name, kinds in fields.items():
            if not isinstance(value.get(name), kinds) or isinstance(value.get(name), bool):
                problems.append(f"{block}.{name}: {value.get(name)!r}")
    return problems


def estimate_block(workload: dict[str, Any]) -> dict[str, int]:
    """vramlens's estimate of a run (every level and the safe figures)."""
    from vramlens.estimator import estimate

    report = estimate(workload)
    assert report.safe is not None
    return {
        "allocated_bytes": report.allocated_bytes,
        "reserved_bytes": report.reserved_bytes,
        "device_bytes": report.device_bytes,
        "safe_reserved_bytes": report.safe.reserved_bytes,
        "safe_device_bytes": report.safe.device_bytes,
    }


def _record(entry: dict[str, Any], status: str, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "id": entry["id"], "kind": entry["kind"], "workload": entry["workload"],
            "status": status, "reason": None, "measured": None, "estimate": None, "simulation": None,
            "snapshot": None, **fields}  # fmt: skip


def dry_run(out: Path | None) -> list[dict[str, Any]]:
    """Every battery entry estimated and written as a ``dry-run`` record; raises on a schema problem."""
    records = []
    for entry in BATTERY:
        record = _record(entry, "dry-run", estimate=estimate_block(entry["workload"]))
        problems = check_record(record)
        if problems:
            raise SystemExit(f"{entry['id']}: {'; '.join(problems)}")
        records.append(record)
        if out is not None:
            _write(out / f"{entry['id']}.json", record)
    return records


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _child(args: list[str], env: dict[str, str], timeout: float) -> tuple[str, str | None]:
    """Run this script as a child; (status, reason)."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, *args], env=env, timeout=timeout, capture_output=True, text=True, check=False
        )
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout:.0f} s"
    if done.returncode != 0:
        return "failed", (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:300]
    return "ok", None


def battery(out: Path, budget: float, run_timeout: float, sim_workers: int) -> None:
    """Run every entry (GPU children one at a time, simulations alongside), then merge and write."""
    from gpu_truth_child import environment

    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    sims = _start_simulations(out, sim_workers)
    summary: dict[str, Any] = {"schema": SCHEMA, "budget_s": budget, "environment": environment(), "runs": {}}
    summary["bare_context"] = {"status": _child(["--context", "--out", str(out)], dict(os.environ), 60)[0]}
    if (out / "context.json").exists():  # the CUDA context's parts (estimator/runtime.py's table)
        summary["bare_context"].update(json.loads((out / "context.json").read_text()))
        (out / "context.json").unlink()
    for entry in BATTERY:
        left = budget - (time.monotonic() - start)
        if left < 15:
            summary["runs"][entry["id"]] = {"status": "skipped", "reason": "battery time budget spent"}
            continue
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": entry["workload"].get("alloc_conf", "")}
        status, reason = _child(["--child", json.dumps(entry), "--out", str(out)], env, min(run_timeout, left))
        summary["runs"][entry["id"]] = {"status": status, "reason": reason}
    _finish_simulations(sims, start + budget + 30)
    for entry in BATTERY:
        _merge(out, entry, summary["runs"][entry["id"]])
    _write(out / "battery.json", summary)


def _start_simulations(out: Path, workers: int) -> list[tuple[subprocess.Popen[bytes], list[dict[str, Any]]]]:
    """Start ``workers`` CPU processes, each simulating its share of the battery."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    shares = [list(BATTERY[i::workers]) for i in range(workers)]
    started = []
    for index, share in enumerate(shares):
        if share:  # each worker's output in sim-<n>.log (the 2026-11-27 battery's workers finished none, unseen)
            with (out / f"sim-{index}.log").open("wb") as log:
                command = [sys.executable, __file__, "--simulate", json.dumps(share), "--out", str(out)]
                process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            started.append((process, share))
    return started


def _finish_simulations(sims: list[tuple[subprocess.Popen[bytes], list[dict[str, Any]]]], deadline: float) -> None:
    for process, _ in sims:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


def _merge(out: Path, entry: dict[str, Any], outcome: dict[str, Any]) -> None:
    """The run's record: its measurement (if the child wrote one), estimate and simulation."""
    measured_path, sim_path = out / f"{entry['id']}.measured.json", out / f"{entry['id']}.simulation.json"
    measured = json.loads(measured_path.read_text()) if measured_path.exists() else None
    simulation = json.loads(sim_path.read_text()) if sim_path.exists() else None
    status = outcome["status"] if measured is not None or outcome["status"] != "ok" else "failed"
    snapshot = f"{entry['id']}.snapshot.pickle" if (out / f"{entry['id']}.snapshot.pickle").exists() else None
    record = _record(entry, status, reason=outcome["reason"], measured=measured, simulation=simulation,
                     snapshot=snapshot, estimate=estimate_block(entry["workload"]))  # fmt: skip
    _write(out / f"{entry['id']}.json", record)
    for path in (measured_path, sim_path):
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="list and estimate the battery, check the schema")
    parser.add_argument("--out", type=Path, default=None, help="results folder (validation/measured/<date>-<gpu>)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole battery")
    parser.add_argument("--run-timeout", type=float, default=75.0, help="seconds for one run")
    parser.add_argument("--sim-workers", type=int, default=6)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--simulate", help=argparse.SUPPRESS)
    parser.add_argument("--context", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.child or args.simulate or args.context:
        from gpu_truth_child import measure_context, measure_run, simulate_runs

        if args.context:
            measure_context(args.out)
        elif args.child:
            measure_run(json.loads(args.child), args.out)
        else:
            simulate_runs(json.loads(args.simulate), args.out)
        return
    if args.dry_run:
        for record in dry_run(args.out):
            est = record["estimate"]
            print(f"{record['id']:34s} {record['kind']:5s} estimate reserved {est['reserved_bytes'] / 2**30:7.2f} GiB, "
                  f"safe device {est['safe_device_bytes'] / 2**30:7.2f} GiB")  # fmt: skip
        print(f"{len(BATTERY)} runs; records match {SCHEMA}")
        return
    if args.out is None:
        parser.error("--out is required for a measured battery (e.g. validation/measured/2026-01-01-h100)")
    battery(args.out, args.budget, args.run_timeout, args.sim_workers)


if __name__ == "__main__":
    main()
