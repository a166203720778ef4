"""Labels a snapshot carries for its events: vramlens tags, ``category`` fields and annotation spans.

* vramlens tags: ``user_metadata`` strings ``"vramlens;phase=<p>;module=<m>;category=<c>"``
  (any key may be missing; values hold no ``;``), written through
  ``torch.cuda.memory._set_memory_metadata`` by vramlens' CUDA recorder. A tag may sit on any
  line of the string (PyTorch once appended ``"\\nmallocWithAddress"`` to user metadata, PR #193432).
* ``category`` fields: snapshots synthesised from the profiler (``_memory_viz._profile_to_snapshot``:
  ``parameter``, ``gradient``, ``activation``, ``optimizer_state``, ``input``, ``temporary``,
  ``autograd_detail``, ``unknown``) or written by vramlens (its own category names).
* spans: ``external_annotations`` START/END pairs (``record_function`` scopes such as
  ``ProfilerStep#3``), matched by name, innermost last; a START without END lasts to the end, an
  END without START began before recording.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vramlens.categories import TORCH_PROFILER_CATEGORIES, Category
from vramlens.result.timeline import CATEGORY_ORDER
from vramlens.snapshot.model import Annotation

__all__ = ["NO_CATEGORY", "Labels", "category_code", "parse_labels", "span_phases", "spans"]

#: Marks "no category recorded" in the per-string code arrays.
NO_CATEGORY = -1
#: ``_profile_to_snapshot``'s lower-case names; its "unknown" stays unlabelled (no category).
_PROFILER_NAMES = {name.lower(): category for name, category in TORCH_PROFILER_CATEGORIES if name != "unknown"}
_NAMES = {category.value: category for category in Category} | _PROFILER_NAMES
_CODES = {name: CATEGORY_ORDER.index(category) for name, category in _NAMES.items()}


def category_code(name: str) -> int:
    """Category code (index into ``CATEGORY_ORDER``) of a vramlens or profiler category name;
    :data:`NO_CATEGORY` for anything else (``unknown`` included)."""
    return _CODES.get(name.strip().lower(), NO_CATEGORY)


@dataclass(frozen=True, kw_only=True, slots=True)
class Labels:
    """Per-string labels: entry ``s`` describes ``Snapshot.strings[s]``; index ``-1`` (via a
    leading slot) means "no string". Names index the ``phases``/``modules`` lists."""

    category: npt.NDArray[np.int8]
    phase: npt.NDArray[np.int32]
    module: npt.NDArray[np.int32]
    field_category: npt.NDArray[np.int8]
    """Category of the string read as a ``category`` field value."""
    phases: list[str]
    modules: list[str]


def _tag(text: str) -> dict[str, str]:
    """The key/value pairs of the vramlens tag in ``text`` (empty when it has none)."""
    for line in text.splitlines():
        if line == "vramlens" or line.startswith("vramlens;"):
            pairs = (part.partition("=") for part in line.split(";")[1:])
            return {key.strip(): value.strip() for key, sep, value in pairs if sep and value.strip()}
    return {}


def parse_labels(strings: Sequence[str]) -> Labels:
    """Parse every distinct string once (a snapshot has few), shifted by one so code -1 reads slot 0."""
    size = len(strings) + 1
    category = np.full(size, NO_CATEGORY, np.int8)
    field_category = np.full(size, NO_CATEGORY, np.int8)
    phase = np.full(size, -1, np.int32)
    module = np.full(size, -1, np.int32)
    phases: dict[str, int] = {}
    modules: dict[str, int] = {}
    for slot, text in enumerate(strings, start=1):
        field_category[slot] = category_code(text)
        tag = _tag(text)
        if not tag:
            continue
        category[slot] = category_code(tag.get("category", ""))
        if "phase" in tag:
            phase[slot] = phases.setdefault(tag["phase"], len(phases))
        if "module" in tag:
            module[slot] = modules.setdefault(tag["module"], len(modules))
    return Labels(
        category=category,
        phase=phase,
        module=module,
        field_category=field_category,
        phases=list(phases),
        modules=list(modules),
    )


def spans(annotations: Sequence[Annotation], device: int) -> list[tuple[float, float, str]]:
    """``(start_us, end_us, name)`` of the record_function scopes on ``device``, by start time."""
    found: list[tuple[float, float, str]] = []
    open_scopes: list[tuple[str, float]] = []
    timed = [a for a in annotations if a.time_us is not None and a.device in (None, device)]
    for annotation in sorted(timed, key=lambda a: a.time_us or 0):
        time = float(annotation.time_us or 0)
        if annotation.stage == "START":
            open_scopes.append((annotation.name, time))
        elif annotation.stage == "END":
            match = next((i for i in range(len(open_scopes) - 1, -1, -1) if open_scopes[i][0] == annotation.name), None)
            start = open_scopes.pop(match)[1] if match is not None else float("-inf")
            found.append((start, time, annotation.name))
    found += [(start, float("inf"), name) for name, start in open_scopes]
    return sorted(found, key=lambda span: span[0])


def span_phases(
    times_us: npt.NDArray[np.int64], scopes: list[tuple[float, float, str]], phases: dict[str, int]
) -> npt.NDArray[np.int32]:
    """Phase code of each time: the innermost (latest-starting) scope containing it, else -1.
    New scope names are added to ``phases``."""
    result = np.full(len(times_us), -1, np.int32)
    if not scopes or not len(times_us):
        return result
    order = np.argsort(times_us, kind="stable")
    ordered = times_us[order].astype(np.float64)
    sorted_codes = np.full(len(times_us), -1, np.int32)
    for start, end, name in scopes:
        lo, hi = np.searchsorted(ordered, start, "left"), np.searchsorted(ordered, end, "right")
        if hi > lo:
            sorted_codes[lo:hi] = phases.setdefault(name, len(phases))
    result[order] = sorted_codes
    return result
