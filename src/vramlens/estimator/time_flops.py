"""FLOPs of one training micro-batch: matmuls, attention, backward and recompute.

Counting rules (one multiply-add = 2 FLOPs; Kaplan et al. 2020, Narayanan et al. 2021):

* Forward matmuls: ``2 x`` the active matmul parameters per token (every decoder linear,
  the router and the visited experts of MoE layers, and the LM head, which multiplies by
  ``V x h`` even when tied to the embedding). Embedding lookups and norms are not matmuls.
* Token-mixing core: attention (``QK^T`` and ``PV``) ``2 x H x (d_qk + d_v)`` FLOPs per attended key per
  token per layer (Mamba and linear-attention layers: their scan, :func:`scan_flops`), i.e. ``4 x s x d`` with ``d = H x head_dim``; causal masking halves it
  (``s/2`` keys on average), a sliding window ``w < s`` attends ``w - w^2/(2s)`` on average.
* Backward: full fine-tuning costs ``2x`` forward (input and weight gradients). Frozen
  weights (LoRA, QLoRA, freeze) only need input gradients, ``1x`` their forward, and only
  down to the first trainable module; the attention core's backward is ``2x`` its forward.
  Trainable adapters cost ``6 x`` their parameters per token.
* Recompute: full recompute repeats the forward of every checkpointed layer
  (``ceil(L / recompute_every)`` of ``L``; ``offload`` checkpoints every layer), selective
  recompute repeats the attention core only.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.model.components import MAMBA_MIXERS
from vramlens.model.params import expert_parameters
from vramlens.model.spec import MixerKind, MlpKind, ModelSpec
from vramlens.resolve.derived import checkpointed_layers
from vramlens.workload.options import Method, Recompute
from vramlens.workload.spec import ALL_LINEAR, Workload

__all__ = [
    "MicroBatchFlops",
    "adapter_parameters",
    "attention_core_flops",
    "layer_matmul_parameters",
    "micro_batch_flops",
    "scan_flops",
    "trainable_parameters",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatchFlops:
    """FLOPs of one micro-batch of the whole model (all GPUs together)."""

    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        """Forward + backward + recompute."""
        return self.forward + self.backward + self.recompute


def layer_matmul_parameters(spec: ModelSpec) -> float:
    """Matmul parameters a token passes through in the decoder layers (all layers)."""
    parts = spec.parameter_breakdown
    non_layer = (
        parts.embedding
        + parts.position_embedding
        + parts.norms
        + parts.final_norm
        + parts.lm_head
        + parts.outside_decoder
    )
    return float(spec.active_parameters - non_layer)


def _attended_keys(seq: int, window: int | None) -> float:
    """Average keys a query attends to under a causal mask (and a sliding window)."""
    if window is None or window >= seq:
        return seq / 2
    return window - window * window / (2 * seq)


def attention_core_flops(spec: ModelSpec, seq: int) -> float:
    """Forward FLOPs per token of the token-mixing cores, summed over layers: ``QK^T`` and ``PV``
    in the layers that attend, plus the scans of the layers with a state (:func:`scan_flops`)."""
    att = spec.attn
    if att.mla is not None:
        width = att.num_heads * (att.mla.qk_head_dim + att.mla.v_head_dim)
    else:
        width = att.num_heads * 2 * att.head_dim
    attention = sum(2.0 * width * _attended_keys(seq, layer.window) for layer in spec.layers if layer.attends)
    return attention + sum(scan_flops(spec, layer.mixer) for layer in spec.layers)


def scan_flops(spec: ModelSpec, mixer: MixerKind) -> float:
    """Forward FLOPs per token of one layer's recurrent scan, beside its projections (counted as
    matmul parameters): a selective scan updates and reads a ``d_inner x N`` state per token,
    about ``6 d_inner N`` (discretize, update, read: Gu & Dao, arXiv:2312.00752 §3.3); the gated
    delta rule updates and reads a ``dk x dv`` state per value head, about ``6 Hv dk dv``. 0 for
    attention and for layers without a mixer."""
    if mixer in MAMBA_MIXERS and spec.mamba is not None:
        return 6.0 * spec.mamba.recurrent_state_elements
    if mixer is MixerKind.LINEAR_ATTENTION and spec.linear_attention is not None:
        return 6.0 * spec.linear_attention.recurrent_state_elements
    return 0.0


def _linear_shapes(spec: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """``name -> (in, out, copies per layer)`` of the standard decoder linears (dense layers)."""
    h, att = spec.hidden_size, spec.attn
    q, kv = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
    shapes = {"q_proj": (h, q, 1), "k_proj": (h, kv, 1), "v_proj": (h, kv, 1), "o_proj": (q, h, 1)}
    if spec.mlp is not None:
        inner = spec.mlp.intermediate_size
        if spec.mlp.kind is MlpKind.GATED:
            shapes["gate_proj"] = (h, inner, 1)
        shapes["up_proj"], shapes["down_proj"] = (h, inner, 1), (inner, h, 1)
    elif spec.moe is not None:
        inner, experts = spec.moe.expert_intermediate_size, spec.moe.num_experts
        shapes["gate_proj"], shapes["up_proj"] = (h, inner, experts), (h, inner, experts)
        shapes["down_proj"] = (inner, h, experts)
    return shapes


def adapter_parameters(spec: ModelSpec, workload: Workload) -> int:
    """LoRA adapter parameters: ``r x (in + out)`` per adapted linear (standard module names).

    An approximation for ranking: modules outside the standard names (fused ``qkv_proj``,
    MLA projections) are counted through the same shapes under ``all-linear`` only.
    """
    targets = workload.lora.targets
    rank = workload.lora.rank
    total = 0
    for name, (fan_in, fan_out, copies) in _linear_shapes(spec).items():
        if targets == ALL_LINEAR or name in targets:
            total += rank * (fan_in + fan_out) * copies
    return total * spec.num_layers


def _saved_module_parameters(spec: ModelSpec, workload: Workload) -> tuple[int, bool, bool]:
    """Parameters of ``lora.modules_to_save`` and whether they include the embedding / the head."""
    parts = spec.parameter_breakdown
    saved = workload.lora.modules_to_save
    embed = any("embed" in name for name in saved)
    head = any("lm_head" in name or name == "head" for name in saved)
    count = (parts.embedding if embed else 0) + (parts.lm_head if head else 0)
    return count, embed, head


def trainable_parameters(spec: ModelSpec, workload: Workload) -> int:
    """Parameters with gradients (and optimizer state): all, adapters + saved modules, or saved modules."""
    if workload.method is Method.FULL:
        return spec.num_parameters
    saved, _, _ = _saved_module_parameters(spec, workload)
    if workload.method is Method.FREEZE:
        return saved
    return adapter_parameters(spec, workload) + saved


def _recompute_fraction(spec: ModelSpec, workload: Workload) -> float:
    """Fraction of the layers' forward repeated in backward (full / offload recompute)."""
    if workload.recompute is Recompute.OFFLOAD:
        return 1.0
    if workload.recompute is Recompute.FULL:
        return checkpointed_layers(workload, spec.num_layers) / spec.num_layers
    return 0.0


def micro_batch_flops(spec: ModelSpec, workload: Workload, tokens: int) -> MicroBatchFlops:
    """FLOPs of one micro-batch of ``tokens`` tokens (``batch x seq``), whole model."""
    layers = 2.0 * layer_matmul_parameters(spec) * tokens
    head = 2.0 * spec.vocab_size * spec.hidden_size * tokens
    attention = attention_core_flops(spec, workload.seq) * tokens
    forward = layers + head + attention
    if workload.method is Method.FULL:
        backward = 2.0 * forward
    else:
        _, embed_trained, head_trained = _saved_module_parameters(spec, workload)
        through_layers = workload.method is not Method.FREEZE or embed_trained
        backward = head * (2.0 if head_trained else 1.0)
        if through_layers:
            backward += layers + 2.0 * attention
        if workload.method is not Method.FREEZE:
            adapters = 6.0 * adapter_parameters(spec, workload) * tokens
            forward += adapters / 3
            backward += adapters * 2 / 3
    recompute = _recompute_fraction(spec, workload) * (layers + attention)
    if workload.recompute is Recompute.SELECTIVE:
        recompute = attention
    return MicroBatchFlops(forward=forward, backward=backward, recompute=recompute)


def moe_expert_bytes_note(spec: ModelSpec) -> str | None:
    """A note on MoE counting (only the visited experts cost FLOPs)."""
    if spec.moe is None or not spec.num_moe_layers:
        return None
    per_expert = expert_parameters(spec.moe, spec.hidden_size)
    return (
        f"MoE: FLOPs count {spec.moe.experts_per_token} of {spec.moe.num_experts} experts per token "
        f"({per_expert:,} parameters each); routing imbalance is not modeled"
    )
