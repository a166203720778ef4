"""Seed 002's own activation count, made the way the guide makes it, for ``vramlens activations``.

The guide "Visualize and understand GPU memory in PyTorch" (seed ``002``) hooks **every**
module (``model.modules()``, nested ones and the decoder layers included), appends
``output.numel() * output.element_size()`` for each tensor output (tensors inside tuples/lists
too), runs one token through a float32 model in eval mode under ``torch.no_grad()``, and calls
the sum "activations per token": 5,065,216 for Qwen2.5-1.5B. That number is bytes of float32
outputs (4 x 1,266,304 elements), and it counts a layer's output again in its MLP's and in
``down_proj``'s. Rebuilt here on fake tensors from the model's config (no weights), so the
comparison the guide makes can be shown beside vramlens's own count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens._extras import require
from vramlens.model.spec import ModelSpec

__all__ = ["SeedCount", "seed_count"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedCount:
    """The guide's figure for one model."""

    bytes_per_token: int
    """Its "activations per token": float32 bytes of every module's outputs for one token."""
    modules: int
    """Modules hooked."""

    @property
    def elements_per_token(self) -> int:
        """The same outputs as elements (bytes / 4, float32)."""
        return self.bytes_per_token // 4


def seed_count(spec: ModelSpec) -> SeedCount:
    """The guide's procedure on ``spec``: every module hooked, float32, eval, no_grad, input (1, 1)."""
    torch = require("torch", purpose="vramlens activations")
    require("transformers", purpose="vramlens activations")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens.simulator.build import build_model, real_code_paths
    from vramlens.workload.load import load_workload
    from vramlens.workload.options import AttentionImpl

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    model = build_model(
        spec, load_workload({"model": spec}), dtype=torch.float32, attention=AttentionImpl.SDPA, fake_mode=fake
    )
    sizes: list[int] = []

    def hook(module: Any, inputs: Any, output: Any) -> None:  # the guide's forward_hook
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        sizes.extend(t.numel() * t.element_size() for t in outputs if isinstance(t, torch.Tensor))

    handles = [module.register_forward_hook(hook) for module in model.modules()]
    model.eval()
    try:
        with real_code_paths(), fake, torch.no_grad():
            model(torch.zeros((1, 1), dtype=torch.int64))
    finally:
        for handle in handles:
            handle.remove()
    return SeedCount(bytes_per_token=sum(sizes), modules=len(handles))
