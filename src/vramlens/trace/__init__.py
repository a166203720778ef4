"""Tensor-level memory timelines: the columnar :class:`Timeline` (numpy only) and the tracker
of real or fake PyTorch runs (``track``; imports torch when called)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from vramlens.trace.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.trace.timeline_io import load_timeline, save_timeline

if TYPE_CHECKING:
    from vramlens.trace.tracker import MemoryTracker

__all__ = ["CATEGORY_ORDER", "Timeline", "TimelineBuilder", "load_timeline", "save_timeline", "track"]


@contextmanager
def track(
    model: Any = None, optimizer: Any = None, inputs: Any = None, *, capture_stacks: bool = False
) -> Iterator[MemoryTracker]:
    """Track the tensor memory of real PyTorch code (needs the [torch] extra)::

        with vramlens.track(model, optimizer, inputs) as t:
            loss = model(inputs).loss; loss.backward(); optimizer.step()
        t.timeline().peak_bytes

    ``model``, ``optimizer`` and ``inputs`` are registered before tracking starts.
    """
    from vramlens.trace.tracker import track as _track

    with _track(model, optimizer, inputs, capture_stacks=capture_stacks) as tracker:
        yield tracker
