"""``@vramlens.profile_step``: every call of a training-step function runs under ``track``.

::

    @vramlens.profile_step
    def train_step(model, optimizer, batch): ...

    train_step(model, optimizer, batch)
    train_step.memory.peaks          # peak live bytes of the last steps (one by default)
    train_step.memory.last           # the last step's Timeline

The model(s), optimizer(s) and tensors among the call's arguments (top level, and inside
lists, tuples and mappings) are registered before each call (``model=``/``optimizer=``
replace what is found), so their bytes count from the start with their categories; phases
(forward, backward, optimizer_step) come from the tracker's hooks. Importing this module
does not import torch; calling a profiled step does (the [torch] extra).
"""

from __future__ import annotations

import functools
import itertools
import os
import types
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, overload

from vramlens.errors import InputError
from vramlens.result.timeline import Timeline
from vramlens.trace.timeline_io import save_timeline

__all__ = ["ProfiledStep", "StepMemory", "profile_step", "timeline_summary"]

P = ParamSpec("P")
R = TypeVar("R")
_MAX_DEPTH = 3
_MAX_ITEMS = 256  # per container: a dataset passed as an argument is not walked whole


class StepMemory:
    """What a profiled step keeps: the timelines and peaks of its last ``keep`` calls."""

    def __init__(self, keep: int) -> None:
        self.calls = 0
        """Calls so far (the next call's step number)."""
        self.files: list[Path] = []
        """The kept steps' timeline files on disk (with ``output``), oldest first."""
        self._kept: deque[tuple[int, Timeline]] = deque(maxlen=keep)

    @property
    def timelines(self) -> list[Timeline]:
        """The kept timelines, oldest first."""
        return [timeline for _, timeline in self._kept]

    @property
    def peaks(self) -> list[int]:
        """Peak live bytes of the kept steps, oldest first."""
        return [timeline.peak_bytes for _, timeline in self._kept]

    @property
    def steps(self) -> list[int]:
        """Step numbers (0-based call numbers) of the kept timelines."""
        return [step for step, _ in self._kept]

    @property
    def last(self) -> Timeline | None:
        """The latest call's timeline (None before the first call)."""
        return self._kept[-1][1] if self._kept else None

    def add(self, step: int, timeline: Timeline) -> None:
        """Keep one step's timeline (the oldest kept one goes when full)."""
        self._kept.append((step, timeline))


class ProfiledStep(Generic[P, R]):
    """A step function whose every call is tracked; see :func:`profile_step`."""

    def __init__(self, func: Callable[P, R], options: dict[str, Any]) -> None:
        functools.update_wrapper(self, func)
        self._func = func
        self._options = options
        self.memory = StepMemory(options["steps"])

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """Bind like a function when used as a method (``self.memory`` stays reachable)."""
        return self if instance is None else types.MethodType(self, instance)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the step under a tracker, then keep (and maybe save) its timeline."""
        from vramlens.categories import Category
        from vramlens.trace._cuda import tracker_for

        options = self._options
        models, optimizers, inputs = _found(args, kwargs)
        models = [options["model"]] if options["model"] is not None else models
        optimizers = [options["optimizer"]] if options["optimizer"] is not None else optimizers
        tracker = tracker_for(
            options["device"],
            models[0] if models else None,
            inputs,
            capture_stacks=options["capture_stacks"],
            allocator_events=options["allocator_events"],
        )
        for model in models:
            tracker.register_model(model)
        for optimizer in optimizers:
            tracker.register_optimizer(optimizer)
        tracker.register(inputs, Category.INPUTS)
        step, self.memory.calls = self.memory.calls, self.memory.calls + 1
        try:
            with tracker:
                return self._func(*args, **kwargs)
        finally:
            self._keep(step, tracker)

    def _keep(self, step: int, tracker: Any) -> None:
        """Build the step's timeline (also after an exception: an OOM's timeline is the useful one)."""
        metadata = {
            "source": "vramlens.profile_step",
            "function": getattr(self._func, "__qualname__", repr(self._func)),
            "step": step,
            "device": getattr(tracker, "device", "cpu"),
        }
        timeline = tracker.timeline(metadata=metadata)
        tracker.close()
        self.memory.add(step, timeline)
        output = self._options["output"]
        if output is not None:
            path = output_path(output, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.memory.files.append(save_timeline(timeline, path))
            while len(self.memory.files) > self._options["steps"]:  # the files follow the kept steps
                old = self.memory.files.pop(0)
                if old not in self.memory.files:
                    old.unlink(missing_ok=True)


@overload
def profile_step(func: Callable[P, R], /) -> ProfiledStep[P, R]: ...


@overload
def profile_step(
    func: None = None,
    /,
    *,
    steps: int = 1,
    device: Any = None,
    allocator_events: bool = False,
    output: str | os.PathLike[str] | None = None,
    model: Any = None,
    optimizer: Any = None,
    capture_stacks: bool = False,
) -> Callable[[Callable[P, R]], ProfiledStep[P, R]]: ...


def profile_step(
    func: Callable[P, R] | None = None,
    /,
    *,
    steps: int = 1,
    device: Any = None,
    allocator_events: bool = False,
    output: str | os.PathLike[str] | None = None,
    model: Any = None,
    optimizer: Any = None,
    capture_stacks: bool = False,
) -> ProfiledStep[P, R] | Callable[[Callable[P, R]], ProfiledStep[P, R]]:
    """Track every call of a training-step function (``@profile_step`` or ``@profile_step(...)``).

    Args:
        steps: how many of the latest calls' timelines the wrapper keeps
            (``step.memory.timelines`` / ``.peaks`` / ``.last``); older ones are dropped.
        device: as for :func:`vramlens.track` (None: the model's device).
        allocator_events: CPU: merge the CPU allocator's own calls (peak to the byte).
        output: save the kept steps' timelines (``.npz``): a directory (files
            ``vramlens-step{step}-rank{rank}.npz``) or a file name pattern with ``{step}``
            and/or ``{rank}`` (the torch.distributed rank, else ``$RANK``, else 0). As with
            the timelines in memory, only the last ``steps`` calls' files stay: a file this
            wrapper wrote is removed when its step drops out (``step.memory.files`` lists
            the ones on disk). A plain ``.npz`` file name is refused (every call would
            overwrite it): give a directory or a pattern.
        model, optimizer: register these instead of the ones found among the arguments.
        capture_stacks: record each allocation's Python stack.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps: {steps!r}; accepted: a whole number of steps to keep, 1 or more")
    if output is not None:
        text = os.fspath(output)
        if "{" not in text and text.lower().endswith(".npz"):
            raise InputError(
                f"output: {text!r} is one file and every call would overwrite it; give a directory or a pattern "
                "with {step} (e.g. 'memory/step{step}.npz')"
            )
        output_path(output, 0)  # a bad pattern fails here, not after the first step
    options = {
        "steps": steps,
        "device": device,
        "allocator_events": allocator_events,
        "output": output,
        "model": model,
        "optimizer": optimizer,
        "capture_stacks": capture_stacks,
    }

    def decorate(function: Callable[P, R]) -> ProfiledStep[P, R]:
        return ProfiledStep(function, options)

    return decorate if func is None else decorate(func)


def output_path(output: str | os.PathLike[str], step: int) -> Path:
    """Where step ``step``'s timeline goes: ``output`` formatted with ``step`` and ``rank`` if it
    has a ``{`` placeholder, else ``output/vramlens-step{step}-rank{rank}.npz``."""
    text, rank = os.fspath(output), _rank()
    if "{" not in text:
        return Path(text) / f"vramlens-step{step}-rank{rank}.npz"
    try:
        return Path(text.format(step=step, rank=rank))
    except (KeyError, IndexError, ValueError) as error:
        raise InputError(
            f"output: {text!r} is not a valid pattern ({error}); accepted: a directory, or a file name with {{step}} and/or {{rank}}"
        ) from None


def _rank() -> int:
    """This process's rank: torch.distributed's when initialised, else ``$RANK``, else 0."""
    import sys

    distributed = getattr(sys.modules.get("torch"), "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0


def _found(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """(modules, optimizers, tensors) among a call's arguments, each once, in order; searched
    at the top level and inside lists, tuples and mappings (3 levels deep, 256 items each)."""
    import torch

    found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    seen: set[int] = set()
    kinds = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)

    def visit(value: Any, depth: int) -> None:
        for position, kind in enumerate(kinds):
            if isinstance(value, kind):
                if id(value) not in seen:
                    seen.add(id(value))
                    found[position].append(value)
                return
        if depth < _MAX_DEPTH and isinstance(value, (list, tuple, Mapping)):
            items = value.values() if isinstance(value, Mapping) else value
            for item in itertools.islice(items, _MAX_ITEMS):
                visit(item, depth + 1)

    visit(list(args) + list(kwargs.values()), 0)
    return found


def timeline_summary(timeline: Timeline) -> dict[str, Any]:
    """A JSON-safe summary of a timeline: events, peak (bytes, event, phase), the breakdown by
    category at the peak, per-phase and per-module peaks, end bytes and the metadata."""
    index = timeline.peak_index
    phase = int(timeline.phase[index]) if index >= 0 else -1
    return {
        "events": len(timeline),
        "level": timeline.level,
        "peak_bytes": timeline.peak_bytes,
        "peak_index": index,
        "peak_phase": timeline.phases[phase] if phase >= 0 else None,
        "breakdown_at_peak": {str(category): nbytes for category, nbytes in timeline.breakdown_at(index).items()},
        "phase_peaks": timeline.phase_peaks(),
        "module_peaks": timeline.module_peaks(),
        "end_bytes": timeline.end_bytes,
        "metadata": timeline.metadata,
    }
