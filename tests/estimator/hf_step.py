"""Ground truth for whole training steps: live tensor bytes of a real transformers (+ PEFT)
training step on CPU, measured per phase with vramlens' ``StorageTracker``.

The second of two identical steps is measured (the first creates the optimizer state).
Autocast runs convert the model outputs to fp32 as accelerate does for HF Trainer.
Phases are separated with marks: forward (up to the loss), backward, optimizer step.
Needs the [hf] extra; imported by tests only.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any

#: A small Llama-shaped model; vocab 2000 keeps the logits a visible but not dominant term.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 2000,
    "max_position_embeddings": 4096,
}


@dataclass(frozen=True, kw_only=True)
class Step:
    """One training configuration, expressed for both torch and a vramlens workload."""

    precision: str = "bf16"
    method: str = "full"
    optimizer_impl: str = "fused"
    optimizer: str = "adamw"
    in_backward: bool = False
    """Step each parameter in its post-accumulate-grad hook (``optimizer_in_backward``)."""
    recompute: bool = False
    attention: str = "sdpa"
    targets: Any = "all-linear"
    batch: int = 4
    seq: int = 128
    config: dict[str, Any] = field(default_factory=lambda: dict(TINY_LLAMA))

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        workload: dict[str, Any] = {
            "model": model_from_config(self.config),
            "precision": self.precision,
            "method": self.method,
            "batch": self.batch,
            "seq": self.seq,
            "optimizer": self.optimizer,
            "optimizer_impl": self.optimizer_impl,
            "optimizer_in_backward": self.in_backward,
            "recompute": "full" if self.recompute else "none",
            "attention": self.attention,
        }
        if self.method == "lora":
            targets = self.targets if isinstance(self.targets, str) else list(self.targets)
            workload["lora"] = {"rank": 8, "alpha": 16, "targets": targets}
        return workload


def _model(step: Step) -> Any:
    import torch
    import transformers

    config = dict(step.config)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    hf_config._attn_implementation = step.attention
    # HF Trainer sets ``model.config.use_cache = args.use_cache`` (default False; trainer.py,
    # "Finalize"): no DynamicCache in the training forward. Under autocast the cache would hold fp32
    # copies of every layer's keys and values beside the bf16 casts SDPA keeps (until the outputs go).
    hf_config.use_cache = False
    fp32 = step.precision == "fp32" or (step.precision == "mixed-bf16" and step.method == "full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, dtype=torch.float32 if fp32 else torch.bfloat16
        )
    model.train()
    if step.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if step.method == "lora":
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=step.targets))
        if step.recompute:
            model.enable_input_require_grads()
    return model


def _optimizer(step: Step, params: list[Any]) -> Any:
    """The step's optimizer: torch AdamW in the named implementation, or transformers' Adafactor
    (fixed learning rate, no first moment: what ``optim="adafactor"`` gives HF Trainer)."""
    import torch

    if step.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False, warmup_init=False)
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "per-tensor": {"foreach": False}}
    return torch.optim.AdamW(params, lr=1e-4, **impl[step.optimizer_impl])


def _in_backward(step: Step, params: list[Any]) -> Any:
    """One optimizer per parameter stepped and cleared in the parameter's post-accumulate-grad
    hook (torchtune's ``optimizer_in_bwd``; forgather's ``fuse_optim_with_backward`` steps one
    optimizer whose only gradient is that parameter's): ``step()`` then does nothing."""

    def hook(param: Any) -> None:
        optimizers[param].step()
        optimizers[param].zero_grad(set_to_none=True)

    optimizers = {param: _optimizer(step, [param]) for param in params}
    for param in params:
        param.register_post_accumulate_grad_hook(hook)
    return _Nothing()


class _Nothing:
    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def measure_phases(step: Step) -> dict[str, int]:
    """Peak live tensor bytes of each phase of the second training step (no ``optimizer_step``
    phase when the optimizer runs in backward)."""
    import torch

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    model = _model(step)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _in_backward(step, params) if step.in_backward else _optimizer(step, params)
    ids = torch.randint(0, step.config["vocab_size"], (step.batch, step.seq))
    tracker = StorageTracker()
    tracker.register([list(model.parameters()), list(model.buffers()), ids])
    autocast = step.precision == "mixed-bf16"
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    from vramlens.simulator.build import cuda_sdpa_backend  # SDPA on CUDA's backend (fp32 + GQA: math)

    with tracker, cuda_sdpa_backend():
        for index in range(2):
            if index == 1:
                tracker.reset_peak()
                tracker.mark("start")
            with amp:
                out = model(input_ids=ids, labels=ids)
            if autocast:
                # accelerate's mixed precision (HF Trainer --bf16) wraps forward in
                # convert_outputs_to_fp32: the kept logits become fp32.
                out["logits"] = out["logits"].float()
            tracker.mark("forward")
            out.loss.backward()
            del out
            tracker.mark("backward")
            optimizer.step()
            tracker.mark("optimizer_step")
            optimizer.zero_grad(set_to_none=True)
    phases = {mark.name: mark.peak_since_previous for mark in tracker.marks[-3:]}
    if step.in_backward:
        del phases["optimizer_step"]
    return phases
