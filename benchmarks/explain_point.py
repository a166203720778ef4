"""Print the estimate of one validation point, term by term: ``python benchmarks/explain_point.py p127``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import load_points, point_workload

from vramlens.estimator import estimate
from vramlens.model.resolve import model_from_config
from vramlens.units import GiB


def main() -> None:
    wanted = set(sys.argv[1:])
    for point in load_points():
        if point["id"] not in wanted:
            continue
        mapped = point_workload(point)
        workload = dict(mapped.workload or {})
        workload["model"] = model_from_config(point["hf_config"], name=point["model_name"])
        report = estimate(workload)
        print(
            f"== {point['id']} {point['config_name']} | measured {point['measured_bytes'] / GiB:.2f} GiB {point['measured_kind']}"
        )
        print(
            f"   allocated {report.allocated_bytes / GiB:.2f}  reserved {report.reserved_bytes / GiB:.2f}  device {report.device_bytes / GiB:.2f} (peak: {report.peak_phase})"
        )
        for phase in report.phases:
            parts = ", ".join(f"{c.value} {b / GiB:.2f}" for c, b in phase.breakdown.items())
            print(f"   {phase.name:15s} {phase.allocated_bytes / GiB:7.2f}  [{parts}]  {phase.note}")
        for term in report.terms:
            print(f"     {term.name:60s} {term.bytes / GiB:8.3f} GiB  {term.formula}")
        for note in report.assumptions:
            print(f"     * {note}")


if __name__ == "__main__":
    main()
