"""Per-sequence caches of Mamba and linear-attention layers, and vLLM's hybrid page layout.

A Mamba or gated-DeltaNet layer caches, per sequence, a convolution state and a recurrent
state whose sizes do not grow with the context (Units: bytes):

* transformers ``DynamicCache`` (``LinearAttentionLayer``, cache_utils.py): the convolution state
  is ``conv_dim x d_conv`` in the compute dtype (``lazy_initialization`` with
  ``conv_kernel_size``), the recurrent state is a ``zeros_like`` of the scan's final state, which
  the torch implementations compute in fp32: Mamba 1 ``d_inner x N``, Mamba 2 ``heads x head_dim
  x N``, gated DeltaNet ``value_heads x key_head_dim x value_head_dim``.
* vLLM (``MambaStateShapeCalculator``, vllm/model_executor/layers/mamba/mamba_utils.py): the
  convolution state keeps ``d_conv - 1`` positions of ``conv_dim / tp`` channels (Mamba 2 adds
  ``tp - groups`` replicated groups when the groups do not divide tp), the recurrent state
  ``heads / tp`` (Mamba 1: ``d_inner / tp`` channels); both in the model dtype
  (``mamba_cache_dtype`` and ``mamba_ssm_cache_dtype`` ``auto``,
  ``MambaStateDtypeCalculator``).

vLLM's V1 hybrid KV cache manager gives every layer the same page size: the attention block size
is raised to the smallest multiple of 16 tokens whose page (one layer's keys and values for the
block) holds one Mamba state, and the Mamba page is padded up to it
(``HybridAttentionMambaModelConfig.verify_and_update_config``, vllm/model_executor/models/config.py,
without prefix caching). Layers are grouped by type into groups of ``g`` layers, ``g`` the
smallest layer count of a type (the largest when it is under 1.5 times the smallest); the pool is
``g`` tensors of ``num_blocks`` pages, one layer of every group sharing each tensor
(``_get_kv_cache_groups_uniform_page_size``, vllm/v1/core/kv_cache_utils.py). A sequence needs,
per attention group, a block per ``block_size`` tokens, and per Mamba group one block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramlens.estimator.infer.kv_cache import cached_tokens, kv_elements_per_token
from vramlens.model.components import LayerSpec, MixerKind
from vramlens.model.spec import ModelSpec
from vramlens.model.ssm import MambaVersion

__all__ = [
    "HybridPages",
    "hf_state_bytes",
    "hybrid_pages",
    "state_layers",
    "vllm_state_bytes",
]

FP32 = 4
#: vLLM attention kernels take block sizes in multiples of this many tokens.
VLLM_BLOCK_ALIGNMENT = 16


def _hf_mamba(spec: ModelSpec, compute_bytes: int) -> int:
    m = spec.mamba
    assert m is not None
    return compute_bytes * m.conv_dim * m.conv_kernel + FP32 * m.recurrent_state_elements


def _hf_deltanet(spec: ModelSpec, compute_bytes: int) -> int:
    g = spec.linear_attention
    assert g is not None
    return compute_bytes * g.conv_dim * g.conv_kernel + FP32 * g.recurrent_state_elements


def _vllm_mamba(spec: ModelSpec, state_bytes: int, tp: int) -> int:
    m = spec.mamba
    assert m is not None
    if m.version is MambaVersion.MAMBA1:
        conv = m.intermediate_size // tp * (m.conv_kernel - 1)
        ssm = m.intermediate_size // tp * m.state_size
    else:
        groups = m.n_groups + (0 if m.n_groups % tp == 0 else tp - m.n_groups)
        conv = (m.intermediate_size + 2 * groups * m.state_size) // tp * (m.conv_kernel - 1)
        ssm = m.num_heads // tp * m.head_dim * m.state_size
    return state_bytes * (conv + ssm)


def _vllm_deltanet(spec: ModelSpec, state_bytes: int, tp: int) -> int:
    g = spec.linear_attention
    assert g is not None
    conv = g.conv_dim // tp * (g.conv_kernel - 1)
    return state_bytes * (conv + g.num_value_heads // tp * g.key_head_dim * g.value_head_dim)


_HF: dict[MixerKind, Callable[[ModelSpec, int], int]] = {
    MixerKind.MAMBA: _hf_mamba,
    MixerKind.ATTENTION_AND_MAMBA: _hf_mamba,
    MixerKind.LINEAR_ATTENTION: _hf_deltanet,
}
_VLLM: dict[MixerKind, Callable[[ModelSpec, int, int], int]] = {
    MixerKind.MAMBA: _vllm_mamba,
    MixerKind.ATTENTION_AND_MAMBA: _vllm_mamba,
    MixerKind.LINEAR_ATTENTION: _vllm_deltanet,
}


def state_layers(layers: Sequence[LayerSpec]) -> list[LayerSpec]:
    """The layers that keep a per-sequence state."""
    return [layer for layer in layers if layer.mixer in _HF]


def hf_state_bytes(spec: ModelSpec, layers: Sequence[LayerSpec], *, sequences: int, compute_bytes: int) -> int:
    """Bytes of the convolution and recurrent states transformers caches for ``sequences`` sequences
    over ``layers`` (see the module docstring); 0 for layers without a state."""
    return sequences * sum(_HF[layer.mixer](spec, compute_bytes) for layer in state_layers(layers))


def vllm_state_bytes(spec: ModelSpec, mixer: MixerKind, *, state_bytes: int, tp: int = 1) -> int:
    """One layer's per-sequence state in vLLM (its Mamba page before padding), bytes."""
    return _VLLM[mixer](spec, state_bytes, tp)


@dataclass(frozen=True, kw_only=True, slots=True)
class HybridPages:
    """vLLM's page layout for a model with per-sequence states (one pipeline stage, one rank)."""

    block_size: int
    """Tokens per attention block (raised so that a page holds a Mamba state)."""
    page_bytes: int
    """Bytes of one page: one layer's block (attention) or state (Mamba, padded)."""
    group_size: int
    """Layers per KV cache group: the pool is this many tensors of ``num_blocks`` pages."""
    attention_groups: tuple[int | None, ...]
    """The window (None: full attention) of each attention group."""
    state_groups: int
    """Groups of Mamba / linear-attention layers (one block per sequence each)."""

    @property
    def block_bytes(self) -> int:
        """Bytes one block number takes across the pool (a page in each of ``group_size`` tensors)."""
        return self.page_bytes * self.group_size

    def blocks_per_sequence(self, tokens: int) -> int:
        """Blocks one sequence of ``tokens`` tokens holds: per attention group its tokens in whole
        blocks (window-capped), per state group one."""
        attention = sum(math.ceil(cached_tokens(tokens, window) / self.block_size) for window in self.attention_groups)
        return attention + self.state_groups


def _group_size(counts: Sequence[int]) -> int:
    smallest, largest = min(counts), max(counts)
    return largest if largest < 1.5 * smallest else smallest


def hybrid_pages(
    spec: ModelSpec, layers: Sequence[LayerSpec], *, kv_bytes: int, state_bytes: int, tp: int, block_size: int
) -> HybridPages:
    """vLLM's page layout for ``layers`` (see the module docstring); ``block_size`` is the requested
    attention block size, raised when a page would not hold a state."""
    per_token = kv_elements_per_token(spec.attn, tp=tp) * kv_bytes  # one attention layer
    attending = [layer.window for layer in layers if layer.attends]
    states = state_layers(layers)
    state_page = max(
        (vllm_state_bytes(spec, layer.mixer, state_bytes=state_bytes, tp=tp) for layer in states), default=0
    )
    if attending and per_token:
        needed = VLLM_BLOCK_ALIGNMENT * math.ceil(state_page / (VLLM_BLOCK_ALIGNMENT * per_token))
        block = max(block_size, needed)
        page = block * per_token
    else:  # no attention layer: a page is one state
        block, page = block_size, state_page
    # vLLM registers Falcon-H1's attention and Mamba halves as separate layers of each type.
    counts = {"state": len(states)}
    windows: dict[int | None, int] = {}
    for window in attending:
        windows[window] = windows.get(window, 0) + 1
    group = _group_size([count for count in (*windows.values(), len(states)) if count])
    attention_groups = tuple(w for w, count in windows.items() for _ in range(math.ceil(count / group)))
    return HybridPages(
        block_size=block,
        page_bytes=page,
        group_size=group,
        attention_groups=attention_groups,
        state_groups=math.ceil(counts["state"] / group),
    )
