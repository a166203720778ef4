"""PyTorch memory snapshots (``torch.cuda.memory._dump_snapshot``), read safely and fast (numpy only, no torch).

``load_snapshot(path)`` reads every layout from PyTorch 1.13 on, and JSON snapshots, with a
restricted unpickler that refuses anything but plain data; ``Snapshot.timeline(device)``
(or ``snapshot_timeline``) turns a device's trace into a :class:`~vramlens.result.timeline.Timeline`.
What is read and how it is interpreted: ``docs/snapshot-format.md``.
"""

from __future__ import annotations

from vramlens.snapshot.convert import snapshot_timeline
from vramlens.snapshot.infer import infer_categories
from vramlens.snapshot.model import Annotation, Block, Frame, OomEntry, Segment, Snapshot, Trace
from vramlens.snapshot.reader import load_snapshot
from vramlens.snapshot.writer import save_snapshot

__all__ = [
    "Annotation",
    "Block",
    "Frame",
    "OomEntry",
    "Segment",
    "Snapshot",
    "Trace",
    "infer_categories",
    "load_snapshot",
    "save_snapshot",
    "snapshot_timeline",
]
