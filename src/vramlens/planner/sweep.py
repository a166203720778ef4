"""Sweeps: one workload estimated at each value of one or two keys (seed ``000_*``'s scaling analysis).

:func:`sweep` estimates the workload at every value (or pair of values) of the swept keys and
records, per row, the bytes of each category at the peak (plus allocator slack and runtime
memory, so a row's categories add up to the device-level peak), the peak at each level, and the
fit and headroom on the workload's GPU. A value the workload contract refuses in that
combination (``tp`` that does not divide the heads, a context beyond the model's positions)
becomes a row with a one-line ``error`` instead of ending the sweep; a value that cannot be read
as the key's type at all (``batch=x``) is an :class:`~vramlens.errors.InputError` naming the key.

Values are read exactly as workload files and ``vramlens estimate`` flags read them (the
converters of :mod:`vramlens.workload.load`): for the token keys (``seq``, ``prompt``,
``generate``, ``context``, ``max_num_batched_tokens``) ``k`` is 1024 tokens, so ``2k`` = 2048
and ``32k`` = 32768; other integer keys take plain integers.

Growth (:class:`Growth`): for each category, and for the device peak, the ratio between
consecutive rows and a fitted growth order along each numeric axis (the other axis held at its
first value). The order is ``1 +`` the least-squares slope of log(divided difference) against
log(midpoint): for ``c + a*x`` the divided differences are all ``a`` (order 1, whatever the
constant ``c``); for ``c + a*x**2`` they are ``a*(x_i + x_i+1)``, proportional to the midpoint
(order 2); ``a*x + b*x**2`` lands in between ("superlinear"). Quantities that fall with the value
(parameters over ``tp``) get the log-log slope of the bytes themselves (negative).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from vramlens.categories import Category
from vramlens.errors import InputError, VramlensError
from vramlens.estimator import estimate_resolved
from vramlens.hardware import resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.result.report import MemoryReport
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS, Converter, load_workload
from vramlens.workload.spec import Workload

__all__ = ["Axis", "Growth", "Sweep", "SweepRow", "parse_axis", "sweep"]

Source = Workload | Mapping[str, Any] | str | os.PathLike[str]
_BLOCKS: Final[dict[str, Mapping[str, Converter]]] = {"lora": LORA_KEYS, "parallel": PARALLEL_KEYS}
#: Most values one axis may take (a sweep is read by a person; 0.15 ms per estimate).
MAX_VALUES: Final = 256
#: Relative spread under which a quantity counts as constant across the sweep.
CONSTANT_TOLERANCE: Final = 1e-3
#: How far a fitted order may sit from 0, 1 or 2 and still be called constant/linear/quadratic.
ORDER_TOLERANCE: Final = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    """One swept key: its contract path (``batch``, ``parallel.tp``) and its values, as read."""

    key: str
    values: tuple[Any, ...]

    @property
    def numeric(self) -> bool:
        """Whether every value is a number (growth orders are fitted only then)."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepRow:
    """The estimate at one value (or pair of values) of the swept keys."""

    values: Mapping[str, Any]
    """Swept key -> its value in this row (JSON-safe)."""
    report: MemoryReport | None
    error: str | None = None
    """Why this combination could not be estimated (one line); None when ``report`` is set."""

    @property
    def fits(self) -> bool:
        """Whether the estimate fits the GPU (False for an error or when no GPU was given)."""
        return self.report is not None and self.report.fits is True

    @property
    def stack(self) -> dict[Category, int]:
        """Bytes by category at the peak, plus allocator slack and runtime: sums to the device peak."""
        if self.report is None:
            return {}
        stack = {c: b for c, b in self.report.breakdown.items() if b}
        stack[Category.ALLOCATOR_SLACK] = self.report.allocator_slack_bytes
        stack[Category.RUNTIME] = self.report.runtime_bytes
        return {c: b for c, b in stack.items() if b}

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": dict(self.values),
            "report": None if self.report is None else self.report.to_dict(),
            "fits": self.fits,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Growth:
    """How one quantity (a category, or ``peak``: device bytes) grows along one axis."""

    quantity: str
    axis: str
    ratios: tuple[float | None, ...]
    """bytes[i+1] / bytes[i] between consecutive values (None where bytes[i] is 0 or missing)."""
    order: float | None
    """Fitted growth order (see the module docstring); None for non-numeric axes or too few rows."""
    shape: str
    """"constant", "linear", "quadratic", "sublinear", "superlinear", "decreasing", "increasing" (two
    points only), "mixed" (up and down), or "n/a" (non-numeric axis, or fewer than two estimates)."""

    def summary(self) -> str:
        """``activations ~ linear in batch (order 1.00)``."""
        order = "" if self.order is None else f" (order {self.order:.2f})"
        if self.order is None and len(self.ratios) == 1 and self.ratios[0] is not None:
            order = f" (x{self.ratios[0]:.2f})"
        return f"{self.quantity} ~ {self.shape} in {self.axis}{order}"

    def to_dict(self) -> dict[str, Any]:
        return {"ratios": list(self.ratios), "order": self.order, "shape": self.shape}


@dataclass(frozen=True, kw_only=True, slots=True)
class Sweep:
    """Rows in the order of the values (the last axis varies fastest), and the growth along each axis."""

    axes: tuple[Axis, ...]
    rows: tuple[SweepRow, ...]
    growth: tuple[Growth, ...]
    gpu: str | None
    capacity_bytes: int | None

    @property
    def largest_fitting(self) -> Any | None:
        """One numeric axis: the largest value whose estimate fits (None if none, or no GPU)."""
        if len(self.axes) != 1 or not self.axes[0].numeric:
            return None
        key = self.axes[0].key
        return max((row.values[key] for row in self.rows if row.fits), default=None)

    def to_dict(self) -> dict[str, Any]:
        """``{"axes": [{"key", "values"}], "rows": [...], "growth": {axis: {quantity: {...}}}, ...}``."""
        growth: dict[str, dict[str, Any]] = {}
        for item in self.growth:
            growth.setdefault(item.axis, {})[item.quantity] = item.to_dict()
        return {
            "axes": [{"key": axis.key, "values": list(axis.values)} for axis in self.axes],
            "gpu": None if self.gpu is None else {"name": self.gpu, "capacity_bytes": self.capacity_bytes},
            "rows": [row.to_dict() for row in self.rows],
            "growth": growth,
            "largest_fitting": self.largest_fitting,
        }


def _path(key: str, name: str) -> tuple[str, Converter]:
    """The contract path of ``key`` (``tp`` and ``parallel.tp`` both give ``parallel.tp``) and its converter."""
    text = key.strip().replace("-", "_")
    block, _, leaf = text.rpartition(".")
    if block in _BLOCKS and leaf in _BLOCKS[block]:
        return text, _BLOCKS[block][leaf]
    if not block and text in TOP_KEYS:
        return text, TOP_KEYS[text]
    nested = [f"{b}.{text}" for b, table in _BLOCKS.items() if not block and text in table]
    if len(nested) == 1:
        return nested[0], _BLOCKS[nested[0].split(".")[0]][text]
    accepted = [*TOP_KEYS, *(f"{b}.{k}" for b, table in _BLOCKS.items() for k in table)]
    close = difflib.get_close_matches(text, accepted, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise InputError(f"{name}: unknown workload key {key!r}{hint}; any key of the workload contract can be swept")


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def parse_axis(key: str, values: Sequence[Any], *, name: str | None = None) -> Axis:
    """An :class:`Axis` of ``key`` (a contract key, dotted for nested ones) with ``values`` read as a
    workload file reads them. ``name`` (e.g. ``--seq``) is what error messages call it."""
    label = name or key
    path, convert = _path(key, label)
    if isinstance(values, (str, bytes)) or not 1 <= len(values) <= MAX_VALUES:
        raise InputError(f"{label}: give 1 to {MAX_VALUES} values (e.g. 1,2,4,8), got {values!r}")
    parsed = [_plain(convert(label, value)) for value in values]
    if len(set(map(repr, parsed))) != len(parsed):
        raise InputError(f"{label}: values repeat ({', '.join(map(str, parsed))}); give each value once")
    return Axis(key=path, values=tuple(parsed))


def _override(values: Mapping[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for path, value in values.items():
        block, _, leaf = path.rpartition(".")
        (overrides.setdefault(block, {}) if block else overrides)[leaf] = value
    return overrides


def _row(base: Workload, values: Mapping[str, Any]) -> SweepRow:
    """The estimate with ``values`` set; a refused combination becomes the row's error."""
    try:
        workload = load_workload(base, _override(values))
        spec = load_model(workload.model)
        gpu = resolve_gpu(workload.gpu) if workload.gpu is not None else None
        report = estimate_resolved(spec, dataclasses.replace(workload, model=spec), gpu)
    except VramlensError as error:
        return SweepRow(values=dict(values), report=None, error=str(error))
    return SweepRow(values=dict(values), report=report)


def sweep(workload: Source, axes: Mapping[str, Sequence[Any]] | Sequence[Axis], **overrides: Any) -> Sweep:
    """Estimate ``workload`` (with ``overrides``) at each value of one or two keys.

    ``axes`` maps keys (``batch``, ``seq``, ``parallel.tp`` or ``tp``) to their values, or is a
    sequence of :class:`Axis` from :func:`parse_axis`. Two axes give every pair (the second varies
    fastest). Raises :class:`InputError` for an unknown key, an unreadable value, or not 1-2 axes.
    """
    if isinstance(axes, Mapping):
        parsed = tuple(parse_axis(key, values) for key, values in axes.items())
    else:
        parsed = tuple(axes)
    if not 1 <= len(parsed) <= 2 or len({a.key for a in parsed}) != len(parsed):
        keys = ", ".join(a.key for a in parsed) or "none"
        raise InputError(f"sweep: give one or two different keys to sweep (e.g. batch=1,2,4,8), got {keys}")
    base = load_workload(workload, overrides)
    base = dataclasses.replace(base, model=load_model(base.model))
    rows = tuple(
        _row(base, dict(zip([a.key for a in parsed], combo, strict=True)))
        for combo in itertools.product(*(a.values for a in parsed))
    )
    gpu = resolve_gpu(base.gpu) if base.gpu is not None else None
    return Sweep(
        axes=parsed,
        rows=rows,
        growth=tuple(g for i in range(len(parsed)) for g in _axis_growth(parsed, rows, i)),
        gpu=None if gpu is None else gpu.name,
        capacity_bytes=next((r.report.capacity_bytes for r in rows if r.report is not None), None),
    )


def _line(axes: Sequence[Axis], rows: Sequence[SweepRow], index: int) -> list[SweepRow]:
    """The rows along axis ``index`` with the other axis at its first value."""
    if len(axes) == 1:
        return list(rows)
    other = axes[1 - index]
    return [row for row in rows if row.values[other.key] == other.values[0]]


def _axis_growth(axes: Sequence[Axis], rows: Sequence[SweepRow], index: int) -> list[Growth]:
    axis = axes[index]
    line = _line(axes, rows, index)
    categories = [c for c in Category if any(c in row.stack for row in line)]
    quantities: list[tuple[str, list[int | None]]] = [
        (c.value, [None if r.report is None else r.stack.get(c, 0) for r in line]) for c in categories
    ]
    quantities.append(("peak", [None if r.report is None else r.report.device_bytes for r in line]))
    xs = [row.values[axis.key] for row in line]
    return [_growth(name, axis, xs, ys) for name, ys in quantities]


def _growth(name: str, axis: Axis, xs: Sequence[Any], ys: Sequence[int | None]) -> Growth:
    ratios = tuple(None if a is None or b is None or a == 0 else b / a for a, b in itertools.pairwise(ys))
    points = sorted((x, y) for x, y in zip(xs, ys, strict=True) if y is not None) if axis.numeric else []
    order, shape = _order([float(x) for x, _ in points], [float(y) for _, y in points])
    if not axis.numeric:
        shape = "n/a"
    return Growth(quantity=name, axis=axis.key, ratios=ratios, order=order, shape=shape)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(ys) against log(xs) (all positive)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    spread = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / spread if spread else 0.0


def _order(xs: Sequence[float], ys: Sequence[float]) -> tuple[float | None, str]:
    """Fitted order and its name for positive, increasing ``xs`` (see the module docstring)."""
    if len(xs) < 2 or xs[0] <= 0:
        return None, "n/a"
    if max(ys) - min(ys) <= CONSTANT_TOLERANCE * max(max(ys), 1.0):
        return 0.0, "constant"
    steps = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True))]
    if all(s <= 0 for s in steps) and min(ys) > 0:
        return round(_slope(xs, ys), 3), "decreasing"
    if not all(s > 0 for s in steps):
        return None, "mixed"
    if len(steps) == 1:  # two points cannot tell a constant part from the order
        return None, "increasing"
    mids = [(x0 + x1) / 2 for x0, x1 in itertools.pairwise(xs)]
    order = 1.0 + _slope(mids, steps)
    return round(order, 3), _shape(order)


def _shape(order: float) -> str:
    for target, name in ((1.0, "linear"), (2.0, "quadratic")):
        if abs(order - target) <= ORDER_TOLERANCE:
            return name
    return "sublinear" if order < 1 else "superlinear"
