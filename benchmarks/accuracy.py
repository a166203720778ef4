"""Score the estimators against the published measurements in shared/validation.

Run: ``python benchmarks/accuracy.py [--task train|infer] [--worst 10]``. For every usable
point it builds the workload (``benchmarks/scenarios.py``), estimates it, and compares
the report level that matches what the point measured (allocated / reserved / device).
Prints coverage, median and 90th-percentile absolute error, the share of points
under-estimated by more than 10%, a table per source, and the worst points.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import load_points, point_workload

from vramlens.errors import VramlensError
from vramlens.estimate import estimate
from vramlens.model.resolve import model_from_config
from vramlens.report.model import MemoryReport


@dataclass
class Scored:
    point: dict
    estimate: int | None
    measured: int
    level: str
    reason: str | None
    notes: list[str]

    @property
    def error(self) -> float | None:
        return None if self.estimate is None else (self.estimate - self.measured) / self.measured


def score(task: str = "train") -> list[Scored]:
    results = []
    for point in load_points(task=task):
        mapped = point_workload(point)
        measured = point["measured_bytes"]
        if mapped.workload is None:
            results.append(Scored(point, None, measured, mapped.level, mapped.skip_reason, mapped.notes))
            continue
        workload = dict(mapped.workload)
        workload["model"] = model_from_config(point["hf_config"], name=point["model_name"], source=point["id"])
        try:
            report = estimate(workload)
        except VramlensError as exc:
            results.append(Scored(point, None, measured, mapped.level, str(exc), mapped.notes))
            continue
        value = _level_value(report, mapped.level)
        results.append(Scored(point, value, measured, mapped.level, None, mapped.notes))
    return results


def _level_value(report: MemoryReport, level: str) -> int:
    if level == "non_kv":  # vLLM's logged weights + activation peak + non-torch memory (no pool, no graphs)
        profile = next(phase for phase in report.phases if phase.name == "profile")
        runtime = sum(value for name, value in report.runtime.items() if name != "cuda_graphs")
        return profile.allocated_bytes + runtime
    return {"allocated": report.allocated_bytes, "reserved": report.reserved_bytes, "device": report.device_bytes}[
        level
    ]


def summary(results: list[Scored]) -> dict[str, float]:
    scored = [r for r in results if r.error is not None]
    errors = sorted(abs(r.error) for r in scored)  # type: ignore[arg-type]
    p90 = errors[math.ceil(0.9 * len(errors)) - 1] if errors else float("nan")  # nearest-rank 90th percentile
    return {
        "points": len(results),
        "scored": len(scored),
        "coverage": len(scored) / len(results) if results else 0.0,
        "median_ape": statistics.median(errors) if errors else float("nan"),
        "p90_ape": p90,
        "under_10pct": sum(1 for r in scored if r.estimate < 0.9 * r.measured) / len(scored) if scored else 0.0,  # type: ignore[operator]
    }


def caveats(point: dict) -> list[str]:
    """Why a published figure may differ from an estimate of its stated configuration,
    read from the point's own metadata (never from its id)."""
    notes = []
    if point.get("seq_len_kind") == "max_of_variable":
        notes.append(f"seq {point['seq_len']} is the longest of variable-length batches (upper bound)")
    elif point.get("seq_len_kind") not in (None, "fixed"):
        notes.append(f"sequence length {point['seq_len_kind']}")
    if point.get("measured_read_from_chart"):
        notes.append("value read off a chart")
    if point.get("per_gpu_derivation"):
        notes.append(f"per-GPU figure derived: {point['per_gpu_derivation']}")
    if point.get("measured_kind") in ("unknown", "nvidia_smi"):
        notes.append("measured by nvidia-smi or an unstated tool (device level)")
    if point.get("arch_note"):
        notes.append("custom model expressed as an equivalent shape")
    if str(point.get("confidence", "")).startswith("LOW"):
        notes.append(f"confidence {point['confidence']}")
    return notes


def _print_sources(results: list[Scored]) -> None:
    by_source: dict[str, list[Scored]] = defaultdict(list)
    for result in results:
        by_source[result.point["source_repo"] or result.point["source"][:40]].append(result)
    print(f"\n{'source':45s} {'n':>3s} {'median':>8s} {'max':>8s} {'bias':>8s}")
    for source, group in sorted(by_source.items()):
        errs = [r.error for r in group if r.error is not None]
        if errs:
            print(
                f"{source[:45]:45s} {len(errs):3d} {statistics.median(abs(e) for e in errs):8.1%} {max(abs(e) for e in errs):8.1%} {statistics.median(errs):+8.1%}"
            )


def _print_worst(results: list[Scored], count: int) -> None:
    print("\nworst points (mapping notes, then what the published figure carries; docs/accuracy.md explains each):")
    ranked = sorted((r for r in results if r.error is not None), key=lambda r: -abs(r.error))  # type: ignore[arg-type]
    for r in ranked[:count]:
        print(
            f"  {r.point['id']} {r.error:+7.1%} est {r.estimate / 2**30:7.2f} GiB vs {r.measured / 2**30:7.2f} GiB {r.level:9s} {r.point['config_name'][:50]}"
        )
        for line in [*r.notes, *caveats(r.point)]:
            print(f"        - {line}")
    for r in results:
        if r.error is None:
            print(f"  {r.point['id']} not scored: {r.reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="train")
    parser.add_argument("--worst", type=int, default=12)
    args = parser.parse_args()
    results = score(args.task)
    stats = summary(results)
    print(
        f"{args.task}: {stats['scored']}/{stats['points']} usable points scored (coverage {stats['coverage']:.0%}); "
        f"median |error| {stats['median_ape']:.1%}, p90 {stats['p90_ape']:.1%}, under-estimated by >10%: {stats['under_10pct']:.1%}"
    )
    _print_sources(results)
    _print_worst(results, args.worst)


if __name__ == "__main__":
    main()
