"""Score the estimators against the published measurements in shared/validation.

Run: ``python benchmarks/accuracy.py [--task train|infer|all] [--worst 10] [--calibrate]``. For
every usable point it builds the workload (``benchmarks/scenarios.py``), estimates it, and
compares the report level that matches what the point measured (allocated / reserved / device).
Prints, per level, coverage, median and 90th-percentile absolute error and the share of points
under-estimated by more than 10%; then the safe figures (``vramlens.estimator.margins``): the
share of points at or below them and the median margin (safe / point - 1); a table per source
and the worst points. ``--calibrate`` searches the two calibrated margin fractions
(``RULES_FRACTION``, ``NOISE_FRACTION``) for the smallest median margin with every level's safe
figure covering at least 95% of its points, and prints them.
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
from vramlens.estimator import estimate
from vramlens.model.resolve import model_from_config
from vramlens.result.report import MemoryReport


@dataclass
class Scored:
    point: dict
    estimate: int | None
    measured: int
    level: str
    reason: str | None
    notes: list[str]
    safe: int | None = None

    @property
    def error(self) -> float | None:
        return None if self.estimate is None else (self.estimate - self.measured) / self.measured

    @property
    def covered(self) -> bool | None:
        """The measurement is at or below the safe figure."""
        return None if self.safe is None else self.measured <= self.safe

    @property
    def margin(self) -> float | None:
        """Safe figure over the point estimate, minus one."""
        return None if self.safe is None or not self.estimate else self.safe / self.estimate - 1


def score(task: str = "train", *, unit_margins: bool = False) -> list[Scored]:
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
        safe = _safe_value(report, mapped.level, value)
        if unit_margins and report.safe is not None:  # the two calibrated margins, at fraction 1
            found = {m.kind: m.bytes for m in report.safe.margins}
            sharded = getattr(
                report.workload, "parallel", None
            ) is not None and report.workload.parallel.shard.value in ("fsdp", "hsdp", "zero3")
            point = {
                **point,
                "_unit_margins": (found["framework rules"], found["data noise"], found["modelled allocator"], sharded),
            }
        results.append(Scored(point, value, measured, mapped.level, None, mapped.notes, safe))
    return results


def _level_value(report: MemoryReport, level: str) -> int:
    if level == "non_kv":  # vLLM's logged weights + activation peak + non-torch memory (no pool, no graphs)
        profile = next(phase for phase in report.phases if phase.name == "profile")
        runtime = sum(value for name, value in report.runtime.items() if name != "cuda_graphs")
        return profile.allocated_bytes + runtime
    return {"allocated": report.allocated_bytes, "reserved": report.reserved_bytes, "device": report.device_bytes}[
        level
    ]


def _safe_value(report: MemoryReport, level: str, point: int) -> int | None:
    safe = report.safe
    if safe is None:
        return None
    if level == "non_kv":  # the device level's margins on vLLM's logged figure
        return point + safe.device_bytes - report.device_bytes
    return {"allocated": safe.allocated_bytes, "reserved": safe.reserved_bytes, "device": safe.device_bytes}[level]


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


def safe_summary(results: list[Scored]) -> dict[str, float]:
    """Share of scored points at or below the safe figure, and the median margin."""
    scored = [r for r in results if r.covered is not None]
    margins = [r.margin for r in scored if r.margin is not None]
    return {
        "safe_coverage": sum(1 for r in scored if r.covered) / len(scored) if scored else float("nan"),
        "median_margin": statistics.median(margins) if margins else float("nan"),
    }


def by_level(results: list[Scored]) -> dict[str, list[Scored]]:
    """Results grouped by the level they are compared at (vLLM's non-KV figure with device)."""
    groups: dict[str, list[Scored]] = defaultdict(list)
    for result in results:
        groups["device" if result.level == "non_kv" else result.level].append(result)
    return dict(groups)


def _print_levels(results: list[Scored]) -> None:
    print(
        f"\n{'level':10s} {'n':>3s} {'cover':>6s} {'median':>7s} {'p90':>7s} {'under10':>8s} {'safe>=':>7s} {'margin':>7s}"
    )
    for level in ("allocated", "reserved", "device"):
        group = by_level(results).get(level, [])
        if not group:
            continue
        stats, safe = summary(group), safe_summary(group)
        print(
            f"{level:10s} {stats['scored']:3d} {stats['coverage']:6.0%} {stats['median_ape']:7.1%} {stats['p90_ape']:7.1%} "
            f"{stats['under_10pct']:8.1%} {safe['safe_coverage']:7.1%} {safe['median_margin']:7.1%}"
        )
    total = safe_summary(results)
    print(
        f"{'all':10s} {len(results):3d} {'':6s} {'':7s} {'':7s} {'':8s} {total['safe_coverage']:7.1%} {total['median_margin']:7.1%}"
    )


def _with_fractions(results: list[Scored], rules: float, noise: float, allocator: dict[bool, float]) -> list[Scored]:
    """``results`` (scored with every calibrated factor at 1) with the safe figures those factors
    give: each margin scales linearly; the device level's own margin does not change."""
    scaled = []
    for r in results:
        if r.safe is None or r.point.get("_unit_margins") is None:
            scaled.append(r)
            continue
        unit_rules, unit_noise, unit_allocator, sharded = r.point["_unit_margins"]
        safe = r.safe - unit_rules - unit_noise + int(rules * unit_rules) + int(noise * unit_noise)
        if r.level != "allocated":
            safe += int((allocator[sharded] - 1) * unit_allocator)
        scaled.append(Scored(r.point, r.estimate, r.measured, r.level, r.reason, r.notes, safe))
    return scaled


def calibrate() -> tuple[float, float, dict[bool, float], dict[str, float]]:
    """(RULES_FRACTION, NOISE_FRACTION in whole percents up to 30%, ALLOCATOR_SPREAD_SCALE from
    1 to 8 for unsharded and sharded runs) with the smallest median margin for which every
    level's safe figure covers at least 95% of its points."""
    from vramlens.estimator import margins

    kept = margins.RULES_FRACTION, margins.NOISE_FRACTION, margins.ALLOCATOR_SPREAD_SCALE
    margins.RULES_FRACTION, margins.NOISE_FRACTION = 1.0, 1.0  # type: ignore[misc]
    margins.ALLOCATOR_SPREAD_SCALE = {False: 1.0, True: 1.0}  # type: ignore[misc]
    try:
        results = score("train", unit_margins=True) + score("infer", unit_margins=True)
    finally:
        margins.RULES_FRACTION, margins.NOISE_FRACTION, margins.ALLOCATOR_SPREAD_SCALE = kept  # type: ignore[misc]
    best: tuple[float, float, dict[bool, float], dict[str, float]] | None = None
    steps = (1, 1.5, 2, 3, 4, 6, 8)
    for scale in ({False: a, True: b} for a in steps for b in steps):
        for rules in range(31):
            for noise in range(31):
                trial = _with_fractions(results, rules / 100, noise / 100, scale)
                if all(safe_summary(group)["safe_coverage"] >= 0.95 for group in by_level(trial).values()):
                    total = safe_summary(trial)
                    if best is None or total["median_margin"] < best[3]["median_margin"]:
                        best = (rules / 100, noise / 100, scale, total)
                    break  # more noise only widens the margin
    if best is None:
        raise SystemExit("no factors cover 95% of every level")
    return best


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
    parser.add_argument("--task", default="all", choices=("train", "infer", "all"))
    parser.add_argument("--worst", type=int, default=12)
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args()
    if args.calibrate:
        rules, noise, scale, total = calibrate()
        print(
            f"RULES_FRACTION = {rules:.2f}, NOISE_FRACTION = {noise:.2f}, ALLOCATOR_SPREAD_SCALE = {scale}: "
            f"safe figure covers {total['safe_coverage']:.1%} of all points, median margin {total['median_margin']:.1%}"
        )
        return
    results = score("train") + score("infer") if args.task == "all" else score(args.task)
    stats = summary(results)
    print(
        f"{args.task}: {stats['scored']}/{stats['points']} usable points scored (coverage {stats['coverage']:.0%}); "
        f"median |error| {stats['median_ape']:.1%}, p90 {stats['p90_ape']:.1%}, under-estimated by >10%: {stats['under_10pct']:.1%}"
    )
    _print_levels(results)
    _print_sources(results)
    _print_worst(results, args.worst)


if __name__ == "__main__":
    main()
