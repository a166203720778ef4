"""Exact tensor-memory tracking of real (or fake) PyTorch code (needs the [torch] extra).

"What was allocated" comes from a ``TorchDispatchMode`` that sees the outputs of every
operator that can allocate and notes each new storage once (views share their storage);
a weak reference to the storage notes its release. "Where am I" comes from hooks
(:mod:`vramlens.trace._context`): global module hooks give the innermost module,
optimizer hooks the optimizer step, the autograd engine's graph-task id the backward
pass. Each event lands in a :class:`~vramlens.result.timeline.Timeline` with its category,
phase and module (and, optionally, its Python stack).

Categories: registered tensors keep the category they were registered with (parameters,
buffers, optimizer state, inputs); tensors created in the forward pass are activations;
in the backward pass temporaries, except gradients (noticed by post-accumulate hooks on
registered parameters) and recomputed activations; in the optimizer step temporaries,
except the state the optimizer keeps (noticed after each step). The category of a
storage is decided per storage, so a gradient is a gradient from its allocation on.

This design was measured in ``docs/research/torch-cpu-probes.md`` (section 3): it matches
torch's own MemTracker to the byte and the CPU allocator's profiler events to within the
scalar tensors and type-promotion copies an operator makes inside itself (bytes to a few
hundred KiB, never more than the allocator) at about 4-15%
overhead. Known limits: memory allocated outside dispatch (C++ extensions allocating
internally, ``resize_`` of an untyped storage) is not seen, and compiled graphs run
eagerly under a dispatch mode, so a compiled model's fused savings are invisible
(measure those with the allocator instead).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.trace._allocator import AllocatorRecorder, merge_allocator_events
from vramlens.trace._context import RunContext, optimizer_state_tensors
from vramlens.trace._subclass import is_wrapper, plain_tensors, watch_resizes

__all__ = ["Mark", "MemoryTracker", "StorageTracker", "track"]

torch = require("torch", purpose="vramlens' tensor tracker")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

_CODE = {category: index for index, category in enumerate(CATEGORY_ORDER)}


@dataclass(slots=True)
class Mark:
    """A named instant: live bytes when it was set, and the peak since the previous mark."""

    name: str
    live_bytes: int
    peak_since_previous: int


class MemoryTracker(TorchDispatchMode):
    """Record every storage allocated and freed under ``with tracker:`` into a Timeline.

    Register what exists before tracking starts (``register_model``, ``register_optimizer``,
    ``register``): its bytes then count from the start, with their category, and its frees
    are seen. Storages made before tracking and not registered are ignored. ``peak`` and
    ``current`` are live tensor bytes; ``timeline()`` returns the events so far.

    Args:
        capture_stacks: record the Python stack of each allocation (slower).
        clock: ``"ns"`` stamps events with nanoseconds since the tracker was made;
            ``"event"`` with their sequence number (used by the simulator).
        allocator_events: also record the CPU allocator's own calls (torch's profiler with
            ``profile_memory``) and merge them in when the ``with`` block ends: allocations
            made inside operators appear as ``temporary`` and ``peak``/``timeline()`` equal
            the allocator's to the byte (:mod:`vramlens.trace._allocator`). Real CPU tensors
            only; slower; needs ``clock="ns"``. ``current``, ``mark`` and ``reset_peak`` still
            count what the dispatch mode sees.
    """

    def __init__(self, *, capture_stacks: bool = False, clock: str = "ns", allocator_events: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if clock not in ("ns", "event"):
            raise ValueError(f"clock: {clock!r}; accepted: ns, event")
        if allocator_events and clock != "ns":
            raise ValueError("allocator_events: needs clock='ns' (the allocator stamps events in time)")
        self.capture_stacks = capture_stacks
        self.marks: list[Mark] = []
        self._events = TimelineBuilder(time_unit=clock)
        self._context = RunContext(self._events, self._recategorize)
        # The clock: the allocator's profiler stamps with the system clock, so that one
        # is read when its events are merged; otherwise the steadier performance counter.
        self._clock = time.time_ns if allocator_events else time.perf_counter_ns
        self._start_ns = self._clock()
        self._recorder = AllocatorRecorder() if allocator_events else None
        self._pointers: dict[int, int] = {}  # storage serial -> data pointer (allocator_events only)
        self._live: dict[int, tuple[int, int, weakref.ref[Any]]] = {}
        self._serial_category: list[int] = []
        self._serial_stream: dict[int, int] = {}  # storage serial -> stream, when not the default one
        self.stream = 0
        """The stream new storages are allocated on (:class:`vramlens.allocator.streams.Stream`; the
        simulator sets it where the real code enters a collective's stream)."""
        self._current = self._peak = self._window_peak = 0
        self._active = True
        self._paused = False

    # -- live totals -------------------------------------------------------------------
    @property
    def current(self) -> int:
        """Live tensor bytes now."""
        return self._current

    @property
    def peak(self) -> int:
        """Highest live total since tracking began (or since :meth:`reset_peak`); with
        ``allocator_events``, after the block, the merged timeline's peak."""
        if self._recorder is not None and self._recorder.events:
            return self.timeline().peak_bytes
        return self._peak

    @property
    def event_count(self) -> int:
        """Events recorded so far (the index the next event will get)."""
        return len(self._events)

    def reset_peak(self) -> None:
        """Start a new peak measurement from the current live total."""
        self._peak = self._window_peak = self._current

    def mark(self, name: str) -> Mark:
        """Record a named instant and the peak reached since the previous mark."""
        mark = Mark(name=name, live_bytes=self._current, peak_since_previous=self._window_peak)
        self._window_peak = self._current
        self.marks.append(mark)
        return mark

    # -- registration ------------------------------------------------------------------
    def register(self, tensors: Any, category: Category | str | None = None) -> None:
        """Account for storages that already exist. Without a category, parameters count
        as ``parameters`` and other tensors as ``inputs``."""
        flat, _ = tree_flatten(tensors)
        for item in flat:
            if isinstance(item, torch.Tensor):
                chosen = Category(category) if category is not None else _default_category(item)
                self._track(item, chosen, phase=self._context.code("load"))

    def register_model(self, model: Any, *, name: str = "") -> None:
        """Register a module's parameters, buffers and existing gradients, learn its module
        names (for "where am I") and watch its trainable parameters' gradients."""
        self._context.name_modules(model, name)
        for parameter in model.parameters():
            self.register(parameter, Category.PARAMETERS)
            if parameter.grad is not None:
                self.register(parameter.grad, Category.GRADIENTS)
        self.register(list(model.buffers()), Category.BUFFERS)
        self._context.watch_gradients(model)

    def register_optimizer(self, optimizer: Any) -> None:
        """Register an optimizer's existing state (moments, step counters)."""
        self.register(optimizer_state_tensors(optimizer), Category.OPTIMIZER_STATE)

    def set_category(self, tensors: Any, category: Category | str) -> None:
        """Re-label live storages (e.g. a KV cache) for their whole lifetime."""
        flat, _ = tree_flatten(tensors)
        self._recategorize([item for item in flat if isinstance(item, torch.Tensor)], Category(category))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute everything inside the block to phase ``name`` (overrides automatic phases)."""
        with self._context.explicit_phase(name):
            yield

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run code without recording its allocations (frees of tracked storages still count)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    # -- results -----------------------------------------------------------------------
    def timeline(self, metadata: dict[str, Any] | None = None) -> Timeline:
        """The events recorded so far, with each storage's final category."""
        timeline = self._tracked_timeline(metadata)
        if self._recorder is not None and self._recorder.events:
            return merge_allocator_events(timeline, self._pointers, self._start_ns, self._recorder.events)
        return timeline

    def elapsed(self) -> int:
        """Now, on the timeline's clock: ns since the tracker was made (``clock="ns"``) or the
        number of events so far (``clock="event"``)."""
        return len(self._events) if self._events.time_unit == "event" else self._clock() - self._start_ns

    def _tracked_timeline(self, metadata: dict[str, Any] | None) -> Timeline:
        """The dispatch mode's own events (no allocator events merged), each storage with its final category."""
        import dataclasses

        import numpy as np

        timeline = self._events.build(metadata=metadata)
        if len(timeline):
            table = np.array(self._serial_category, dtype=np.int8)
            timeline = dataclasses.replace(timeline, category=table[timeline.storage])
        if len(timeline) and self._serial_stream:
            streams = np.zeros(len(self._serial_category), dtype=np.int8)
            streams[list(self._serial_stream)] = list(self._serial_stream.values())
            timeline = dataclasses.replace(timeline, stream=streams[timeline.storage])
        return timeline

    # -- dispatch mode -----------------------------------------------------------------
    def __enter__(self) -> MemoryTracker:
        self._context.install()
        self._resizes = watch_resizes(self._resized)  # storage resizes bypass dispatch (FSDP2)
        if self._recorder is not None:
            self._recorder.start()
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        if self._recorder is not None:
            self._recorder.stop()
        self._resizes.remove()
        self._context.uninstall()

    def close(self) -> None:
        """Stop recording for good: drop the weak references to storages still alive. Leaving a
        ``with`` block does not close (the tracker can be entered again); ``track()`` and the
        simulator close when they are done."""
        self._active = False
        self._live.clear()  # the weak references go, and their callbacks with them

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._paused or not _may_allocate(func):
            return out
        if isinstance(out, torch.Tensor):
            self._track(out, None)
        else:
            flat, _ = tree_flatten(out)
            for item in flat:
                if isinstance(item, torch.Tensor):
                    self._track(item, None)
        return out

    def _track(self, tensor: Any, category: Category | None, phase: int | None = None) -> None:
        if tensor.is_meta:
            return
        if is_wrapper(tensor):  # DTensor & co: the local tensors inside hold the memory
            for inner in plain_tensors([tensor]):
                self._track(inner, category, phase)
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        size = storage.nbytes()
        serial = len(self._serial_category)
        code = _CODE[category] if category is not None else self._context.new_category()
        self._serial_category.append(code)
        if self.stream:
            self._serial_stream[serial] = self.stream
        if self._recorder is not None:
            self._pointers[serial] = storage.data_ptr()
        # A weak reference whose callback runs when the storage is freed (cheaper than weakref.finalize).
        reference = weakref.ref(storage, self._releaser(key))
        self._live[key] = (serial, size, reference)
        self._record(size, code, serial, phase)
        self._current += size
        if self._current > self._window_peak:
            self._window_peak = self._current
            self._peak = max(self._peak, self._current)

    def _releaser(self, key: int) -> Callable[[Any], None]:
        """The weak-reference callback that notes the release of storage ``key``."""

        def released(_: Any) -> None:
            self._release(key)

        return released

    def _release(self, key: int) -> None:
        serial, size, _ = self._live.pop(key, (0, 0, None))
        if not size or not self._active:
            return
        self._record(-size, self._serial_category[serial], serial, None)
        self._current -= size

    def _resized(self, storage: Any, before: int, after: int) -> None:
        """A tracked storage resized in place (``UntypedStorage.resize_``, outside dispatch; FSDP2
        frees and re-allocates unsharded parameters so): its bytes now are allocated under a new
        serial with the same category (the caching allocator hands out a new block), then the
        old ones are freed. Untracked storages are ignored."""
        found = self._live.get(id(storage))
        if found is None or not self._active or before == after:
            return
        old, size, reference = found
        code, serial = self._serial_category[old], old
        if after:
            serial = len(self._serial_category)
            self._serial_category.append(code)
            if self.stream:
                self._serial_stream[serial] = self.stream
            if self._recorder is not None:
                self._pointers[serial] = storage.data_ptr()
            self._record(after, code, serial, None)
            self._current += after
            self._window_peak = max(self._window_peak, self._current)
            self._peak = max(self._peak, self._current)
        if size:
            self._record(-size, code, old, None)
            self._current -= size
        self._live[id(storage)] = (serial, after, reference)

    def _record(self, nbytes: int, code: int, serial: int, phase: int | None) -> None:
        events = self._events
        stamp = len(events) if events.time_unit == "event" else self._clock() - self._start_ns
        context = self._context
        now, module = context.where()
        stack = context.stack_code() if self.capture_stacks and nbytes > 0 else -1
        events.append(stamp, nbytes, code, serial, now if phase is None else phase, module, stack)

    def _recategorize(self, tensors: list[Any], category: Category) -> None:
        code = _CODE[category]
        for tensor in plain_tensors(tensors):
            found = self._live.get(id(tensor.untyped_storage()))
            if found is not None:
                self._serial_category[found[0]] = code


#: The name used before the Timeline existed; same class.
StorageTracker = MemoryTracker


#: Per operator: whether it can return a new storage (cached; operators are singletons).
_ALLOCATES: dict[Any, bool] = {}
#: Operators that return their input but may show a storage for the first time:
#: ``lift_fresh`` hands dispatch modes the tensors ``torch.tensor(...)`` builds outside
#: dispatch; ``set_``/``resize_`` can swap or grow a storage.
_FIRST_SIGHTINGS = ("lift_fresh", "lift", "set_", "resize_", "resize_as_")


def _may_allocate(func: Any) -> bool:
    """Whether ``func`` can return a storage not among its inputs: some return of its schema
    has no alias annotation. Views, in-place and ``out=`` operators return their inputs'
    storages (skipping them saves the per-output storage lookup), except those in
    :data:`_FIRST_SIGHTINGS`."""
    found = _ALLOCATES.get(func)
    if found is None:
        schema = func._schema
        fresh = any(returned.alias_info is None for returned in schema.returns)
        found = _ALLOCATES[func] = fresh or schema.name.split("::")[-1] in _FIRST_SIGHTINGS
    return found


def _default_category(tensor: Any) -> Category:
    return Category.PARAMETERS if isinstance(tensor, torch.nn.Parameter) else Category.INPUTS


@contextmanager
def track(
    model: Any = None,
    optimizer: Any = None,
    inputs: Any = None,
    *,
    device: Any = None,
    capture_stacks: bool = False,
    allocator_events: bool = False,
) -> Iterator[MemoryTracker]:
    """Track the tensor memory of real PyTorch code: ``with vramlens.track(model, opt) as t: ...``.

    ``model``, ``optimizer`` and ``inputs`` (any of them optional) are registered before
    tracking starts. After the block, ``t.timeline()`` has every event, ``t.peak`` the
    highest live tensor bytes. ``allocator_events=True`` adds the CPU allocator's own calls,
    so the peak is the allocator's to the byte (see :class:`MemoryTracker`). ``device``
    (None: the model's, else the inputs', else cpu) picks the tracker: ``"cuda"``/``"cuda:N"``
    adds the CUDA caching allocator's memory history (:mod:`vramlens.trace._cuda`).
    """
    from vramlens.trace._cuda import tracker_for

    tracker = tracker_for(device, model, inputs, capture_stacks=capture_stacks, allocator_events=allocator_events)
    if model is not None:
        tracker.register_model(model)
    if optimizer is not None:
        tracker.register_optimizer(optimizer)
    if inputs is not None:
        tracker.register(inputs, Category.INPUTS)
    try:
        with tracker:
            yield tracker
    finally:
        tracker.close()
