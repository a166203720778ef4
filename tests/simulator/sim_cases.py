"""Tiny configs of several families and a real tracked training step to compare the simulator with.

The real step is written independently of ``vramlens.simulator``: the model is built with
``from_config`` on real CPU tensors (random weights), PEFT is applied to the real model,
and HF Trainer's step (autocast + fp32 logits for mixed precision) runs twice under the
tracker. Imported by tests only.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

TINY: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 344,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    },
    "qwen2 (tied, qkv bias)": {
        "model_type": "qwen2",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1200,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
    },
    "qwen3 (qk norm)": {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 900,
        "max_position_embeddings": 4096,
    },
    "gemma (gelu, tied, scaled embeddings)": {
        "model_type": "gemma",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 1100,
        "max_position_embeddings": 4096,
    },
}


def real_training_peak(
    config: dict[str, Any],
    *,
    precision: str,
    recompute: bool,
    lora: bool,
    batch: int,
    seq: int,
    optimizer: str = "adamw",
) -> int:
    """Peak live tensor bytes of two real HF training steps on CPU (fused AdamW, or
    torch's Adafactor with ``optimizer="adafactor"``)."""
    import torch
    import transformers

    from vramlens.trace.tracker import MemoryTracker

    values = dict(config)
    hf_config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    hf_config._attn_implementation = "sdpa"
    hf_config.use_cache = False  # HF Trainer sets model.config.use_cache = args.use_cache (False by default)
    fp32 = precision == "fp32" or (precision == "mixed-bf16" and not lora)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, dtype=torch.float32 if fp32 else torch.bfloat16
        )
        model.train()
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            import peft

            model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
            if recompute:
                model.enable_input_require_grads()
    ids = torch.randint(0, config["vocab_size"], (batch, seq))
    tracker = MemoryTracker()
    tracker.register_model(model)
    tracker.register(ids)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adafactor":
        step_with: Any = torch.optim.Adafactor(trainable, lr=1e-2, foreach=False)
    else:
        step_with = torch.optim.AdamW(trainable, fused=True)
    autocast = precision == "mixed-bf16"
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    from vramlens.simulator.build import cuda_sdpa_backend  # SDPA on CUDA's backend (fp32 + GQA: math)

    with tracker, cuda_sdpa_backend():
        for _ in range(2):
            with amp:
                out = model(input_ids=ids, labels=ids)
            if autocast:
                out["logits"] = out["logits"].float()
            out.loss.backward()  # outputs kept through backward (the hf profile's loop)
            del out
            step_with.step()
            step_with.zero_grad(set_to_none=True)
    return tracker.peak


def workload(config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The vramlens workload of the same step."""
    lora = fields.pop("lora", False)
    recompute = fields.pop("recompute", False)
    from vramlens import model_from_config

    result: dict[str, Any] = {
        "model": model_from_config(dict(config)),
        "framework": "hf",
        "optimizer_impl": "fused",
        "attention": "sdpa",
        "recompute": "full" if recompute else "none",
        **fields,
    }
    if lora:
        result |= {"method": "lora", "lora": {"rank": 8, "alpha": 16, "targets": "all-linear"}}
    return result
