"""Ground truth for LitGPT: two steps of ``litgpt/finetune/lora.py``'s ``fit`` loop (its lines,
with litgpt's own ``GPT``, ``chunked_cross_entropy`` and Lightning Fabric) on CPU on a tiny
Llama-shaped model, tracked with vramlens' ``StorageTracker``. Needs litgpt (the [fidelity]
extra's --no-deps step, .ci/run); imported by tests only."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from hf_step import TINY_LLAMA


@dataclass(frozen=True, kw_only=True)
class LitgptRun:
    """One LitGPT LoRA configuration, for both litgpt and a vramlens workload."""

    batch: int = 4
    seq: int = 128
    quantize: str | None = None
    """``bnb.nf4`` / ``bnb.nf4-dq``: litgpt's ``--quantize`` (Fabric's BitsandbytesPrecision)."""

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        workload: dict[str, Any] = {
            "model": model_from_config(dict(TINY_LLAMA)),
            "framework": "litgpt",
            "precision": "bf16",  # litgpt's default on a bf16-capable device: "bf16-true"
            "method": "lora",
            "batch": self.batch,
            "seq": self.seq,
            "optimizer_impl": "foreach",  # torch.optim.AdamW(...) on CUDA picks foreach; passed explicitly on CPU
            "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]},
        }
        if self.quantize:
            workload["quant"] = self.quantize.removeprefix("bnb.")
        return workload


def litgpt_config(seq: int) -> Any:
    """LitGPT's config of the tiny Llama, LoRA on the query and the value."""
    from litgpt.lora import Config

    t = TINY_LLAMA
    return Config(
        name="tiny-llama",
        block_size=seq,
        vocab_size=t["vocab_size"],
        padded_vocab_size=t["vocab_size"],
        n_layer=t["num_hidden_layers"],
        n_head=t["num_attention_heads"],
        n_query_groups=t["num_key_value_heads"],
        n_embd=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-6,
        mlp_class_name="LLaMAMLP",
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        lora_query=True,
        lora_value=True,
    )


def fit_steps(fabric: Any, model: Any, optimizer: Any, batches: list[Any]) -> None:
    """The body of ``litgpt.finetune.lora.fit``'s loop (no accumulation, no validation)."""
    from litgpt.utils import chunked_cross_entropy

    for input_ids, targets in batches:
        logits = model(input_ids, lm_head_chunk_size=128)
        # shift the targets such that output n predicts token n+1
        logits[-1] = logits[-1][..., :-1, :]
        loss = chunked_cross_entropy(logits, targets[..., 1:])
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def measure_litgpt(run: LitgptRun) -> int:
    """Peak live tensor bytes of two LitGPT LoRA steps on one CPU process."""
    import lightning as L
    import torch
    from litgpt.lora import GPT, mark_only_lora_as_trainable
    from litgpt.utils import instantiate_torch_optimizer

    from vramlens.trace.tracker import StorageTracker

    plugins = None
    precision: str | None = "bf16-true"
    if run.quantize:
        from lightning.fabric.plugins import BitsandbytesPrecision

        plugins, precision = BitsandbytesPrecision(run.quantize[4:], torch.bfloat16), None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fabric = L.Fabric(devices=1, accelerator="cpu", precision=precision, plugins=plugins)  # type: ignore[arg-type]
        fabric.seed_everything(0)
        with fabric.init_module(empty_init=False):
            model = GPT(litgpt_config(run.seq))
        mark_only_lora_as_trainable(model)
        model = fabric.setup_module(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = instantiate_torch_optimizer("AdamW", trainable, foreach=True)
        optimizer = fabric.setup_optimizers(optimizer)
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, run.batch, run.seq))
        batches = [(ids[i], ids[i]) for i in range(2)]
        tracker = StorageTracker()
        tracker.register([list(model.parameters()), list(model.buffers())])
        with tracker:
            fit_steps(fabric, model, optimizer, batches)
    return tracker.peak
