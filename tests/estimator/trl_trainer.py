"""Ground truth for TRL's own trainers: the peak live tensor bytes of two ``SFTTrainer`` /
``DPOTrainer`` steps of a tiny Llama on CPU (built from a config, a word-level tokenizer and an
in-memory ``datasets.Dataset``, nothing downloaded), tracked with vramlens' ``StorageTracker``.
Needs the [fidelity] extra (trl, datasets); imported by tests only."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hf_step import TINY_LLAMA


@dataclass(frozen=True, kw_only=True)
class TrlRun:
    """One TRL configuration, expressed for both TRL and a vramlens workload."""

    trainer: str = "sft"
    method: str = "full"
    gradient_checkpointing: bool = False
    batch: int = 4
    seq: int = 128
    """Tokens per sequence (DPO: prompt + completion of each of the chosen and rejected rows)."""

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        workload: dict[str, Any] = {
            "model": model_from_config(dict(TINY_LLAMA)),
            "framework": "trl",
            # SFTConfig/DPOConfig bf16=True (TRL's default): accelerate's CPU autocast; LoRA loads the base in bf16.
            "precision": "mixed-bf16",
            "method": self.method,
            # DPO runs the chosen and the rejected rows of each pair as one batch.
            "batch": self.batch * (2 if self.trainer == "dpo" else 1),
            "seq": self.seq,
            "recompute": "full" if self.gradient_checkpointing else "none",
        }
        if self.method == "lora":
            workload["lora"] = {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}
        return workload


def _tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocabulary (token ``t0`` is the EOS and pad)."""
    import tokenizers
    import transformers

    vocab = {f"t{i}": i for i in range(TINY_LLAMA["vocab_size"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t1"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t0", pad_token="t0")


def _model(run: TrlRun) -> Any:
    import torch
    import transformers

    config = dict(TINY_LLAMA)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    dtype = torch.bfloat16 if run.method == "lora" else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)


def _dataset(run: TrlRun) -> Any:
    """Rows of exactly ``seq`` tokens, none of them the EOS/pad token, so no row is padded or cut."""
    import datasets
    import torch

    rows = 2 * run.batch
    ids = torch.randint(1, TINY_LLAMA["vocab_size"], (rows, 3 * run.seq)).tolist()
    if run.trainer == "sft":
        # Pre-tokenized rows are used as they are (no EOS added): seq tokens each.
        return datasets.Dataset.from_dict({"input_ids": [row[: run.seq] for row in ids]})
    half = run.seq // 2

    def text(row: list[int]) -> str:
        return " ".join(f"t{i}" for i in row)

    # Text rows (DPOTrainer tokenizes them itself); each completion ends with the EOS, so TRL adds none:
    # prompt + completion = seq tokens in both the chosen and the rejected row.
    return datasets.Dataset.from_dict(
        {
            "prompt": [text(row[:half]) for row in ids],
            "chosen": [" " + text([*row[half : run.seq - 1], 0]) for row in ids],
            "rejected": [" " + text([*row[run.seq : 2 * run.seq - half - 1], 0]) for row in ids],
        }
    )


def _config(run: TrlRun, out: str) -> Any:
    import trl

    common: dict[str, Any] = {
        "output_dir": out,
        "use_cpu": True,
        "bf16": True,
        "per_device_train_batch_size": run.batch,
        "max_steps": 2,
        "gradient_checkpointing": run.gradient_checkpointing,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "dataloader_num_workers": 0,
        "max_length": run.seq,
    }
    return trl.SFTConfig(**common) if run.trainer == "sft" else trl.DPOConfig(**common)


#: Token rows the CPU stand-in for TRL's Triton kernels folds at a time (see :func:`triton_like_kernels`).
_ROWS = 4


@contextlib.contextmanager
def triton_like_kernels() -> Iterator[None]:
    """TRL's chunked log-prob head with the memory behaviour of its GPU path on CPU.

    On CUDA, ``trl/kernels/chunked_logprob.py`` folds each ``[tokens, 32768]`` logits tile with
    Triton kernels (one program per token row, in registers) and accumulates the gradient GEMMs
    with ``torch.addmm(..., out_dtype=torch.float32)``: nothing tile-sized besides the tile.
    Without Triton it runs ``_forward_tile``/``_backward_tile`` over the whole tile at once
    (about seven fp32 tile-sized temporaries) and ``acc.addmm_(a.float(), b.float())``, which
    the estimate (a GPU's memory) leaves out. Here the same torch functions run on ``_ROWS``
    rows at a time and the GEMMs add block by block, so the CPU run allocates what the GPU run
    does, within a few rows' temporaries. Everything else is TRL's own code."""
    from trl.kernels import chunked_logprob as kernel

    forward, backward, addmm = kernel._forward_tile, kernel._backward_tile, kernel._addmm_fp32

    def rows(function: Any, sliced: tuple[int, ...]) -> Any:
        def by_rows(*args: Any, **kwargs: Any) -> None:
            for start in range(0, args[0].shape[0], _ROWS):
                part = [a[start : start + _ROWS] if i in sliced else a for i, a in enumerate(args)]
                function(*part, **kwargs)

        return by_rows

    def add_blocks(acc: Any, a: Any, b: Any) -> None:
        for start in range(0, acc.shape[0], 64):
            acc[start : start + 64] += a[start : start + 64] @ b

    kernel._forward_tile = rows(forward, (0, 2, 3, 4, 5, 6, 7, 8, 9))
    kernel._backward_tile = rows(backward, (0, 2, 3, 4, 5, 6))
    kernel._addmm_fp32 = add_blocks
    try:
        yield
    finally:
        kernel._forward_tile, kernel._backward_tile, kernel._addmm_fp32 = forward, backward, addmm


def measure_trl(run: TrlRun) -> int:
    """Peak live tensor bytes of ``trainer.train()`` over two optimizer steps."""
    import peft
    import torch
    import trl

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    model = _model(run)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]) if run.method == "lora" else None
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        extra: dict[str, Any] = {}
        if run.trainer == "dpo" and run.method == "full":
            extra["ref_model"] = _model(run)  # a frozen copy; LoRA's reference is the base with the adapters disabled
        cls = trl.SFTTrainer if run.trainer == "sft" else trl.DPOTrainer
        trainer = cls(
            **extra,
            model=model,
            args=_config(run, out),
            train_dataset=_dataset(run),
            processing_class=_tokenizer(),
            peft_config=lora,
        )
        tracker = StorageTracker()
        live = [list(trainer.model.parameters()), list(trainer.model.buffers())]
        if getattr(trainer, "ref_model", None) is not None:
            live += [list(trainer.ref_model.parameters()), list(trainer.ref_model.buffers())]
        tracker.register(live)
        with tracker, triton_like_kernels():
            trainer.train()
    return tracker.peak
