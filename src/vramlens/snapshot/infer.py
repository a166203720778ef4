"""Categories for timelines without them (foreign snapshots), from stacks, phases and lifetimes.

A snapshot recorded without vramlens knows, per allocation, its size, its lifetime and (when
recorded) its Python stack; sometimes phases from ``record_function`` annotations. Prior art:
torch's ``torch/profiler/_memory_profiler.py`` labels tensors from the op tree and a data-flow
graph (``AccumulateGrad`` children are gradients, ``optimizer.state`` is optimizer state,
what the forward produces and the backward consumes are activations); it needs shapes, op
names and tensor identities that a snapshot lacks. This module keeps its ideas but works from
what a snapshot has, in three steps:

1. **Stack labels** (:func:`stack_label`): each allocation's stack says what ran, read from
   the innermost frame outwards, the first frame that says something wins: frames in an
   optimizer (``/optim/`` or ``/optimizers/`` paths, ``_multi_tensor_*``, ``_fused_*``,
   ``_single_tensor_*``) -> optimizer; the autograd engine (``backward``,
   ``_engine_run_backward``, ``torch.autograd.grad``, C++ ``autograd::Engine`` /
   ``autograd::generated`` frames) -> backward; model construction and loading (``__init__``,
   ``_apply``/``to``/``cuda``, ``load_state_dict``, ``from_pretrained``, ``reset_parameters``)
   -> load; ``torch/nn/modules``, ``torch/nn/functional.py`` or a ``forward`` frame -> forward.
   A stack that names ``AccumulateGrad`` is a gradient, one inside activation-checkpoint
   recomputation (``torch/utils/checkpoint.py``) a recomputed activation, wherever they sit.
   An allocation with no Python frames at all is made by the autograd engine's device thread
   (CUDA runs the backward there, so a real snapshot's backward allocations have no Python
   frames; pytorch/pytorch#124784), unless the timeline has no stacks at all.
2. **Stages** (:func:`event_stages`): a state machine over the events turns labels into
   stretches (pre, load, forward, backward, optimizer, gap): an unlabelled stack keeps the
   stage (a loss computed in user code after the model's forward is still forward), except
   after an optimizer step or loading, where user code starts a gap; a frame-less allocation continues a
   forward or backward as backward. A recorded phase whose name says forward / backward /
   optimizer / load (``optimizer_step``, ``Optimizer.step#AdamW.step``, ``## backward ##``)
   overrides the machine for its events. Frees take the stage they happen in.
3. **Rules** (:func:`infer_categories`), per allocation, in order (the first that applies):
   ``preexisting`` (freed but never allocated in the trace) -> other;
   ``optimizer_temporary`` / ``optimizer_state``: allocated in an optimizer stage and freed in
   the same stretch -> temporary, else (it outlives the step) -> optimizer state;
   ``accumulate_grad`` and ``recomputed_activation`` from the stack labels;
   ``backward_temporary`` / ``gradient``: allocated in backward and freed there -> temporary,
   else (it outlives the backward, until the optimizer step or ``zero_grad``) -> gradients;
   ``forward_temporary`` / ``activation`` / ``forward_output``: allocated in a forward and freed
   in it -> temporary; else, when a backward follows -> activations; else other;
   ``parameters``: allocated before the first step (pre or load stage) and never freed;
   ``input``: allocated outside the step (pre or gap) and alive across the start of a forward
   (the last batch of a trace may be alive at its end); ``temporary``: freed in the stretch that allocated it; ``other`` otherwise.

Storages that already carry a category other than ``other`` keep it (rule ``recorded``), so a
snapshot partly tagged by vramlens (its backward thread untagged) is completed, not overwritten.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline

__all__ = ["Label", "Stage", "event_labels", "event_stages", "infer_categories", "phase_stage", "stack_label"]


class Label:
    """What one allocation's stack says (int codes, small for numpy)."""

    NONE, EMPTY, UNKNOWN, FORWARD, BACKWARD, OPTIMIZER, LOAD, RECOMPUTE, ACCUMULATE = range(9)


class Stage:
    """Stretches of a run, as :func:`event_stages` assigns them."""

    PRE, LOAD, FORWARD, BACKWARD, OPTIMIZER, GAP = range(6)


_LOAD_NAMES = frozenset(
    {
        "__init__",
        "_apply",
        "to",
        "cuda",
        "load_state_dict",
        "_load_from_state_dict",
        "from_pretrained",
        "reset_parameters",
        "_init_weights",
        "init_weights",
        "load_checkpoint",
    }
)
_BACKWARD_NAMES = frozenset({"backward", "_engine_run_backward", "run_backward", "_make_grads", "grad"})
_BACKWARD_CPP = ("autograd::Engine", "evaluate_function", "autograd::generated::")
_OPTIMIZER_PREFIXES = ("_multi_tensor_", "_fused_", "_single_tensor_")
_RECOMPUTE_NAMES = frozenset({"unpack_hook", "recompute_fn", "backward", "unpack"})
_CODES = {category: CATEGORY_ORDER.index(category) for category in Category}


def stack_label(stack: str) -> int:
    """The :class:`Label` of a stack string (frames ``"file:line in name"``, outermost first)."""
    if not stack:
        return Label.EMPTY
    frames = [_split_frame(text) for text in stack.split("\n")]
    if any("AccumulateGrad" in name for _, name in frames):
        return Label.ACCUMULATE
    if any(path.endswith("torch/utils/checkpoint.py") and name in _RECOMPUTE_NAMES for path, name in frames):
        return Label.RECOMPUTE
    for path, name in reversed(frames):
        label = _frame_label(path, name)
        if label != Label.UNKNOWN:
            return label
    return Label.UNKNOWN


def _split_frame(text: str) -> tuple[str, str]:
    """``(path, function name)`` of one frame line; C++ frames may have no path."""
    head, _, name = text.rpartition(" in ")
    if not head:
        return "", text
    return head.rpartition(":")[0].replace("\\", "/"), name


def _frame_label(path: str, name: str) -> int:
    """What a single frame says, UNKNOWN when it says nothing (user code, torch internals)."""
    if name == "zero_grad" or "lr_scheduler" in path:
        return Label.UNKNOWN
    if "/optim/" in path or "/optimizers/" in path or name.startswith(_OPTIMIZER_PREFIXES):
        return Label.OPTIMIZER
    if name in _BACKWARD_NAMES and ("/autograd/" in path or name == "backward" or path.endswith("torch/_tensor.py")):
        return Label.BACKWARD
    if any(marker in name for marker in _BACKWARD_CPP):
        return Label.BACKWARD
    if name in _LOAD_NAMES:
        return Label.LOAD
    if "/torch/nn/modules/" in path or path.endswith("torch/nn/functional.py") or name == "forward":
        return Label.FORWARD
    return Label.UNKNOWN


def phase_stage(name: str) -> int:
    """The :class:`Stage` a recorded phase name stands for, -1 when it says none."""
    lower = name.lower()
    if "zero_grad" in lower:
        return Stage.GAP
    if "backward" in lower:
        return Stage.BACKWARD
    if "optim" in lower:
        return Stage.OPTIMIZER
    if "forward" in lower or lower in ("prefill", "decode"):
        return Stage.FORWARD
    if lower in ("load", "setup", "init"):
        return Stage.LOAD
    return -1


def event_labels(timeline: Timeline) -> npt.NDArray[np.int8]:
    """:class:`Label` of each event: allocations by their stack (no stack: EMPTY, or NONE when
    the timeline has no stacks at all), frees NONE."""
    table = np.array([stack_label(stack) for stack in timeline.stacks] + [Label.EMPTY], dtype=np.int8)
    recorded = (table != Label.EMPTY)[timeline.stack[timeline.nbytes > 0]]  # -1 picks the trailing EMPTY
    if not recorded.any():  # no allocation has a frame: the snapshot was recorded without stacks
        return np.full(len(timeline), Label.NONE, dtype=np.int8)
    labels = table[timeline.stack]  # stack -1 picks the trailing EMPTY
    labels[timeline.nbytes <= 0] = Label.NONE
    return labels


def event_stages(timeline: Timeline, labels: npt.NDArray[np.int8]) -> npt.NDArray[np.int8]:
    """:class:`Stage` of each event: the state machine over ``labels``, overridden by phases."""
    machine = np.empty(len(timeline), dtype=np.int8)
    state = Stage.PRE
    moves = {
        Label.FORWARD: Stage.FORWARD,
        Label.BACKWARD: Stage.BACKWARD,
        Label.ACCUMULATE: Stage.BACKWARD,
        Label.RECOMPUTE: Stage.BACKWARD,
        Label.OPTIMIZER: Stage.OPTIMIZER,
        Label.LOAD: Stage.LOAD,
    }
    for index, label in enumerate(labels.tolist()):
        moved = moves.get(label)
        if moved is not None:
            state = moved
        elif label == Label.UNKNOWN and state in (Stage.OPTIMIZER, Stage.LOAD):
            state = Stage.GAP
        elif label == Label.EMPTY and state in (Stage.FORWARD, Stage.BACKWARD):
            state = Stage.BACKWARD
        machine[index] = state
    table = np.array([phase_stage(name) for name in timeline.phases] + [-1], dtype=np.int8)
    recorded = table[timeline.phase]
    return np.where(recorded >= 0, recorded, machine).astype(np.int8)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Lifetimes:
    """Per storage (index into ``ids``): its allocation and free event (-1: none)."""

    ids: npt.NDArray[np.int64]
    per_event: npt.NDArray[np.int64]
    alloc: npt.NDArray[np.int64]
    free: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.int64]


def _lifetimes(timeline: Timeline) -> _Lifetimes:
    """First allocation and first free event of every storage (vectorised)."""
    ids, per_event = np.unique(timeline.storage, return_inverse=True)
    alloc = np.full(len(ids), -1, dtype=np.int64)
    free = np.full(len(ids), -1, dtype=np.int64)
    for target, mask in ((alloc, timeline.nbytes > 0), (free, timeline.nbytes < 0)):
        events = np.flatnonzero(mask)[::-1]  # reversed, so the first event of a storage is written last
        target[per_event[events]] = events
    sizes = np.zeros(len(ids), dtype=np.int64)
    sizes[per_event[::-1]] = np.abs(timeline.nbytes[::-1])
    return _Lifetimes(ids=ids, per_event=per_event.astype(np.int64), alloc=alloc, free=free, nbytes=sizes)


def infer_categories(timeline: Timeline) -> Timeline:
    """A copy of ``timeline`` with categories inferred from stacks, phases and lifetimes.

    ``metadata["categories"]`` becomes ``"inferred"`` and ``metadata["inferred_rules"]`` maps
    each rule (module docstring) to ``{"allocations": n, "bytes": b}`` (b: bytes allocated by the
    storages it labelled). Storages already labelled other than ``other`` keep their category.
    """
    if not isinstance(timeline, Timeline):
        raise InputError(f"timeline: expected a vramlens Timeline, got {type(timeline).__name__}")
    life = _lifetimes(timeline)
    labels = event_labels(timeline)
    stages = event_stages(timeline, labels)
    rules, codes = _apply_rules(timeline, life, labels, stages)
    category = codes[life.per_event].astype(np.int8)
    metadata: dict[str, Any] = {**timeline.metadata, "categories": "inferred", "inferred_rules": rules}
    return dataclasses.replace(timeline, category=category, metadata=metadata)


def _apply_rules(
    timeline: Timeline, life: _Lifetimes, labels: npt.NDArray[np.int8], stages: npt.NDArray[np.int8]
) -> tuple[dict[str, dict[str, int]], npt.NDArray[np.int8]]:
    """The category code of each storage and the per-rule counts (rules in order, first wins)."""
    count = len(life.ids)
    spans = np.concatenate(([0], np.cumsum(stages[1:] != stages[:-1])))  # stretch number of each event
    allocated, freed = life.alloc >= 0, life.free >= 0
    at = np.where(allocated, life.alloc, 0)
    stage = np.where(allocated, stages[at], -1)
    label = np.where(allocated, labels[at], Label.NONE)
    same = freed & allocated & (spans[np.where(freed, life.free, 0)] == spans[at])
    later_backward = at < _last_index(stages, Stage.BACKWARD)
    across_forward = _next_index(stages, Stage.FORWARD)[at] < np.where(freed, life.free, len(stages))
    current = timeline.category[np.where(allocated, life.alloc, np.maximum(life.free, 0))]
    informed = bool(np.any(stages != Stage.PRE))  # else nothing tells one stretch from another
    before_step = (stage == Stage.LOAD) | ((stage == Stage.PRE) & informed)
    outside = (stage == Stage.PRE) | (stage == Stage.GAP)
    rules: list[tuple[str, npt.NDArray[np.bool_], Category]] = [
        ("recorded", current != _CODES[Category.OTHER], Category.OTHER),
        ("preexisting", ~allocated, Category.OTHER),
        ("optimizer_temporary", (stage == Stage.OPTIMIZER) & same, Category.TEMPORARY),
        ("optimizer_state", stage == Stage.OPTIMIZER, Category.OPTIMIZER_STATE),
        ("accumulate_grad", label == Label.ACCUMULATE, Category.GRADIENTS),
        ("recomputed_activation", label == Label.RECOMPUTE, Category.ACTIVATIONS),
        ("backward_temporary", (stage == Stage.BACKWARD) & same, Category.TEMPORARY),
        ("gradient", stage == Stage.BACKWARD, Category.GRADIENTS),
        ("forward_temporary", (stage == Stage.FORWARD) & same, Category.TEMPORARY),
        ("activation", (stage == Stage.FORWARD) & later_backward, Category.ACTIVATIONS),
        ("forward_output", stage == Stage.FORWARD, Category.OTHER),
        ("parameters", before_step & ~freed, Category.PARAMETERS),
        ("input", outside & ~same & across_forward & (freed | (stage == Stage.GAP)), Category.INPUTS),
        ("temporary", same & informed, Category.TEMPORARY),
        ("other", np.ones(count, dtype=bool), Category.OTHER),
    ]
    codes = np.full(count, _CODES[Category.OTHER], dtype=np.int8)
    open_ = np.ones(count, dtype=bool)
    counts: dict[str, dict[str, int]] = {}
    for name, condition, category in rules:
        hit = open_ & condition
        open_ &= ~hit
        codes[hit] = current[hit] if name == "recorded" else _CODES[category]
        if hit.any():
            counts[name] = {"allocations": int(hit.sum()), "bytes": int(life.nbytes[hit].sum())}
    return counts, codes


def _last_index(stages: npt.NDArray[np.int8], stage: int) -> int:
    """Index of the last event in ``stage`` (-1: none)."""
    found = np.flatnonzero(stages == stage)
    return int(found[-1]) if len(found) else -1


def _next_index(stages: npt.NDArray[np.int8], stage: int) -> npt.NDArray[np.int64]:
    """For each event, the index of the first event at or after it in ``stage`` (len: none);
    one extra trailing entry so that index ``len`` is valid."""
    count = len(stages)
    positions = np.where(stages == stage, np.arange(count), count).astype(np.int64)
    following = np.minimum.accumulate(positions[::-1])[::-1]
    return np.append(following, count)
