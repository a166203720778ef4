"""Measured runs on many processes (``torchrun``): who this process is, and one record per rank.

Under ``torchrun`` (or any launcher that sets ``RANK``/``WORLD_SIZE``) every rank measures its
own peak with its own tracker and writes its own record; after a barrier, rank 0 reads every
rank's record and merges them: the peak per rank and the skew between ranks (max - min,
max / median). :func:`save_ranks` does that for :func:`vramlens.track`; ``vramlens experiment``
does the same for its runs (:mod:`vramlens.experiments.distributed`). On one process both work
as before (a world of one).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlens.result.timeline import Timeline

__all__ = ["RankInfo", "RankPeaks", "barrier", "init_from_env", "rank_info", "rank_peaks", "save_ranks"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """This process in its run: rank, world size, local rank, and whether a process group is up."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: bool = False


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else default


def rank_info() -> RankInfo:
    """torch.distributed's rank and world when a process group is up, else the launcher's
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, else a world of one."""
    import sys

    distributed = getattr(sys.modules.get("torch"), "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return RankInfo(
            rank=int(distributed.get_rank()),
            world=int(distributed.get_world_size()),
            local_rank=_env_int("LOCAL_RANK", 0),
            group=True,
        )
    return RankInfo(rank=_env_int("RANK", 0), world=_env_int("WORLD_SIZE", 1), local_rank=_env_int("LOCAL_RANK", 0))


def init_from_env(device: str = "cpu") -> RankInfo:
    """Start the process group a launcher asked for (``WORLD_SIZE`` > 1 and none up yet): gloo on
    CPU, nccl on CUDA; a world of one starts nothing."""
    info = rank_info()
    if info.group or info.world < 2:
        return info
    import torch.distributed as dist

    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return rank_info()


def barrier() -> None:
    """Wait for every rank (nothing without a process group)."""
    if rank_info().group:
        import torch.distributed as dist

        dist.barrier()


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPeaks:
    """Per-rank peaks of one run and how far apart they are."""

    peaks: tuple[int, ...]
    """Peak bytes of each rank, by rank."""

    @property
    def skew_bytes(self) -> int:
        """The highest rank's peak minus the lowest's."""
        return max(self.peaks) - min(self.peaks)

    @property
    def max_over_median(self) -> float:
        """The highest peak over the median one (1.0: balanced ranks)."""
        median = statistics.median(self.peaks)
        return max(self.peaks) / median if median else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: per-rank peaks, the peak of the run (the highest rank's) and the skew."""
        return {
            "world": len(self.peaks),
            "per_rank_peak_bytes": list(self.peaks),
            "peak_bytes": max(self.peaks),
            "skew_bytes": self.skew_bytes,
            "max_over_median": round(self.max_over_median, 6),
        }


def rank_peaks(peaks: Sequence[int]) -> RankPeaks:
    """The merge of per-rank peaks (one per rank, by rank)."""
    if not peaks:
        raise ValueError("rank_peaks: no rank")
    return RankPeaks(peaks=tuple(int(p) for p in peaks))


def save_ranks(source: Any, directory: str | os.PathLike[str]) -> RankPeaks | None:
    """Every rank writes its timeline (``source``: a tracker or a Timeline) to
    ``directory/vramlens-rank{rank}.npz``; after a barrier, rank 0 merges the files into
    ``directory/vramlens-ranks.json`` (per-rank peak, skew) and returns the merge; other ranks
    return None. ``vramlens view directory/vramlens-rank*.npz`` shows the ranks side by side."""
    from vramlens.trace.timeline_io import load_timeline, save_timeline

    info = rank_info()
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    timeline: Timeline = source if isinstance(source, Timeline) else source.timeline()
    save_timeline(timeline, folder / f"vramlens-rank{info.rank}.npz")
    barrier()
    if info.rank != 0:
        return None
    files = [folder / f"vramlens-rank{rank}.npz" for rank in range(info.world)]
    merged = rank_peaks([load_timeline(path).peak_bytes for path in files])
    record = merged.to_dict() | {"files": [path.name for path in files]}
    (folder / "vramlens-ranks.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return merged
