"""Each run-config example under examples/ reads into exactly the workload a person would write by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramlens.workload import (
    AttentionImpl,
    Engine,
    Framework,
    KvDtype,
    LoraConfig,
    LossImpl,
    Method,
    Mode,
    Offload,
    OptimizerImpl,
    OptimizerName,
    Parallelism,
    Precision,
    Quant,
    Recompute,
    Shard,
    Workload,
    load_workload,
)
from vramlens.workload.options import FsdpWrap
from vramlens.workload.sources import FORMATS, read_run_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
#: DeepSpeed and accelerate configs name no model: the model comes from MODEL.
GIVEN_MODEL = "llama-3.1-8b"

HAND_MADE: dict[str, tuple[str, Workload]] = {
    "axolotl-qlora.yml": (
        "axolotl",
        Workload(
            model="meta-llama/Llama-3.1-8B", mode=Mode.TRAIN, framework=Framework.HF, method=Method.QLORA,
            quant=Quant.NF4_DQ, lora=LoraConfig(rank=32, alpha=16, dropout=0.05, targets="all-linear"),
            batch=2, grad_accum=4, seq=4096, packing=True, precision=Precision.BF16, recompute=Recompute.FULL,
            attention=AttentionImpl.FLASH, optimizer=OptimizerName.PAGED_ADAMW,
        ),
    ),
    "torchtune-lora.yaml": (
        "torchtune",
        Workload(
            model="llama-3.1-8b", framework=Framework.TORCHTUNE, method=Method.LORA,
            lora=LoraConfig(rank=8, alpha=16, dropout=0.0,
                            targets=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
            precision=Precision.BF16, batch=2, grad_accum=8, seq=2048, recompute=Recompute.FULL,
            optimizer=OptimizerName.ADAMW, optimizer_impl=OptimizerImpl.FUSED, loss=LossImpl.CHUNKED,
        ),
    ),
    "litgpt-lora.yaml": (
        "litgpt",
        Workload(
            model="meta-llama/Llama-3.2-1B", framework=Framework.LITGPT, precision=Precision.BF16,
            method=Method.LORA, lora=LoraConfig(rank=32, alpha=16, dropout=0.05, targets=("q_proj", "v_proj")),
            batch=1, grad_accum=8, seq=512, optimizer=OptimizerName.ADAMW,
        ),
    ),
    "ds_config_zero3_offload.json": (
        "deepspeed",
        Workload(
            model=GIVEN_MODEL, framework=Framework.DEEPSPEED, batch=2, grad_accum=4, precision=Precision.MIXED_BF16,
            parallel=Parallelism(gpus=1, shard=Shard.ZERO3, offload=Offload.OPTIMIZER_PARAMS,
                                 stage3_max_live_parameters=10**9, stage3_max_reuse_distance=10**9,
                                 sub_group_size=10**9),
        ),
    ),
    "accelerate-fsdp.yaml": (
        "accelerate",
        Workload(
            model=GIVEN_MODEL, precision=Precision.MIXED_BF16, recompute=Recompute.FULL, fsdp_wrap=FsdpWrap.SPLIT,
            parallel=Parallelism(gpus=8, shard=Shard.FSDP),
        ),
    ),
    "trl-sft.sh": (
        "trl",
        Workload(
            model="Qwen/Qwen2.5-7B", framework=Framework.TRL, batch=4, grad_accum=4, seq=2048, packing=True,
            recompute=Recompute.FULL, optimizer=OptimizerName.ADAMW, optimizer_impl=OptimizerImpl.FUSED,
            precision=Precision.BF16, method=Method.LORA, lora=LoraConfig(rank=32, alpha=16, targets="all-linear"),
            parallel=Parallelism(gpus=2, shard=Shard.DDP), alloc_conf="expandable_segments:True",
        ),
    ),
    "vllm-serve.sh": (
        "vllm",
        Workload(
            model="Qwen/Qwen2.5-72B-Instruct", mode=Mode.INFER, engine=Engine.VLLM, framework=Framework.VLLM,
            parallel=Parallelism(gpus=4, tp=4), gpu_memory_utilization=0.92, max_num_seqs=128, context=32768,
            kv_dtype=KvDtype.FP8,
        ),
    ),
}  # fmt: skip


def test_every_format_has_an_example() -> None:
    assert sorted(fmt for fmt, _ in HAND_MADE.values()) == sorted(FORMATS)
    assert sorted(HAND_MADE) == sorted(
        p.name for p in EXAMPLES.iterdir() if p.suffix in (".yml", ".yaml", ".json", ".sh")
    )


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_example_reads_into_the_hand_made_workload(name: str) -> None:
    fmt, expected = HAND_MADE[name]
    source = read_run_config(EXAMPLES / name)
    assert source.format == fmt
    keys = dict(source.keys)
    keys.setdefault("model", GIVEN_MODEL)
    assert load_workload(keys) == expected
    # every key it set is written in the notes, and the notes start by naming the file and format
    lines = source.assumptions()
    assert lines[0] == f"read {name} as {fmt}"
    for key, value in source.keys.items():
        targets = [f"{key}.{sub}" for sub in value] if isinstance(value, dict) else [key]
        for target in targets:
            assert any(note.target == target for note in source.notes), target


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_forced_format_reads_the_same(name: str) -> None:
    fmt, _ = HAND_MADE[name]
    assert read_run_config(EXAMPLES / name, format=fmt).keys == read_run_config(EXAMPLES / name).keys
