"""The table of an experiment (seed 004's columns, plus vramlens's predictions), for the terminal
and for Markdown.

Per run: the measured allocated-level peak (GiB = 2**30 bytes; MiB = 2**20 when every peak is
under 1 GiB), its reduction against the
control (the run without techniques; the first run when there is none), the speed
(tokens/s after the warm-up), the time per step relative to the control, the last loss,
then the estimator's and the simulator's peaks and their errors against the measurement
(``(predicted - measured) / measured``). A run that could not happen shows why instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramlens.units import GiB, MiB

__all__ = ["ExperimentRow", "experiment_markdown", "experiment_rows", "experiment_text", "peak_unit", "rank_lines"]


def peak_unit(rows: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
    """GiB (2**30) when some measured or predicted peak reaches 1 GiB, else MiB (2**20)."""
    keys = ("measured_peak_bytes", "predicted_peak_bytes", "simulated_peak_bytes")
    top = max([int(row.get(key) or 0) for row in rows for key in keys] + [0])
    return ("GiB", GiB) if top >= GiB else ("MiB", MiB)


def _header(unit: str) -> tuple[str, ...]:
    return ("Configuration", f"Peak ({unit})", "Reduction", "Tokens/s", "Rel. time", "Loss",
            f"Estimate ({unit})", "Est. error", f"Simulated ({unit})", "Sim. error")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ExperimentRow:
    """One run's figures, derived for the table (None: not measured / not predicted)."""

    name: str
    measured: int | None
    reduction: float | None
    """1 - peak / control peak."""
    tokens_per_s: float | None
    relative_time: float | None
    """Seconds per step over the control's."""
    loss: float | None
    predicted: int | None
    predicted_error: float | None
    simulated: int | None
    simulated_error: float | None
    skipped: str | None


def _error(predicted: int | None, measured: int | None) -> float | None:
    return None if predicted is None or not measured else (predicted - measured) / measured


def _control(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = next((r for r in rows if not r.get("techniques") and r.get("measured_peak_bytes")), None)
    return found or next((r for r in rows if r.get("measured_peak_bytes")), None)


def experiment_rows(rows: Sequence[Mapping[str, Any]]) -> list[ExperimentRow]:
    """The table's figures from store rows (``ExperimentResult.rows``)."""
    control = _control(rows)
    base_peak = control["measured_peak_bytes"] if control else None
    base_time = control.get("step_seconds") if control else None
    out = []
    for row in rows:
        measured, seconds = row.get("measured_peak_bytes"), row.get("step_seconds")
        out.append(
            ExperimentRow(
                name=str(row["name"]),
                measured=measured,
                reduction=None if row is control or not (measured and base_peak) else 1 - measured / base_peak,
                tokens_per_s=row.get("tokens_per_s"),
                relative_time=seconds / base_time if seconds and base_time else None,
                loss=row.get("loss"),
                predicted=row.get("predicted_peak_bytes"),
                predicted_error=_error(row.get("predicted_peak_bytes"), measured),
                simulated=row.get("simulated_peak_bytes"),
                simulated_error=_error(row.get("simulated_peak_bytes"), measured),
                skipped=row.get("skipped"),
            )
        )
    return out


def _cells(row: ExperimentRow, unit: int) -> list[str]:
    def size(value: int | None) -> str:
        return "-" if value is None else f"{value / unit:.3f}"

    def pct(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else f"{100 * value:+.1f}%" if signed else f"{100 * value:.1f}%"

    return [
        row.name,
        size(row.measured),
        pct(row.reduction),
        "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}",
        "-" if row.relative_time is None else f"{row.relative_time:.2f}x",
        "-" if row.loss is None else f"{row.loss:.4f}",
        size(row.predicted),
        pct(row.predicted_error, signed=True),
        size(row.simulated),
        pct(row.simulated_error, signed=True),
    ]


def _notes(rows: Sequence[ExperimentRow]) -> list[str]:
    return [f"{row.name}: skipped ({row.skipped})" for row in rows if row.skipped]


def rank_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Runs measured on several ranks (torchrun): each rank's peak and the skew (the table's peak
    is the highest rank's)."""
    lines = []
    for row in rows:
        ranks = row.get("ranks")
        if not ranks or row.get("skipped"):
            continue
        peaks = ", ".join(f"rank {r['rank']} {int(r['measured_peak_bytes']) / MiB:,.2f} MiB" for r in ranks)
        lines.append(
            f"{row['name']}: {peaks}; skew {int(row.get('skew_bytes') or 0) / MiB:,.2f} MiB "
            f"(max/median {row.get('max_over_median')})"
        )
    return lines


def experiment_text(rows: Sequence[Mapping[str, Any]], *, device: str) -> str:
    """Fixed-width terminal table, the device and skipped runs under it."""
    table = experiment_rows(rows)
    unit_name, unit = peak_unit(rows)
    header = _header(unit_name)
    body = [_cells(row, unit) for row in table]
    widths = [max(len(line[i]) for line in [list(header), *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(widths[i]) for i, cell in enumerate(cells) if i)]).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths), *(line(cells) for cells in body)]
    lines += [
        "",
        f"device: {device}; peaks are allocated-level, {unit_name} = 2**{unit.bit_length() - 1} bytes",
        *_notes(table),
        *rank_lines(rows),
    ]
    return "\n".join(lines) + "\n"


def experiment_markdown(rows: Sequence[Mapping[str, Any]], *, device: str) -> str:
    """The same table in GitHub Markdown."""
    table = experiment_rows(rows)
    unit_name, unit = peak_unit(rows)
    header = _header(unit_name)
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(_cells(row, unit)) + " |" for row in table]
    lines += ["", f"Device: {device}; peaks are allocated-level, {unit_name} = 2**{unit.bit_length() - 1} bytes."]
    lines += [f"* {note}" for note in _notes(table)]
    return "\n".join(lines) + "\n"
