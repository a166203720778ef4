"""What was live when: allocations at an instant, leaks across steps, and what an OOM needed.

All functions work on a :class:`~vramlens.result.timeline.Timeline` whose events are real
allocations (an allocation and, optionally, one free per storage id) and never print.

* :func:`lifetimes` pairs each allocation with its free (vectorised; storage ids may be reused
  after a free);
* :func:`live_allocations` / :func:`module_breakdown`: what was live after an event, with the
  module, phase and stack of its *allocation* (a free event carries the module running when
  it was freed, so per-module sums must go through the allocations);
* :func:`step_ends` / :func:`find_leaks`: step boundaries and allocations that survive them;
* OOM explanations live in :mod:`vramlens.forensics.oom`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.trace.frames import is_user_frame

__all__ = [
    "Leak",
    "Lifetimes",
    "LiveAllocation",
    "find_leaks",
    "lifetimes",
    "live_allocations",
    "module_breakdown",
    "is_user_frame",
    "stack_frames",
    "step_ends",
]

Int64Array = npt.NDArray[np.int64]
#: Frames kept per stack in reports (innermost first; the display shows ``--stack-lines`` of them, and
#: ``--user-frames`` the user's own among them, which are the outermost).
STACK_DEPTH = 48
_NUMBERED = re.compile(r"^(?P<prefix>.*?\D)[#_\- ]?(?P<number>\d+)$")


@dataclass(frozen=True, kw_only=True, eq=False)
class Lifetimes:
    """Every allocation's event index (``start``, ascending) and its free's (``end``; the
    timeline's length when it is never freed)."""

    start: Int64Array
    end: Int64Array

    def live_at(self, index: int) -> Int64Array:
        """Positions (into ``start``) of the allocations live after event ``index``."""
        return np.flatnonzero((self.start <= index) & (self.end > index))


def lifetimes(timeline: Timeline) -> Lifetimes:
    """Pair each allocation with the next event of the same storage id, when that is a free.

    Sorting by (storage, event) puts an allocation right before its own free; frees with no
    allocation (memory that existed before recording) are left out.
    """
    count = len(timeline)
    order = np.lexsort((np.arange(count), timeline.storage))
    storage, nbytes = timeline.storage[order], timeline.nbytes[order]
    is_alloc = nbytes > 0
    paired = np.zeros(count, dtype=bool)
    if count > 1:
        paired[:-1] = (storage[1:] == storage[:-1]) & (nbytes[1:] < 0)
    positions = np.flatnonzero(is_alloc)
    following = np.minimum(positions + 1, count - 1)
    ends = np.where(paired[positions], order[following], count).astype(np.int64)
    starts = order[positions].astype(np.int64)
    ranking = np.argsort(starts, kind="stable")
    return Lifetimes(start=starts[ranking], end=ends[ranking])


def stack_frames(timeline: Timeline, code: int, depth: int = STACK_DEPTH) -> tuple[str, ...]:
    """The innermost ``depth`` frames of stack ``code``, innermost first (stacks are stored
    outermost first, as the tracker and the snapshot reader write them)."""
    if code < 0:
        return ()
    frames = [frame for frame in timeline.stacks[code].split("\n") if frame]
    return tuple(reversed(frames[-depth:]))


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveAllocation:
    """One allocation live at an instant."""

    event: int
    """Index of its allocation event."""
    nbytes: int
    """Its size at the timeline's level (requested bytes for tensor-level timelines)."""
    category: Category
    module: str
    """Innermost module running when it was allocated ("" if none)."""
    phase: str
    """Phase it was allocated in ("" if none)."""
    age: int
    """Time from its allocation to the instant, in ``time_unit``."""
    time_unit: str
    stack: tuple[str, ...]
    """Innermost user frames first."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "event": self.event,
            "bytes": self.nbytes,
            "category": self.category.value,
            "module": self.module,
            "phase": self.phase,
            f"age_{'ns' if self.time_unit == 'ns' else 'events'}": self.age,
            "stack": list(self.stack),
        }


def _name(table: tuple[str, ...], code: int) -> str:
    """The name of ``code`` in ``table`` ( for -1)."""
    return table[code] if code >= 0 else ""


def live_allocations(timeline: Timeline, lives: Lifetimes, index: int, count: int) -> tuple[LiveAllocation, ...]:
    """The ``count`` largest allocations live after event ``index`` (largest first, then oldest)."""
    positions = lives.live_at(index)
    events = lives.start[positions]
    sizes = timeline.nbytes[events]
    chosen = events[np.lexsort((events, -sizes))[:count]]
    now = int(timeline.time[index]) if index >= 0 else 0
    return tuple(
        LiveAllocation(
            event=event,
            nbytes=int(timeline.nbytes[event]),
            category=CATEGORY_ORDER[int(timeline.category[event])],
            module=_name(timeline.modules, int(timeline.module[event])),
            phase=_name(timeline.phases, int(timeline.phase[event])),
            age=now - int(timeline.time[event]),
            time_unit=timeline.time_unit,
            stack=stack_frames(timeline, int(timeline.stack[event])),
        )
        for event in chosen.tolist()
    )


def module_breakdown(timeline: Timeline, lives: Lifetimes, index: int) -> dict[str, int]:
    """Live bytes after event ``index`` by the module that allocated them, largest first
    ("" collects allocations made outside any module)."""
    events = lives.start[lives.live_at(index)]
    codes = timeline.module[events].astype(np.int64) + 1
    sums = np.bincount(codes, weights=timeline.nbytes[events], minlength=len(timeline.modules) + 1)
    totals = {_name(timeline.modules, code - 1): int(value) for code, value in enumerate(sums.tolist()) if value}
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def step_ends(timeline: Timeline) -> tuple[tuple[int, ...], str]:
    """The last event of each training (or serving) step, and the rule that found them.

    In order of preference: the step windows a recorder stored in ``metadata["steps"]``
    (``[{"step", "start", "end"}]`` on the timeline's clock, as the HF callback writes them),
    phases numbered like ``ProfilerStep#3`` or ``step_3`` (one step per number; from snapshot
    annotations), the end of each ``optimizer_step`` stretch, or each recurrence of the first
    phase after ``load`` (e.g. ``forward`` without an optimizer, ``prefill`` per generate
    call). Fewer than two steps: ``()``. The phase runs are handled as arrays (a snapshot of
    10**6 events has some 10**5 of them).
    """
    recorded = _recorded_ends(timeline)
    if len(recorded) >= 2:
        return recorded, "recorded step windows"
    codes, firsts, lasts = _named_spans(timeline)
    names = timeline.phases
    numbered = _numbered_ends(names, codes, lasts)
    if len(numbered) >= 2:
        return numbered, "numbered phases"
    optimizer = lasts[_named(names, "optimizer_step")[codes]]
    if len(optimizer) >= 2:
        return tuple(optimizer.tolist()), "end of each optimizer_step"
    working = codes[~_named(names, "load")[codes]]
    if len(working):
        first = names[int(working[0])]
        starts = firsts[_named(names, first)[codes]]
        if len(starts) >= 2:
            return (*(starts[1:] - 1).tolist(), len(timeline) - 1), f"each start of {first}"
    return (), "no repeated steps"


def _named_spans(timeline: Timeline) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Phase code, first and last event of each run of one named phase, in order: the runs of
    :meth:`~vramlens.result.timeline.Timeline.phase_spans` whose name is not empty."""
    if not len(timeline):
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    starts = np.flatnonzero(np.diff(timeline.phase, prepend=np.int32(-2)))
    ends = np.append(starts[1:] - 1, len(timeline) - 1)
    codes = timeline.phase[starts].astype(np.int64)
    keep = codes >= 0
    keep[keep] = np.array([bool(name) for name in timeline.phases], dtype=bool)[codes[keep]]
    return codes[keep], starts[keep], ends[keep]


def _named(names: tuple[str, ...], name: str) -> npt.NDArray[np.bool_]:
    """Per phase code: whether the phase is called ``name``."""
    return np.array([phase == name for phase in names], dtype=bool)


def _recorded_ends(timeline: Timeline) -> tuple[int, ...]:
    """The last event at or before each recorded window's ``end`` time (distinct, ascending)."""
    windows = timeline.metadata.get("steps")
    if not isinstance(windows, list):
        return ()
    times: list[int] = []
    for window in windows:
        end = window.get("end") if isinstance(window, dict) else None
        if not isinstance(end, int) or isinstance(end, bool):
            return ()
        times.append(end)
    last = np.searchsorted(timeline.time, np.array(sorted(times), dtype=np.int64), side="right") - 1
    return tuple(sorted({int(index) for index in last.tolist() if index >= 0}))


def _numbered_ends(
    names: tuple[str, ...], codes: npt.NDArray[np.int64], lasts: npt.NDArray[np.int64]
) -> tuple[int, ...]:
    """Step ends from numbered phases of the most common prefix (counted over the runs; a tie
    goes to the prefix seen first): each number's last event."""
    present, first_run = np.unique(codes, return_index=True)
    matched = {code: _NUMBERED.match(names[code]) for code in present.tolist()}  # names repeat: match each once
    runs = np.bincount(codes, minlength=len(names)) if len(codes) else np.zeros(len(names), np.int64)
    count: dict[str, int] = {}
    seen_first: dict[str, int] = {}
    for code, first in zip(present.tolist(), first_run.tolist(), strict=True):
        match = matched[code]
        if match:
            prefix = match.group("prefix")
            count[prefix] = count.get(prefix, 0) + int(runs[code])
            seen_first[prefix] = min(seen_first.get(prefix, first), first)
    if not count:
        return ()
    prefix = max(count, key=lambda name: (count[name], -seen_first[name]))
    step_of = np.full(len(names), -1, np.int64)  # phase code -> dense index of its step number
    numbers: dict[int, int] = {}
    for code, match in matched.items():
        if match and match.group("prefix") == prefix:
            step_of[code] = numbers.setdefault(int(match.group("number")), len(numbers))
    steps = step_of[codes]
    last_of = np.full(len(numbers), -1, np.int64)
    np.maximum.at(last_of, steps[steps >= 0], lasts[steps >= 0])
    return tuple(sorted(last_of.tolist()))


@dataclass(frozen=True, kw_only=True, slots=True)
class Leak:
    """Allocations from one stack that outlive steps and whose live total grows step over step."""

    category: Category
    module: str
    stack: tuple[str, ...]
    """Innermost frames first (empty without recorded stacks: then grouped by module and category)."""
    count: int
    """Allocations of this stack made in earlier steps and still live at the last step's end."""
    nbytes: int
    """Their total bytes."""
    bytes_per_step: int
    """Growth of the stack's live total per step (last step end minus first, over the steps)."""
    oldest_steps: int
    """Step ends the oldest of them survived."""
    totals: tuple[int, ...]
    """The stack's live bytes at each step end."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "category": self.category.value,
            "module": self.module,
            "stack": list(self.stack),
            "count": self.count,
            "bytes": self.nbytes,
            "bytes_per_step": self.bytes_per_step,
            "oldest_survived_steps": self.oldest_steps,
            "bytes_at_step_ends": list(self.totals),
        }


def find_leaks(timeline: Timeline, lives: Lifetimes, ends: tuple[int, ...], *, min_steps: int = 2) -> tuple[Leak, ...]:
    """Stacks whose allocations survive at least ``min_steps`` step ends, come from at least two
    different steps, and whose live total never shrinks and grows from the first step end to
    the last: the signature of memory kept step after step (a list of losses with their
    graphs, a cache that only grows). Largest growth first.

    Vectorised over allocations: an allocation of step ``k`` (the first end at or after it) that
    is freed before end ``g`` (the first end at or after its free) is live at ends ``k..g-1``,
    so per-stack totals at every end are a cumulative sum of +bytes at ``k`` and -bytes at ``g``.
    """
    if len(ends) < 2:
        return ()
    marks = np.asarray(ends, dtype=np.int64)
    last = len(marks) - 1
    step = np.searchsorted(marks, lives.start, side="left")
    gone = np.searchsorted(marks, lives.end, side="left")
    kept = (gone > last) & (step < last)
    groups, group = np.unique(_group_keys(timeline, lives.start), return_inverse=True)
    oldest = np.full(len(groups), last, dtype=np.int64)
    np.minimum.at(oldest, group[kept], step[kept])
    distinct = np.bincount(np.unique(group[kept] * (last + 1) + step[kept]) // (last + 1), minlength=len(groups))
    eligible = (last - oldest >= min_steps) & (distinct >= 2)
    if not eligible.any():
        return ()
    row = np.cumsum(eligible) - 1
    chosen = eligible[group] & (step <= last)
    rows, sizes = row[group[chosen]], timeline.nbytes[lives.start[chosen]]
    keys, net = _net_changes(rows, step[chosen], np.minimum(gone[chosen], last + 1), sizes, last)
    growing_rows = _growing_rows(keys, net, last, int(eligible.sum()))
    survivors = np.flatnonzero(kept)
    survivors = survivors[np.argsort(group[survivors], kind="stable")]
    bounds = np.searchsorted(group[survivors], np.arange(len(groups) + 1))
    found = []
    for index in np.flatnonzero(eligible)[growing_rows].tolist():
        members = np.sort(survivors[bounds[index] : bounds[index + 1]])
        totals = _row_totals(keys, net, int(row[index]), last)
        found.append(_leak(timeline, lives, members, step[members], totals, last))
    return tuple(sorted(found, key=lambda leak: (-leak.bytes_per_step, -leak.nbytes)))


def _net_changes(
    rows: Int64Array, born: Int64Array, died: Int64Array, sizes: Int64Array, last: int
) -> tuple[Int64Array, Int64Array]:
    """Sparse per-(row, step end) net byte changes: ``+size`` at the end an allocation first
    counts at and ``-size`` at the first end it no longer reaches (``last + 1``: never gone).
    Keys are ``row * (last + 2) + end``, ascending; only the (row, end) pairs that occur are
    kept, so the cost is linear in the allocations however many steps the record has."""
    width = last + 2
    raw = np.concatenate((rows * width + born, rows * width + died))
    keys, where = np.unique(raw, return_inverse=True)
    net = np.bincount(where, weights=np.concatenate((sizes, -sizes)).astype(np.float64), minlength=len(keys))
    return keys, np.rint(net).astype(np.int64)


def _growing_rows(keys: Int64Array, net: Int64Array, last: int, count: int) -> npt.NDArray[np.bool_]:
    """Rows whose live total never shrinks from one step end to the next (no negative net change
    at ends ``1..last``) and ends above where it started (a positive sum of those changes)."""
    width = last + 2
    rows, ends = keys // width, keys % width
    inside = (ends >= 1) & (ends <= last)
    shrinks = np.bincount(rows[inside & (net < 0)], minlength=count) > 0
    gained = np.bincount(rows[inside], weights=net[inside].astype(np.float64), minlength=count)
    return ~shrinks & (gained > 0)


def _row_totals(keys: Int64Array, net: Int64Array, row: int, last: int) -> Int64Array:
    """One row's live total at every step end ``0..last`` (cumulative sum of its net changes)."""
    width = last + 2
    lo, hi = np.searchsorted(keys, [row * width, (row + 1) * width])
    changes = np.zeros(width, dtype=np.int64)
    changes[keys[lo:hi] - row * width] = net[lo:hi]
    return np.cumsum(changes)[: last + 1]


def _group_keys(timeline: Timeline, events: Int64Array) -> Int64Array:
    """One int per allocation: its stack (and category), or without a stack its module and category."""
    stack = timeline.stack[events].astype(np.int64)
    module = timeline.module[events].astype(np.int64)
    category = timeline.category[events].astype(np.int64)
    width = len(CATEGORY_ORDER)
    with_stack = (stack + 1) * width + category
    without = -((module + 2) * width + category)
    return np.where(stack >= 0, with_stack, without)


def _leak(
    timeline: Timeline, lives: Lifetimes, members: Int64Array, steps: Int64Array, totals: Int64Array, last: int
) -> Leak:
    """The Leak of one stack: ``members`` are its surviving allocations (positions into ``lives``)."""
    newest = int(lives.start[members].max())
    return Leak(
        category=CATEGORY_ORDER[int(timeline.category[newest])],
        module=_name(timeline.modules, int(timeline.module[newest])),
        stack=stack_frames(timeline, int(timeline.stack[newest])),
        count=len(members),
        nbytes=int(timeline.nbytes[lives.start[members]].sum()),
        bytes_per_step=int((totals[-1] - totals[0]) // last),
        oldest_steps=last - int(steps.min()),
        totals=tuple(int(value) for value in totals.tolist()),
    )
