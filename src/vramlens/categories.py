"""Memory categories shared by every engine (DESIGN.md "Vocabulary")."""

from __future__ import annotations

from vramlens._compat import StrEnum

__all__ = ["CATEGORY_ORDER", "Category", "LEVEL_CATEGORIES", "TORCH_PROFILER_CATEGORIES"]


class Category(StrEnum):
    """Where a byte of GPU memory goes."""

    PARAMETERS = "parameters"
    """Model weights (frozen or trainable), at their storage dtype."""
    GRADIENTS = "gradients"
    """Gradients of trainable parameters (and DDP gradient buckets)."""
    OPTIMIZER_STATE = "optimizer_state"
    """Optimizer moments and fp32 master weights."""
    ACTIVATIONS = "activations"
    """Tensors saved in the forward pass for the backward pass (and recomputed ones)."""
    KV_CACHE = "kv_cache"
    """Inference key/value cache."""
    TEMPORARY = "temporary"
    """Short-lived working memory: optimizer-step intermediates, logits and loss, gathered
    shards, dequantized weights, gradient buffers of the current layer."""
    INPUTS = "inputs"
    """Input ids, labels, attention masks, position tensors."""
    BUFFERS = "buffers"
    """Module buffers (rotary tables, router biases)."""
    OTHER = "other"
    ALLOCATOR_SLACK = "allocator_slack"
    """Reserved but not allocated: block rounding, fragmentation, cached free blocks (reserved - allocated)."""
    RUNTIME = "runtime"
    """Outside PyTorch's allocator: CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers (device - reserved)."""


#: Category codes of timelines (index into this tuple) and the stacking order of every picture,
#: bottom first. Fixed order; saved files carry the names, so adding a category later does not
#: break old files.
CATEGORY_ORDER: tuple[Category, ...] = tuple(Category)

#: Categories that make up each memory level.
LEVEL_CATEGORIES = {
    "allocated": tuple(c for c in Category if c not in (Category.ALLOCATOR_SLACK, Category.RUNTIME)),
    "reserved": tuple(c for c in Category if c is not Category.RUNTIME),
    "device": tuple(Category),
}


#: torch.profiler's memory categories (``torch/profiler/_memory_profiler.py``: ``Category``
#: names in ``_CATEGORY_TO_INDEX`` order, then "unknown" for tensors it could not label) and
#: the vramlens category each counts as. Its exports name them in capitals, the snapshots
#: ``torch.cuda._memory_viz._profile_to_snapshot`` synthesises in lower case. AUTOGRAD_DETAIL
#: (outputs left over in the backward scope) counts as temporary, as the tracker counts
#: backward-pass tensors.
TORCH_PROFILER_CATEGORIES: tuple[tuple[str, Category], ...] = (
    ("PARAMETER", Category.PARAMETERS),
    ("OPTIMIZER_STATE", Category.OPTIMIZER_STATE),
    ("INPUT", Category.INPUTS),
    ("TEMPORARY", Category.TEMPORARY),
    ("ACTIVATION", Category.ACTIVATIONS),
    ("GRADIENT", Category.GRADIENTS),
    ("AUTOGRAD_DETAIL", Category.TEMPORARY),
    ("unknown", Category.OTHER),
)
