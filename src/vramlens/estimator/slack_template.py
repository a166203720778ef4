"""The vocabulary-sized requests of a step as a template over the sizes (the reserved model, fast).

:func:`vramlens.estimator.reserved.training_slack` replays the step's vocabulary-sized requests
through the caching-allocator model (:func:`~vramlens.estimator.step_pattern.step_pattern` of
:func:`~vramlens.estimator.step_shape.step_shape` with no layer). For one model and one set of
size-free settings those requests differ from one workload to the next only in their sizes: this
module writes them once as a :class:`VocabularyTemplate`, by running the same three functions with
:mod:`~vramlens.estimator.size_symbols` in place of every sized input (tokens, batch, seq and the
stage's :data:`~vramlens.estimator.stage_memory.SIZED_QUANTITIES`). Where that run succeeds each
request is a size-free integer or an exact integer-linear function of those inputs; the template
then gives a workload's requests without building its step shape, and its slack is replayed once
per distinct set of the inputs it reads. Where the run reads a size any other way it raises and no
template is made: the estimator keeps building the requests for each workload.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from operator import attrgetter

from vramlens.allocator import AllocatorSettings
from vramlens.allocator.pattern import Repeat
from vramlens.allocator.replaying import repeated_peaks
from vramlens.estimator.logits import LogitsMemory
from vramlens.estimator.size_symbols import UNAVAILABLE, Linear, sized_context, symbols
from vramlens.estimator.stage_memory import SIZED_QUANTITIES, StageMemory
from vramlens.estimator.step_pattern import step_pattern
from vramlens.estimator.step_shape import step_shape
from vramlens.resolve.context import TrainingContext

__all__ = ["VocabularyTemplate", "sized_inputs", "vocabulary_template"]

_LOGITS = ("forward_end", "kept", "backward_start", "outputs")
_SCALARS = tuple(name for name in SIZED_QUANTITIES if name != "logits")
#: Where each sized input is read: of the context, or of the stage's memory (``mem.``).
_INPUTS = (
    "tokens",
    "workload.batch",
    "workload.seq",
    *[f"mem.{name}" for name in _SCALARS],
    *[f"mem.logits.{name}" for name in _LOGITS],
)
#: Slack results kept per template before they are dropped.
RESULT_LIMIT = 1 << 16
#: Templates whose results are kept (shared between plans with the same requests) before all are dropped.
TEMPLATE_LIMIT = 256


def sized_inputs(ctx: TrainingContext, mem: StageMemory) -> tuple[int | float, ...]:
    """The sized inputs of a stage, in the symbols' order: tokens, batch, seq, the sized quantities
    (:data:`~vramlens.estimator.stage_memory.SIZED_QUANTITIES` but the logits) and the logits'."""
    logits = mem.logits
    found = (ctx.tokens, ctx.workload.batch, ctx.workload.seq, *[getattr(mem, name) for name in _SCALARS])
    if logits is None:
        return found
    return (*found, logits.forward_end, logits.kept, logits.backward_start, logits.outputs)


#: An event of a template: ``(bytes or symbolic bytes, key, stream)``, or ``(-1, key, 0)`` for a free.
Event = tuple["int | Linear", int, int]
#: A template's stretch of events: ``(events, 0)``, or ``(block, copies)`` for a run of copies.
Part = tuple[tuple[Event, ...], int]


class VocabularyTemplate:
    """A stage's vocabulary-sized requests with symbolic sizes (runs of identical blocks written
    once: :func:`runs`), the layers' gradient bytes that reuse their blocks, and the slack of every
    set of sized inputs replayed so far (shared with the templates whose requests are the same but
    for the copies of a run, where each replay tells for which counts its result holds)."""

    __slots__ = ("counts", "layer_gradients_bytes", "parts", "reads", "results")

    def __init__(self, parts: list[Part], layer_gradients_bytes: int, results: dict[object, _Result]) -> None:
        self.parts = parts
        self.counts = tuple(count for _, count in parts if count)
        self.layer_gradients_bytes = layer_gradients_bytes
        read = sorted(
            {
                index
                for events, _ in parts
                for size, _, _ in events
                if isinstance(size, Linear)
                for index, _ in size.terms
            }
        )
        names = [_INPUTS[index] for index in read]
        contexts = [name for name in names if not name.startswith("mem.")]
        memories = [name[4:] for name in names if name.startswith("mem.")]
        self.reads = (attrgetter(*contexts) if contexts else None, attrgetter(*memories) if memories else None)
        """Getters of the sized inputs the requests read, of the context and of the stage (the results' key)."""
        self.results = results

    def slack(self, ctx: TrainingContext, mem: StageMemory, settings: AllocatorSettings) -> int:
        """The replayed vocabulary slack (bytes, at least 0) of ``ctx`` and ``mem``'s sized inputs:
        ``max(0, replayed slack)`` of the requests they give."""
        of_context, of_stage = self.reads
        key = (of_context(ctx) if of_context else None, of_stage(mem) if of_stage else None)
        found = self.results.get(key)
        if found is not None and (found.counts == self.counts or found.holds_for(self.counts)):
            return found.slack_bytes
        if len(self.results) >= RESULT_LIMIT:
            self.results.clear()
        peaks, converged = repeated_peaks(self.requests(sized_inputs(ctx, mem)), settings)
        made = _Result(slack_bytes=max(0, peaks.slack_bytes), counts=self.counts, least=converged)
        self.results[key] = made
        return made.slack_bytes

    def requests(self, sizes: tuple[int | float, ...]) -> list[list[tuple[int, int, int]] | Repeat]:
        """The requests for ``sizes``, what :meth:`~vramlens.allocator.pattern.Pattern.alloc` records
        (a non-positive size allocates nothing, and its free is then ignored by the replay), each run
        as a :class:`~vramlens.allocator.pattern.Repeat`."""
        found: list[list[tuple[int, int, int]] | Repeat] = []
        for events, count in self.parts:
            made = _requests(events, sizes)
            found.append(Repeat(events=tuple(made), count=count) if count else made)
        return found


@dataclass(frozen=True, slots=True)
class _Result:
    """A replayed slack, the copies of each run it was replayed with, and from how many copies of
    each run on it holds (None: for that count only; :func:`~vramlens.allocator.replaying.repeated_peaks`)."""

    slack_bytes: int
    counts: tuple[int, ...]
    least: tuple[int | None, ...]

    def holds_for(self, counts: tuple[int, ...]) -> bool:
        return all(least is not None and count >= least for least, count in zip(self.least, counts, strict=True))


def _requests(events: tuple[Event, ...], sizes: tuple[int | float, ...]) -> list[tuple[int, int, int]]:
    found: list[tuple[int, int, int]] = []
    for size, key, stream in events:
        if type(size) is int:
            found.append((size, key, stream))
            continue
        value = size.evaluate(sizes)  # type: ignore[union-attr]
        if value > 0:
            found.append((int(value), key, stream))
    return found


def runs(events: list[Event]) -> list[Part]:
    """``events`` with every run of two or more identical consecutive blocks (each freeing all it
    allocates) written once with its count; the other events as stretches of count 0."""
    allocated = {key: index for index, (size, key, _) in enumerate(events) if not _is_free(size)}
    freed = {key: index for index, (size, key, _) in enumerate(events) if _is_free(size)}
    parts: list[Part] = []
    plain: list[Event] = []
    start = 0
    while start < len(events):
        length = next(
            (
                n
                for n in range(1, (len(events) - start) // 2 + 1)
                if _closed(events, start, n, allocated, freed) and _same(events, start, start + n, n, allocated)
            ),
            0,
        )
        if not length:
            plain.append(events[start])
            start += 1
            continue
        count = 2
        while start + (count + 1) * length <= len(events) and _same(
            events, start, start + count * length, length, allocated
        ):
            count += 1
        if plain:
            parts.append((tuple(plain), 0))
            plain = []
        parts.append((tuple(events[start : start + length]), count))
        start += count * length
    if plain:
        parts.append((tuple(plain), 0))
    return parts


def _is_free(size: int | Linear) -> bool:
    return type(size) is int and size < 0


def _closed(events: list[Event], start: int, n: int, allocated: dict[int, int], freed: dict[int, int]) -> bool:
    """``events[start:start + n]`` frees exactly the blocks it allocates."""
    end = start + n
    for size, key, _ in events[start:end]:
        index = allocated.get(key, -1) if _is_free(size) else freed.get(key, -1)
        if not start <= index < end:
            return False
    return True


def _same(events: list[Event], first: int, second: int, n: int, allocated: dict[int, int]) -> bool:
    """The blocks at ``first`` and ``second`` (``n`` events each) make the same requests."""
    for offset in range(n):
        (a, key_a, stream_a), (b, key_b, stream_b) = events[first + offset], events[second + offset]
        if _is_free(a) != _is_free(b) or stream_a != stream_b:
            return False
        if _is_free(a):
            if allocated[key_a] - first != allocated[key_b] - second:
                return False
        elif _shape(a) != _shape(b):
            return False
    return True


def _shape(size: int | Linear) -> object:
    """``size`` comparable (a symbolic size by its coefficients)."""
    return size if type(size) is int else (size.terms, size.constant)  # type: ignore[union-attr]


def vocabulary_template(
    ctx: TrainingContext,
    mem: StageMemory,
    targets: frozenset[str],
    micro_steps: int,
    settings: AllocatorSettings,
    shared: dict[object, dict[object, _Result]],
) -> VocabularyTemplate | None:
    """The stage's :class:`VocabularyTemplate`, or None where the requests read a size other than
    linearly (or the step is replayed whole). ``shared``: the results of earlier templates by their
    requests and allocator settings (templates with the same requests share them)."""
    from vramlens.estimator.reserved import layer_gradients, replays_whole_step, training_loss_script

    if ctx.spec.generic is not None or replays_whole_step(ctx):
        return None
    probe_ctx, probe_mem = _probes(ctx, mem)
    try:
        edges = step_shape(probe_ctx, probe_mem, targets, layers=False)
        if edges.gather_copy_out:
            return None
        loss = training_loss_script(probe_ctx, probe_mem, targets)
        events = step_pattern(edges, loss, layers=0, micro_steps=micro_steps).events
        gradients = layer_gradients(probe_ctx, probe_mem, edges)
    except Exception:  # a size read other than linearly (SizeDependent, or a TypeError from C code)
        return None
    if not isinstance(gradients, int):
        return None
    parts = runs(list(events))
    key = tuple((tuple((_shape(size), k, s) for size, k, s in stretch), bool(count)) for stretch, count in parts)
    if len(shared) >= TEMPLATE_LIMIT:
        shared.clear()
    return VocabularyTemplate(parts, gradients, shared.setdefault((key, settings), {}))


def _probes(ctx: TrainingContext, mem: StageMemory) -> tuple[TrainingContext, StageMemory]:
    """``ctx`` and ``mem`` with every sized input a symbol (in :func:`sized_inputs`' order) and the
    stage's terms, formulas and notes unavailable."""
    sizes = symbols(3 + len(_SCALARS) + (len(_LOGITS) if mem.logits is not None else 0))
    probe_ctx = sized_context(ctx, tokens=sizes[0], batch=sizes[1], seq=sizes[2])
    probe_mem = copy.copy(mem)
    for index, name in enumerate(_SCALARS, 3):
        setattr(probe_mem, name, sizes[index])
    if mem.logits is not None:
        start = 3 + len(_SCALARS)
        values = dict(zip(_LOGITS, sizes[start:], strict=True))
        probe_mem.logits = LogitsMemory(**values, formula=UNAVAILABLE)  # type: ignore[arg-type]
    for name in ("terms", "parts", "formulas", "notes"):
        setattr(probe_mem, name, UNAVAILABLE)
    return probe_ctx, probe_mem
