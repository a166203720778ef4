"""DeepSpeed ZeRO's sizes (vramlens.resolve.zero): the defaults are the installed DeepSpeed's and what
the installed transformers fills for ``auto``; the workload's keys win; bad values are one-line errors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vramlens.errors import InputError
from vramlens.resolve.zero import ZERO_DEFAULTS, zero_settings
from vramlens.workload import load_workload
from vramlens.workload.options import Shard
from vramlens.workload.spec import Parallelism

_H = 4096
#: ``ZERO_DEFAULTS`` key -> DeepSpeedZeroConfig's field.
_FIELDS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "sub_group_size": "sub_group_size",
}


@pytest.mark.slow  # imports deepspeed (seconds)
def test_deepspeeds_own_defaults_are_the_installed_deepspeeds() -> None:
    config = pytest.importorskip("deepspeed.runtime.zero.config")
    defaults = config.DeepSpeedZeroConfig()
    assert set(_FIELDS) == set(ZERO_DEFAULTS)
    for key, name in _FIELDS.items():
        assert ZERO_DEFAULTS[key].deepspeed == getattr(defaults, name), key


@pytest.mark.slow  # imports deepspeed (seconds)
def test_the_assumed_values_are_what_hf_trainer_fills_for_auto() -> None:
    """transformers' own fill of HF's example ZeRO-3 config ("auto" for the three hidden-size keys,
    1e9 written for the other two) gives the assumed values."""
    pytest.importorskip("deepspeed")
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    zero = {"stage": 3, **{key: "auto" for key in _FIELDS}}
    zero |= {"stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9, "sub_group_size": 1e9}
    hf = HfTrainerDeepSpeedConfig({"zero_optimization": zero})
    args = SimpleNamespace(get_warmup_steps=lambda steps: 1)
    hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=_H)), 10)
    filled = hf.config["zero_optimization"]
    for key, default in ZERO_DEFAULTS.items():
        assert default.assumed(_H) == filled[key], key


def test_the_workload_keys_win_and_the_rest_is_noted() -> None:
    settings = zero_settings(_H, Parallelism(gpus=8, shard=Shard.ZERO3, stage3_max_live_parameters=10**8))
    assert settings is not None
    assert settings.max_live == 10**8
    assert (settings.reduce_bucket, settings.prefetch_bucket) == (_H * _H, int(0.9 * _H * _H))
    assert (settings.max_reuse, settings.persistence_threshold) == (10**9, 10 * _H)
    assert "stage3_max_live_parameters" not in settings.note and "stage3_max_reuse_distance" in settings.note
    zero2 = zero_settings(_H, Parallelism(gpus=8, shard=Shard.ZERO2))
    assert zero2 is not None and "stage3" not in zero2.note and "reduce_bucket_size" in zero2.note
    assert zero_settings(_H, Parallelism(gpus=8, shard=Shard.FSDP)) is None


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"gpus": 8, "shard": "zero2", "stage3_max_live_parameters": 10}, r"^parallel\.stage3_max_live_parameters: .*zero3, not 'zero2'$"),
        ({"gpus": 8, "shard": "fsdp", "reduce_bucket_size": 10}, r"^parallel\.reduce_bucket_size: .*not 'fsdp'$"),
        ({"gpus": 8, "shard": "zero3", "stage3_max_reuse_distance": -1}, r"^parallel\.stage3_max_reuse_distance: must be an integer >= 0"),
        ({"gpus": 8, "shard": "zero3", "reduce_bucket_size": 0}, r"^parallel\.reduce_bucket_size: must be an integer >= 1"),
        ({"gpus": 8, "shard": "zero3", "stage3_prefetch_bucket_size": "lots"}, r"^parallel\.stage3_prefetch_bucket_size: must be an integer"),
    ],
)  # fmt: skip
def test_bad_sizes_are_one_line_errors(parallel: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as raised:
        load_workload({"model": "llama-3.1-8b", "parallel": parallel})
    assert "\n" not in str(raised.value)
