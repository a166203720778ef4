"""DeepSpeed ZeRO's bucket sizes and ZeRO-3 parameter-coordinator settings, resolved once per workload.

Each setting is the workload's ``parallel`` key of the same name (DeepSpeed's config key), else its
default from :data:`ZERO_DEFAULTS`: the value the HF Trainer fills for DeepSpeed's ``"auto"``
(``transformers/integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_finalize``:
``reduce_bucket_size = hidden_size**2``, ``stage3_prefetch_bucket_size = int(0.9 * hidden_size**2)``,
``stage3_param_persistence_threshold = 10 * hidden_size``), which HF's example ZeRO configs ask for,
and DeepSpeed's own default where HF's examples write a number (``stage3_max_live_parameters``,
``stage3_max_reuse_distance`` and ``sub_group_size``: ``1e9`` in both). DeepSpeed's own defaults, for a config that leaves
a key out without the HF Trainer, are in the table too. Read by :mod:`vramlens.estimator.zero3` and
:mod:`vramlens.estimator.offload`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from vramlens.workload.options import Shard
from vramlens.workload.spec import Parallelism

__all__ = ["ZERO_DEFAULTS", "ZeroDefault", "ZeroSettings", "zero_settings"]

_DS_CONFIG = "deepspeed 0.19.8 runtime/zero/config.py DeepSpeedZeroConfig"
_HF_AUTO = "transformers 5.x integrations/deepspeed.py trainer_config_finalize (HF's example ZeRO configs: auto)"


@dataclass(frozen=True, kw_only=True, slots=True)
class ZeroDefault:
    """One DeepSpeed ZeRO size (elements): DeepSpeed's default, and what vramlens assumes when the
    workload leaves it out."""

    key: str
    """DeepSpeed's config key under ``zero_optimization`` (and the workload's ``parallel`` key)."""
    deepspeed: int
    """DeepSpeed's own default."""
    assumed: Callable[[int], int]
    """The default vramlens assumes, from the model's hidden size."""
    formula: str
    source: str


#: DeepSpeed's ZeRO sizes (elements), checked against the installed DeepSpeed 0.19.8 and transformers 5.x.
ZERO_DEFAULTS: Final[dict[str, ZeroDefault]] = {
    d.key: d
    for d in (
        ZeroDefault(key="reduce_bucket_size", deepspeed=500_000_000, assumed=lambda h: h * h,
                    formula="hidden_size**2 (HF auto)", source=f"{_HF_AUTO}; DeepSpeed's own 5e8: {_DS_CONFIG}"),
        ZeroDefault(key="stage3_prefetch_bucket_size", deepspeed=50_000_000, assumed=lambda h: int(0.9 * h * h),
                    formula="int(0.9 x hidden_size**2) (HF auto)", source=f"{_HF_AUTO}; DeepSpeed's own 5e7: {_DS_CONFIG}"),
        ZeroDefault(key="stage3_max_live_parameters", deepspeed=1_000_000_000, assumed=lambda h: 1_000_000_000,
                    formula="1e9 (DeepSpeed's and HF's example configs)", source=_DS_CONFIG),
        ZeroDefault(key="stage3_max_reuse_distance", deepspeed=1_000_000_000, assumed=lambda h: 1_000_000_000,
                    formula="1e9 (DeepSpeed's and HF's example configs)", source=_DS_CONFIG),
        ZeroDefault(key="stage3_param_persistence_threshold", deepspeed=100_000, assumed=lambda h: 10 * h,
                    formula="10 x hidden_size (HF auto)", source=f"{_HF_AUTO}; DeepSpeed's own 1e5: {_DS_CONFIG}"),
        ZeroDefault(key="sub_group_size", deepspeed=1_000_000_000, assumed=lambda h: 1_000_000_000,
                    formula="1e9 (DeepSpeed's and HF's example configs)", source=_DS_CONFIG),
    )
}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class ZeroSettings:
    """DeepSpeed ZeRO's sizes of one workload, in elements (DeepSpeed counts ``numel``)."""

    reduce_bucket: int
    """``reduce_bucket_size``: the contiguous gradient (IPG) bucket."""
    prefetch_bucket: int
    """``stage3_prefetch_bucket_size``: elements each ZeRO-3 fetch prefetches at most (0: none)."""
    max_live: int
    """``stage3_max_live_parameters``: the prefetch stops once this many elements are gathered."""
    max_reuse: int
    """``stage3_max_reuse_distance``: a parameter used again within this many elements stays gathered."""
    persistence_threshold: int
    """``stage3_param_persistence_threshold``: tensors of at most this many elements stay gathered."""
    sub_group: int
    """``sub_group_size``: ZeRO-3 steps its partition in groups of about this many elements."""
    note: str
    """What was assumed, for the report (empty when the workload set every size)."""


@lru_cache(maxsize=1024)
def zero_settings(hidden_size: int, parallel: Parallelism) -> ZeroSettings | None:
    """The sizes for ``parallel`` (None without a ZeRO stage): each key the workload sets, else
    :data:`ZERO_DEFAULTS`' assumed value for ``hidden_size``."""
    if parallel.shard not in (Shard.ZERO1, Shard.ZERO2, Shard.ZERO3):
        return None
    values: dict[str, int] = {}
    assumed: list[str] = []
    for key, default in ZERO_DEFAULTS.items():
        given = getattr(parallel, key)
        values[key] = default.assumed(hidden_size) if given is None else given
        stage3 = key != "reduce_bucket_size"
        if given is None and (parallel.shard is Shard.ZERO3 or not stage3):
            assumed.append(f"{key} {values[key]:,} = {default.formula}")
    return ZeroSettings(
        reduce_bucket=values["reduce_bucket_size"],
        prefetch_bucket=values["stage3_prefetch_bucket_size"],
        max_live=values["stage3_max_live_parameters"],
        max_reuse=values["stage3_max_reuse_distance"],
        persistence_threshold=values["stage3_param_persistence_threshold"],
        sub_group=values["sub_group_size"],
        note=("DeepSpeed ZeRO sizes not given, assumed: " + "; ".join(assumed)) if assumed else "",
    )
