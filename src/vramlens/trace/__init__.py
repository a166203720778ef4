"""Tensor-level memory timelines: the columnar :class:`Timeline` (numpy only) and the tracker
of real or fake PyTorch runs (``track``; imports torch when called)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.trace.ranks import save_ranks
from vramlens.trace.timeline_io import load_timeline, save_timeline

if TYPE_CHECKING:
    from vramlens.trace.tracker import MemoryTracker

__all__ = ["CATEGORY_ORDER", "Timeline", "TimelineBuilder", "load_timeline", "save_ranks", "save_timeline", "track"]


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
    """Track the tensor memory of real PyTorch code (needs the [torch] extra)::

        with vramlens.track(model, optimizer, inputs) as t:
            loss = model(inputs).loss; loss.backward(); optimizer.step()
        t.timeline().peak_bytes

    ``model``, ``optimizer`` and ``inputs`` are registered before tracking starts.
    ``device``: None (the model's device, else the inputs', else cpu), ``"cpu"``, or
    ``"cuda"``/``"cuda:N"``: the same tracker plus the CUDA caching allocator's memory
    history, merged in (``t.snapshot``/``t.save_snapshot(path)`` keep the raw snapshot;
    untested on a real GPU). Other devices raise :class:`~vramlens.errors.InputError`.
    ``allocator_events=True`` (CPU) merges the CPU allocator's own calls, so the peak is
    the allocator's to the byte. ``capture_stacks=True`` records each allocation's stack.
    """
    from vramlens.trace.tracker import track as _track

    with _track(
        model, optimizer, inputs, device=device, capture_stacks=capture_stacks, allocator_events=allocator_events
    ) as tracker:
        yield tracker
