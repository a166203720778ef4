"""Ground truth for transformers' own ``Trainer``: the peak live tensor bytes of two training
steps of a tiny Llama on CPU (built from a config, an in-memory dataset, nothing downloaded),
tracked with vramlens' ``StorageTracker``. Needs the [hf] extra; imported by tests only."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

from hf_step import TINY_LLAMA

#: ``TrainingArguments.optim`` names of bitsandbytes' optimizers, as workload ``optimizer`` values.
OPTIMIZERS = {
    "paged_adamw_32bit": "paged-adamw",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "adamw_bnb_8bit": "adamw-8bit",
}


@dataclass(frozen=True, kw_only=True)
class TrainerRun:
    """One Trainer configuration, expressed for both transformers and a vramlens workload."""

    method: str = "full"
    targets: tuple[str, ...] = ()
    gradient_checkpointing: bool = False
    batch: int = 4
    seq: int = 128
    optim: str = "adamw_torch_fused"
    """``TrainingArguments.optim`` (its default, or a bitsandbytes one: :data:`OPTIMIZERS`)."""

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        workload: dict[str, Any] = {
            "model": model_from_config(dict(TINY_LLAMA)),
            "framework": "hf",
            # Trainer(bf16=True): accelerate's CPU autocast; LoRA loads the base in bf16 (PEFT's guides).
            "precision": "mixed-bf16",
            "method": self.method,
            "batch": self.batch,
            "seq": self.seq,
            "recompute": "full" if self.gradient_checkpointing else "none",
        }
        if self.method == "lora":
            workload["lora"] = {"rank": 8, "alpha": 16, "targets": list(self.targets)}
        if self.optim in OPTIMIZERS:
            workload["optimizer"] = OPTIMIZERS[self.optim]
        return workload


def _model(run: TrainerRun) -> Any:
    import torch
    import transformers

    config = dict(TINY_LLAMA)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    dtype = torch.bfloat16 if run.method == "lora" else torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    if run.method == "lora":
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=list(run.targets)))
    return model


def measure_trainer(run: TrainerRun) -> int:
    """Peak live tensor bytes of ``Trainer.train()`` over two optimizer steps."""
    import torch
    import transformers

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    model = _model(run)
    rows = [
        {"input_ids": ids, "labels": ids}
        for ids in torch.randint(0, TINY_LLAMA["vocab_size"], (2 * run.batch, run.seq)).tolist()
    ]
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(
            output_dir=out,
            use_cpu=True,
            bf16=True,
            per_device_train_batch_size=run.batch,
            max_steps=2,
            gradient_checkpointing=run.gradient_checkpointing,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            dataloader_num_workers=0,
            learning_rate=1e-4,
            optim=run.optim,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
        tracker = StorageTracker()
        tracker.register([list(model.parameters()), list(model.buffers())])
        with tracker:
            trainer.train()
    return tracker.peak
