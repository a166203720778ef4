"""Technique experiments: train one model under several memory-saving configurations, measure
peak memory, speed and loss on the machine at hand, and put vramlens's predictions beside them
(seed 004's study, for anyone's model; issue 10).

::

    from vramlens.experiments import ResultStore, matrix_from_list, run_matrix

    matrix = matrix_from_list("llama-3.2-1b", "bf16,checkpoint,bf16+checkpoint", steps=3, batch=1, seq=512)
    result = run_matrix(matrix, ResultStore("runs.jsonl"))
    result.to_dict()   # {"rows": [{"name", "techniques", "measured_peak_bytes", ...}], "device": ...}

Each finished run is appended to the store at once, so an interrupted matrix resumes where it
stopped; finished runs are never repeated. Importing this package does not import torch;
running does (the [torch] and [hf] extras).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vramlens.experiments.matrix import Matrix, RunSpec, load_matrix, matrix_from_list
from vramlens.experiments.predict import Prediction, predict_run
from vramlens.experiments.store import ResultStore
from vramlens.experiments.techniques import TECHNIQUES, TechniqueName

__all__ = [
    "TECHNIQUES",
    "ExperimentResult",
    "Matrix",
    "Prediction",
    "ResultStore",
    "RunSpec",
    "TechniqueName",
    "load_matrix",
    "matrix_from_list",
    "predict_run",
    "run_matrix",
]


@dataclass(frozen=True, kw_only=True)
class ExperimentResult:
    """The rows of a matrix (store rows, in matrix order) and how many were already stored."""

    rows: tuple[dict[str, Any], ...]
    device: str
    reused: int
    """Rows found in the store (not run again)."""

    def to_dict(self) -> dict[str, Any]:
        """``{"rows": [...], "device": ...}``; each row has at least name, techniques,
        measured/predicted/simulated peak bytes, tokens_per_s and loss."""
        return {"rows": [dict(row) for row in self.rows], "device": self.device}


#: Called before each run: (the run, its 1-based index, the number of runs, already stored).
OnRun = Callable[[RunSpec, int, int, bool], None]


def run_matrix(
    matrix: Matrix,
    store: ResultStore,
    *,
    simulate: bool = True,
    on_run: OnRun | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> ExperimentResult:
    """Run every run of ``matrix`` not yet in ``store``, appending each as soon as it finishes
    (measurement and predictions in one row); ``simulate=False`` skips the simulator."""
    from vramlens.experiments.runner import run_experiment
    from vramlens.trace.ranks import rank_info

    info = rank_info()
    finished = store.finished()
    rows = []
    reused = 0
    for index, spec in enumerate(matrix.runs, start=1):
        stored = finished.get(spec.key)
        if on_run is not None:
            on_run(spec, index, len(matrix.runs), stored is not None)
        if stored is not None:
            rows.append(stored | {"name": spec.name})
            reused += 1
            continue
        row = run_experiment(spec, on_step=on_step).to_dict()
        if info.world > 1:  # every rank its own record; rank 0 merges them into the store
            row = _merged(spec, row, store, info.rank, info.world)
            if info.rank != 0:
                rows.append(row)
                continue
        prediction = predict_run(spec, simulate=simulate)
        row |= {
            "predicted_peak_bytes": prediction.predicted_peak_bytes,
            "simulated_peak_bytes": prediction.simulated_peak_bytes,
            "prediction_notes": list(prediction.notes),
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        store.append(row)
        rows.append(row)
    return ExperimentResult(rows=tuple(rows), device=matrix.runs[0].device, reused=reused)


def _merged(spec: RunSpec, row: dict[str, Any], store: ResultStore, rank: int, world: int) -> dict[str, Any]:
    """Write this rank's row to its own store, wait for every rank, and (rank 0) merge their rows
    of ``spec``; other ranks get their own row back."""
    from vramlens.experiments.distributed import merge_rank_rows, rank_store
    from vramlens.trace.ranks import barrier

    own = row | {"rank": rank}
    rank_store(store, rank).append(own)
    barrier()
    if rank != 0:
        return own
    return merge_rank_rows([rank_store(store, r).finished()[spec.key] for r in range(world)])
