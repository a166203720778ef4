"""``MemoryCallback``: track N training steps of a ``transformers.Trainer`` (needs the [hf] extra).

::

    from vramlens.integrations.hf import MemoryCallback

    trainer = Trainer(..., callbacks=[MemoryCallback(steps=2, start_step=1)])
    trainer.train()   # writes vramlens-memory-rank{r}.npz and .json to args.output_dir

The callback enters a tracker (``vramlens.track``: the dispatch-mode tracker, plus the
CUDA memory history on a GPU) at ``on_step_begin`` of global steps ``[start_step,
start_step + steps)`` and leaves it at their ``on_step_end`` (after the optimizer step and
``zero_grad``), registering the model and optimizer the Trainer passes to callbacks. Then
every rank (``args.process_index``) writes its own files, which ``vramlens view`` merges:

* ``vramlens-memory-rank{r}.npz``: the timeline of the tracked steps (``save_timeline``);
* ``vramlens-memory-rank{r}.json``: a summary (peak, breakdown at the peak, per-phase and
  per-step peaks), see :func:`vramlens.trace.profile.timeline_summary`.

Step 0 creates AdamW's state inside its optimizer step, so ``start_step=1`` (the default)
is the first step whose forward and backward run with the state already resident. The
batch was made before ``on_step_begin`` and is not registered, so its few bytes are not
counted. A step that raises leaves the tracker entered: call :meth:`MemoryCallback.close`.
Importing this module imports transformers (and torch).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from vramlens._extras import require
from vramlens.errors import InputError
from vramlens.result.timeline import Timeline
from vramlens.trace.profile import timeline_summary
from vramlens.trace.timeline_io import save_timeline

transformers = require("transformers", purpose="vramlens.integrations.hf.MemoryCallback")
_TrainerCallback: Any = transformers.TrainerCallback

__all__ = ["MemoryCallback", "step_peaks"]


class MemoryCallback(_TrainerCallback):  # type: ignore[misc]
    """Track global steps ``[start_step, start_step + steps)`` and write one timeline and one
    JSON summary per rank to ``output_dir`` (default: the Trainer's ``args.output_dir``).

    Args:
        steps: how many optimizer steps to track (1 or more).
        start_step: the first tracked step (``state.global_step`` when it begins; 0-based).
        output_dir: where the files go.
        allocator_events: CPU runs: merge the CPU allocator's own calls (peak to the byte).
        device: as for :func:`vramlens.track` (None: the model's device).
        capture_stacks: record each allocation's Python stack.
    """

    def __init__(
        self,
        steps: int = 1,
        start_step: int = 1,
        output_dir: str | Path | None = None,
        *,
        allocator_events: bool = False,
        device: Any = None,
        capture_stacks: bool = False,
    ) -> None:
        for name, value, least in (("steps", steps, 1), ("start_step", start_step, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(f"{name}: {value!r}; accepted: a whole number, {least} or more")
        self.steps, self.start_step, self.output_dir = steps, start_step, output_dir
        self._options = {"allocator_events": allocator_events, "capture_stacks": capture_stacks}
        self._device = device
        self._tracker: Any = None
        self._open: tuple[int, int] | None = None  # (global step, start time) of the step being tracked
        self._windows: list[tuple[int, int, int]] = []  # (global step, start, end) on the timeline's clock
        self.files: list[Path] = []
        """The files written (timeline, then summary); empty until the window is done."""
        self.summary: dict[str, Any] | None = None
        """The JSON summary written, once written."""

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Enter the tracker if this step is in the window (made at the first such step)."""
        if self.files or not self.start_step <= state.global_step < self.start_step + self.steps:
            return
        if self._tracker is None:
            self._tracker = self._new_tracker(kwargs.get("model"), kwargs.get("optimizer"))
        self._open = (int(state.global_step), self._tracker.elapsed())
        self._tracker.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Leave the tracker after a tracked step; write the files after the window's last one."""
        if self._open is None:
            return
        self._tracker.__exit__(None, None, None)
        step, start = self._open
        self._open = None
        self._windows.append((step, start, self._tracker.elapsed()))
        if len(self._windows) >= self.steps:
            self._write(args)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Write what was tracked if training ended inside the window; warn if nothing was."""
        self.close()
        if self._windows and not self.files:
            self._write(args)
        elif not self._windows:
            warnings.warn(
                f"MemoryCallback: no step tracked (start_step={self.start_step}, but training ran "
                f"{state.global_step} steps); nothing written",
                stacklevel=2,
            )

    def close(self) -> None:
        """Leave the tracker if a step is still being tracked (after a step raised)."""
        if self._open is not None:
            self._tracker.__exit__(None, None, None)
            self._open = None

    def _new_tracker(self, model: Any, optimizer: Any) -> Any:
        """A tracker for the model's device with the model and optimizer registered."""
        from vramlens.trace._cuda import tracker_for

        tracker = tracker_for(self._device, model, None, **self._options)
        if model is not None:
            tracker.register_model(model)
        if optimizer is not None:
            tracker.register_optimizer(optimizer)
        return tracker

    def _write(self, args: Any) -> None:
        """Save this rank's timeline and summary, and stop tracking for good."""
        rank = int(getattr(args, "process_index", 0))
        metadata = {
            "source": "vramlens.integrations.hf.MemoryCallback",
            "device": getattr(self._tracker, "device", "cpu"),
            "rank": rank,
            "world_size": int(getattr(args, "world_size", 1)),
            "steps": [{"step": step, "start": start, "end": end} for step, start, end in self._windows],
        }
        timeline = self._tracker.timeline(metadata=metadata)
        self._tracker.close()
        directory = Path(self.output_dir if self.output_dir is not None else args.output_dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = save_timeline(timeline, directory / f"vramlens-memory-rank{rank}.npz")
        summary = timeline_summary(timeline)
        summary |= {"rank": rank, "timeline": path.name, "step_peaks": step_peaks(timeline, self._windows)}
        summary_path = directory / f"vramlens-memory-rank{rank}.json"
        summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        self.files, self.summary = [path, summary_path], summary


def step_peaks(timeline: Timeline, windows: list[tuple[int, int, int]]) -> dict[str, int]:
    """Peak live bytes of each ``(step, start, end)`` window (times on the timeline's clock),
    keyed by the step number as a string (JSON keys); steps with no events are omitted."""
    peaks: dict[str, int] = {}
    for step, start, end in windows:
        inside = (timeline.time >= start) & (timeline.time <= end)
        if np.any(inside):
            peaks[str(step)] = int(timeline.live_bytes[inside].max())
    return peaks
