"""Which optimizer state a bitsandbytes paged optimizer really pages: decided per tensor.

bitsandbytes ``Optimizer8bit.get_state_buffer`` (optim/optimizer.py, 0.45-0.50) allocates a state
buffer in CUDA unified memory (``F.get_paged``, outside PyTorch's caching allocator: nvidia-smi
sees it while it is resident, ``max_memory_allocated`` never) only when the optimizer is paged
*and* the parameter has at least 1e5 elements (``if not self.is_paged or p.numel() < 1e5:
return torch.zeros_like(...)``); smaller tensors get ordinary allocator tensors. The 8-bit
optimizers (``init_state``) keep two fp32 moments for tensors under ``min_8bit_size`` = 4096
elements, else two uint8 moments (through ``get_state_buffer``, so paged by the same rule) and
two fp32 ``absmax`` vectors of one value per 256-element block, always from the allocator
(``torch.zeros``). The 32-bit optimizers keep two fp32 moments whatever the parameter dtype.

So LoRA adapters, whose matrices are ``rank x features`` (65536 elements at rank 16 and hidden
4096), page nothing: their state stays in ``allocated``. The split needs each trainable tensor's
size; :func:`group_tensor_sizes` lists them where the layout knows them exactly (their sum is
checked against the group's elements) and returns None otherwise, when the caller counts the
whole group as paged and says so.
"""

from __future__ import annotations

import math

from vramlens.categories import Category
from vramlens.estimator.layout import StageView, TrainableGroup, lora_targets
from vramlens.estimator.lora_head import HEAD_NAMES
from vramlens.estimator.optimizers import OptimizerModel
from vramlens.estimator.stage_memory import WHOLE_STEP, StageMemory
from vramlens.model.modules import layer_linears
from vramlens.resolve.context import TrainingContext

__all__ = ["EIGHT_BIT_MIN_ELEMENTS", "PAGED_MIN_ELEMENTS", "add_bnb_state", "group_tensor_sizes", "state_split"]

#: bitsandbytes optim/optimizer.py ``get_state_buffer``: ``p.numel() < 1e5`` is never paged.
PAGED_MIN_ELEMENTS = 100_000
#: bitsandbytes ``min_8bit_size`` default (Adam8bit/AdamW8bit and their paged variants): fp32 moments below it.
EIGHT_BIT_MIN_ELEMENTS = 4096
#: bitsandbytes 8-bit blockwise state: one fp32 absmax per 256 elements, per moment.
_BLOCK = 256


def _adapter_sizes(ctx: TrainingContext, stage: StageView, head: bool) -> list[int]:
    rank, targets = ctx.workload.lora.rank, lora_targets(ctx)
    if head:
        vocab = ctx.spec.vocab_size // ctx.workload.parallel.tp
        return [rank * ctx.spec.hidden_size, vocab * rank] if targets & HEAD_NAMES else []
    sizes: list[int] = []
    for index in stage.layer_range:
        for shape in layer_linears(ctx.spec, ctx.spec.layers[index].kind):
            if shape.name in targets:
                sizes += [rank * shape.in_features, rank * shape.out_features]
    return sizes


def _model_sizes(ctx: TrainingContext, stage: StageView) -> list[int] | None:
    """Every tensor of a dense model trained in full on one rank (tp 1): the linears' weights and
    biases, the norms (what is left of a layer, in hidden-sized vectors), the vocabulary tables."""
    spec = ctx.spec
    kinds = {spec.layers[i].kind for i in stage.layer_range}
    if ctx.workload.parallel.tp != 1 or len(kinds) > 1 or any(spec.layers[i].moe for i in stage.layer_range):
        return None
    h, breakdown = spec.hidden_size, spec.parameter_breakdown
    sizes: list[int] = []
    for index in stage.layer_range:
        shapes = layer_linears(spec, spec.layers[index].kind)
        sizes += [s.in_features * s.out_features for s in shapes] + [s.out_features for s in shapes if s.bias]
    rest = stage.layer_elements * len(stage.layer_range) - sum(sizes)
    if rest < 0 or rest % h:
        return None
    sizes += [h] * (rest // h)
    if stage.first:
        sizes += [breakdown.embedding, breakdown.position_embedding]
    if stage.last:
        sizes += [breakdown.lm_head, breakdown.final_norm]
    return [size for size in sizes if size]


def group_tensor_sizes(ctx: TrainingContext, stage: StageView, group: TrainableGroup) -> list[int] | None:
    """Elements of each tensor of ``group`` on this stage, or None where the layout does not know
    them exactly (their sum must be the group's elements)."""
    sizes: list[int] | None
    if group.name == "LoRA adapters":
        sizes = _adapter_sizes(ctx, stage, head=False)
    elif group.name == "LoRA adapter on the LM head":
        sizes = _adapter_sizes(ctx, stage, head=True)
    elif group.name == "model":
        sizes = _model_sizes(ctx, stage)
    else:
        sizes = None
    return sizes if sizes is not None and sum(sizes) == group.elements else None


def state_split(sizes: list[int], *, eight_bit: bool, paged: bool) -> tuple[int, int]:
    """(bytes the caching allocator holds, bytes in paged unified memory) of a bitsandbytes
    optimizer's state for tensors of ``sizes`` elements (the module docstring's rules); nothing is
    paged unless ``paged``."""
    allocator = in_pages = 0
    for elements in sizes:
        if not eight_bit or elements < EIGHT_BIT_MIN_ELEMENTS:
            moments = 2 * 4 * elements  # two fp32 moments
        else:
            moments = 2 * elements  # two uint8 moments
            allocator += 2 * 4 * math.ceil(elements / _BLOCK)  # two fp32 absmax vectors
        if paged and elements >= PAGED_MIN_ELEMENTS:
            in_pages += moments
        else:
            allocator += moments
    return allocator, in_pages


def _embedding_32bit(ctx: TrainingContext, stage: StageView, group: TrainableGroup, sizes: list[int]) -> list[int]:
    """The embedding tables a framework steps with 32-bit state under an 8-bit optimizer, taken out
    of ``sizes`` (transformers' Trainer.create_optimizer registers every ``nn.Embedding`` weight with
    ``GlobalOptimManager.register_module_override(module, "weight", {"optim_bits": 32})``)."""
    tables = [ctx.spec.parameter_breakdown.embedding, ctx.spec.parameter_breakdown.position_embedding]
    if not (ctx.profile.bnb_embeddings_32bit and group.name == "model" and stage.first):
        return []
    wide = [size for size in tables if size and size in sizes]
    for size in wide:
        sizes.remove(size)
    return wide


def add_bnb_state(
    ctx: TrainingContext, mem: StageMemory, group: TrainableGroup, optimizer: OptimizerModel, shards: int
) -> bool:
    """A bitsandbytes optimizer's state of ``group``, per tensor: what the allocator keeps becomes a
    term, a paged optimizer's paged buffers go to ``mem.paged_states_bytes`` (the device level).
    False (nothing added) where the tensor sizes are unknown or the state is sharded (``shards`` > 1:
    the optimizer sees flat shards, not these tensors); a paged optimizer's state then counts as
    paged in full, with a note."""
    sizes = group_tensor_sizes(ctx, mem.stage, group) if shards == 1 else None
    if sizes is None:
        if not optimizer.paged:
            return False
        mem.paged_states_bytes += int(optimizer.state_bytes(group.elements, group.state_bytes) / shards)
        mem.notes.append(f"paged optimizer: all state of {group.name} counted as paged (tensor sizes not split)")
        return True
    eight_bit = bool(optimizer.fixed_state_bytes)
    wide = _embedding_32bit(ctx, mem.stage, group, sizes) if eight_bit else []
    kept, paged = state_split(sizes, eight_bit=eight_bit, paged=optimizer.paged)
    kept_wide, paged_wide = state_split(wide, eight_bit=False, paged=optimizer.paged)
    mem.paged_states_bytes += paged + paged_wide
    mem.add(
        f"optimizer state ({group.name}; bitsandbytes, per tensor)",
        Category.OPTIMIZER_STATE,
        kept + kept_wide,
        lambda: _formula(sizes, wide, eight_bit=eight_bit, paged=optimizer.paged),
        into="states_bytes",
        alive=WHOLE_STEP,
    )
    return True


def _formula(sizes: list[int], wide: list[int], *, eight_bit: bool, paged: bool) -> str:
    parts = [f"{len(sizes) + len(wide)} tensors"]
    if eight_bit:
        parts.append(f"uint8 moments + fp32 absmax per {_BLOCK}; fp32 under {EIGHT_BIT_MIN_ELEMENTS:,} elements")
        if wide:
            parts.append("embedding tables in fp32 (Trainer's optim_bits=32 override)")
    else:
        parts.append("2 fp32 moments")
    if paged:
        parts.append(f"in the allocator: tensors under {PAGED_MIN_ELEMENTS:,} elements (never paged)")
    return "; ".join(parts)
