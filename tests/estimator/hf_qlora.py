"""Ground truth for the QLoRA recipe of PEFT's and transformers' guides, run by transformers' own
code on CPU: ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))``
(bitsandbytes' CPU backend quantizes each weight as it loads), ``peft.prepare_model_for_kbit_training``,
``get_peft_model`` and two ``Trainer`` steps. The tiny Llama is built from a config and saved to a
temporary folder first (nothing downloaded). Tracked with vramlens' ``StorageTracker``: the load
(from ``from_pretrained`` to the end of the preparation) and the training steps apart.
Needs the [hf] extra and bitsandbytes; imported by tests only."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

from hf_step import TINY_LLAMA


@dataclass(frozen=True, kw_only=True)
class QloraRun:
    """One QLoRA configuration, expressed for both transformers and a vramlens workload."""

    batch: int = 4
    seq: int = 128
    double_quant: bool = False
    autocast: bool = True
    """``Trainer(bf16=True)`` (accelerate's autocast); else no autocast: the prepared fp32 weights compute in fp32."""
    vocab: int = TINY_LLAMA["vocab_size"]

    def config(self) -> dict[str, Any]:
        return {**TINY_LLAMA, "vocab_size": self.vocab}

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        return {
            "model": model_from_config(self.config()),
            "framework": "hf",
            # Trainer(bf16=True): autocast; the base is loaded in bf16 either way (bnb_4bit_compute_dtype).
            "precision": "mixed-bf16" if self.autocast else "bf16",
            "method": "qlora",
            "quant": "nf4-dq" if self.double_quant else "nf4",
            "batch": self.batch,
            "seq": self.seq,
            # prepare_model_for_kbit_training(use_gradient_checkpointing=True), its default, turns checkpointing on.
            "recompute": "full",
            "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        }


@dataclass(frozen=True, kw_only=True)
class QloraPeaks:
    """Tracked peak live tensor bytes of the load and of the training steps."""

    load: int
    train: int


def _load(run: QloraRun, folder: str) -> Any:
    """The QLoRA load: the 4-bit base from ``folder`` and k-bit preparation."""
    import peft
    import torch
    import transformers

    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=run.double_quant,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu"
    )
    return peft.prepare_model_for_kbit_training(model)


def _save_tiny(run: QloraRun, folder: str) -> None:
    import torch
    import transformers

    config = run.config()
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16).save_pretrained(folder)


def _quant_states(model: Any) -> list[Any]:
    """The tensors of the 4-bit weights' quantization states (absmax, and with double quantization
    its own absmax, code and offset): neither parameters nor buffers, alive the whole run."""
    import torch

    found: list[Any] = []
    for parameter in model.parameters():
        state = getattr(parameter, "quant_state", None)
        while state is not None:
            found += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if torch.is_tensor(t)]
            state = getattr(state, "state2", None)
    return found


def measure_qlora(run: QloraRun) -> QloraPeaks:
    """Peak live tensor bytes of the QLoRA load and of ``Trainer.train()`` over two optimizer steps."""
    import peft
    import torch
    import transformers

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _save_tiny(run, folder)
        loading = StorageTracker()
        with loading:
            model = _load(run, folder)
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
        rows = [
            {"input_ids": ids, "labels": ids} for ids in torch.randint(0, run.vocab, (2 * run.batch, run.seq)).tolist()
        ]
        args = transformers.TrainingArguments(
            output_dir=out,
            use_cpu=True,
            bf16=run.autocast,
            per_device_train_batch_size=run.batch,
            max_steps=2,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            dataloader_num_workers=0,
            learning_rate=1e-4,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
        training = StorageTracker()
        training.register([list(model.parameters()), list(model.buffers()), _quant_states(model)])
        with training:
            trainer.train()
    return QloraPeaks(load=loading.peak, train=training.peak)
