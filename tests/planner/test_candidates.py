"""The planner's knob axes (``planner/candidates.py``): each must only lower the peak."""

from __future__ import annotations

from vramlens.planner.candidates import groups, optimizer_axis
from vramlens.planner.planner import prepare
from vramlens.workload.options import Method, OptimizerName, Precision, Shard


def _group(gpus: int, pp: int) -> tuple[object, object, object]:
    user, spec, _ = prepare(
        {"model": "llama-3.2-1b", "optimizer": "adamw", "batch": 4, "reserved_replay": False},
        gpu="h100-80gb",
        gpus=gpus,
    )
    for group in groups(user, gpus, allow_method_change=True):
        parallel = group.parallel
        if (group.method, group.precision, parallel.shard, parallel.tp, parallel.pp) == (
            Method.FULL, Precision.BF16, Shard.NONE, 1, pp,
        ):  # fmt: skip
            return spec, user, group
    raise AssertionError(f"no full bf16 group with pp {pp}")


def test_an_8_bit_optimizer_that_grows_the_embedding_stage_is_not_on_the_axis() -> None:
    # bf16 weights: torch's AdamW keeps bf16 moments, bitsandbytes steps the embedding table with
    # fp32 32-bit state under Trainer; at pp 8 the first stage (the table and two layers) grows.
    # Found by tests/planner/test_plan.py::test_every_knob_step_never_raises_the_peak (allocated
    # 6.77 GiB with AdamW, 7.05 GiB with 8-bit AdamW).
    assert optimizer_axis(*_group(8, 8)) == [OptimizerName.ADAMW]  # type: ignore[arg-type]


def test_8_bit_optimizers_stay_where_they_save_on_every_stage() -> None:
    # One GPU: the 8-bit moments of the layers outweigh the table's fp32 state.
    assert optimizer_axis(*_group(1, 1)) == [  # type: ignore[arg-type]
        OptimizerName.ADAMW,
        OptimizerName.ADAMW_8BIT,
        OptimizerName.PAGED_ADAMW_8BIT,
    ]
