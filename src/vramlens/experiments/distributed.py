"""Technique runs on many processes (``torchrun``): data-parallel wrapping, per-rank records, the merge.

Every rank trains and measures its own peak (:mod:`vramlens.experiments.runner`) and writes its
row to a store of its own (``results.rank1.jsonl`` beside ``results.jsonl``); after a barrier,
rank 0 reads every rank's row of the run and appends the merge to the main store: the run's
peak is the highest rank's (what must fit every GPU), with each rank's peak and the skew
between ranks (:class:`vramlens.trace.ranks.RankPeaks`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramlens.experiments.store import ResultStore
from vramlens.trace.ranks import rank_peaks

__all__ = ["merge_rank_rows", "rank_store", "wrap_data_parallel"]

#: Fields kept per rank in the merged row.
_PER_RANK = ("measured_peak_bytes", "reserved_peak_bytes", "measured_breakdown", "tokens_per_s", "loss", "skipped")


def rank_store(store: ResultStore, rank: int) -> ResultStore:
    """The store rank ``rank`` writes its own rows to: ``results.rank{rank}.jsonl`` beside ``results.jsonl``."""
    path = Path(store.path)
    return ResultStore(path.with_name(f"{path.stem}.rank{rank}{path.suffix or '.jsonl'}"))


def merge_rank_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from every rank's row of a run (by rank): rank 0's row, with the highest rank's
    peak as the run's, ``ranks`` (each rank's measurement) and the skew."""
    merged = dict(rows[0])
    merged["ranks"] = [{"rank": rank, **{key: row.get(key) for key in _PER_RANK}} for rank, row in enumerate(rows)]
    merged["world"] = len(rows)
    skipped = next((row.get("skipped") for row in rows if row.get("skipped")), None)
    if skipped is not None:
        merged["skipped"] = skipped
        return merged
    peaks = rank_peaks([int(row["measured_peak_bytes"]) for row in rows])
    top = max(range(len(rows)), key=lambda rank: int(rows[rank]["measured_peak_bytes"]))
    merged["measured_peak_bytes"] = peaks.to_dict()["peak_bytes"]
    merged["measured_breakdown"] = rows[top].get("measured_breakdown")
    merged["peak_rank"] = top
    merged["skew_bytes"] = peaks.skew_bytes
    merged["max_over_median"] = round(peaks.max_over_median, 6)
    return merged


def _decoder_layers(torch: Any, model: Any) -> list[Any]:
    """The layers of the first ``ModuleList`` in the model (a transformers model's decoder layers)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module):
            return list(module)
    return []


def wrap_data_parallel(torch: Any, model: Any, technique: str) -> tuple[Any, str]:
    """``model`` under ``ddp`` (DistributedDataParallel) or ``fsdp`` (FSDP2 ``fully_shard`` of each
    decoder layer, then of the root), and a note saying so."""
    import torch.distributed as dist

    world = dist.get_world_size()
    if technique == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        return wrapped, f"ddp: DistributedDataParallel over {world} ranks ({dist.get_backend()})"
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(torch, model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return (
        model,
        f"fsdp: FSDP2 fully_shard of {len(layers)} layers and the root over {world} ranks ({dist.get_backend()})",
    )
