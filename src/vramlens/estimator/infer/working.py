"""Activation working memory of one inference forward step (nothing is kept for backward).

Only one layer's intermediates are alive at a time, beside the residual stream.
Units: bytes on one rank; ``tokens`` = all tokens of the step (batch x new tokens).

* transformers (eager PyTorch modules, checked tensor by tensor against the simulator's
  prefill peak, ``tests/simulator/test_agreement.py``): hidden-size tensors held by Python
  references - the embedding output the model's ``forward`` keeps in a local
  (``HfStyle.held_embeddings``), the residual and the normed input, and during the MLP the
  tensors the layer still holds (``HfStyle.mlp_held``: its input, or the attention
  output of a parallel block); the rotary ``cos``/``sin`` tables; attention holds q, k,
  v and the rotary copies of q and k, then the attention output and the o_proj output;
  the MLP its widest moment (:func:`hf_mlp_tensors`: ``act(gate)``, ``up`` and their
  product, or the activation function's own temporaries, ``act_fns.ActivationFn.forward_peak``).
  Eager attention adds the scores at the softmax (:func:`eager_scores_bytes`) and its
  additive masks; SDPA a boolean mask where a sliding window is shorter than the keys.
  Source: the decoder layer and model ``forward`` of modeling_llama.py, modeling_gpt2.py,
  modeling_phi.py, modeling_phi3.py (fused gate_up) in transformers 5.x.
* vLLM: hidden state and residual (``2 t h``); a fused qkv projection and the
  attention output; the merged gate_up output and ``SiluAndMul`` (``3 t i``); MoE
  layers through fused_moe's three intermediate caches (``t k (2i + i + h)``).
  Source: vllm/model_executor/models/llama.py, layers/fused_moe/fused_moe.py.

MoE layers in transformers 5 run every routed (token, expert) copy at once through grouped
matmuls (:func:`routed_copy_elements`), beside the float32 router logits and softmax; the
shared expert runs beside the routed experts' output.
"""

from __future__ import annotations

from vramlens.estimator.act_fns import activation_fn
from vramlens.estimator.infer.engines import sampler_bytes_per_logit
from vramlens.estimator.infer.kv_cache import kv_heads_per_rank
from vramlens.estimator.infer.mixer_working import hf_mixer_working_bytes
from vramlens.model.components import FfnKind, MlpKind, MoeSpec, PositionKind
from vramlens.model.modules import layer_linears
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import hf_style
from vramlens.workload.options import AttentionImpl

__all__ = [
    "attention_mask_bytes",
    "eager_scores_bytes",
    "hf_layer_working_bytes",
    "hf_mlp_tensors",
    "logits_bytes",
    "sampler_bytes",
    "vllm_layer_working_bytes",
]


def _attention_elements(spec: ModelSpec, tokens: int, tp: int, *, fused_qkv: bool) -> int:
    """Elements of attention intermediates per step (q/k/v, rotary copies, outputs)."""
    attention = spec.attn
    heads = attention.num_heads // tp
    mla = attention.mla
    if mla is not None:
        per_token = heads * (2 * mla.qk_head_dim + mla.qk_nope_head_dim + 2 * mla.v_head_dim)
        return tokens * (per_token + mla.kv_lora_rank + mla.qk_rope_head_dim + spec.hidden_size)
    kv = kv_heads_per_rank(attention.num_kv_heads, tp)
    hd = attention.head_dim
    if fused_qkv:  # qkv buffer (rotary applied in place) + attention output + o_proj output
        return tokens * (hd * (2 * heads + 2 * kv) + spec.hidden_size)
    return tokens * (hd * (2 * heads + 3 * kv) + spec.hidden_size)


def eager_scores_bytes(spec: ModelSpec, *, batch: int, seq_q: int, seq_kv: int, compute_bytes: int, tp: int) -> int:
    """Eager attention's scores at the softmax, the widest moment of the layer.

    Units: bytes, ``batch x heads/tp x seq_q x seq_kv`` elements times: ``c + 4 + 4`` where
    the family up-casts (``softmax(x, dtype=float32)`` converts a bf16 input to a float32
    copy before the float32 output: ATen ``softmax`` fuses the cast only for fp16 on CUDA),
    ``2c`` otherwise (in-dtype softmax: input and output; fp32 scores: the cast is a no-op).
    """
    style = hf_style(spec.model_type)
    c = compute_bytes
    rows = batch * (spec.num_heads // tp) * seq_q
    if spec.attn.sinks:
        # gpt-oss: the masked scores, their concatenation with the sink logits and the
        # max-subtracted logits (s + 1 columns each) are alive together, in the scores' dtype.
        return rows * c * (seq_kv + 2 * (seq_kv + 1))
    per_element = c + 8 if (style.eager_softmax_fp32 and c < 4) else 2 * c
    return rows * seq_kv * per_element


def attention_mask_bytes(
    spec: ModelSpec, *, attention: AttentionImpl, batch: int, seq_q: int, seq_kv: int, compute_bytes: int
) -> int:
    """4-D attention masks transformers builds once per forward (shared by the layers).

    Units: bytes. Eager: one additive ``batch x seq_q x seq_kv`` mask in the compute dtype per
    attention kind (full, sliding, chunked). SDPA: none for causal attention (``is_causal``), a
    boolean one per sliding window shorter than the keys or attention chunk they reach. Flash
    attention: none.
    Layers without attention (Mamba, linear attention) read none.
    Source: transformers masking_utils.py (sdpa_mask, eager_mask, _ignore_causal_mask_sdpa).
    """
    kinds = {(layer.window, layer.chunk) for layer in spec.layers if layer.attends}
    if attention is AttentionImpl.EAGER:
        return len(kinds) * batch * seq_q * seq_kv * compute_bytes
    if attention is AttentionImpl.FLASH:
        return 0
    # A sliding window masks once the keys outnumber it, an attention chunk once they reach it.
    biting = {(w, c) for w, c in kinds if (w is not None and w < seq_kv) or (c is not None and c <= seq_kv)}
    return len(biting) * batch * seq_q * seq_kv


def _held_bytes_per_token(spec: ModelSpec, compute_bytes: int, *, mlp: bool) -> int:
    """Hidden-size tensors and rotary tables alive through a transformers layer, per token.

    Attention: the held embeddings, the residual (the layer input) and the normed input.
    MLP: the held embeddings, what the layer holds (``HfStyle.mlp_held``), the residual and
    the MLP's normed input (none in OLMo 2, which norms after the MLP).
    """
    style = hf_style(spec.model_type)
    if mlp:
        normed = 1 if (style.pre_mlp_norm or spec.parallel_residual) else 0
        hidden = style.held_embeddings + style.mlp_held + 1 + normed
    else:
        hidden = style.held_embeddings + 1 + (1 if style.pre_attn_norm else 0)
    rotary = 0
    if spec.position.kind is PositionKind.ROPE:
        rotary = 2 * style.rope_sets * int(spec.attn.head_dim * spec.position.rotary_fraction)
    return (hidden * spec.hidden_size + rotary) * compute_bytes


def hf_mlp_tensors(spec: ModelSpec) -> int:
    """Tensors of the inner width alive at once in a transformers dense MLP (no grad).

    Plain ``down(act(up(x)))``: the activation function's peak (input and output included;
    ``gelu_new`` 4). Gated ``down(act(gate(x)) * up(x))``: ``act(gate)``, ``up`` and the
    product (3), or the activation's peak if wider. Phi-3's fused ``gate_up_proj``: its
    2-wide output stays alive (``gate`` is a view of it) beside the activation and the product.
    """
    assert spec.mlp is not None
    peak = activation_fn(spec.mlp.activation).forward_peak
    if spec.mlp.kind is MlpKind.PLAIN:
        return peak
    fused = any(s.group == "mlp_in" and s.out_features == 2 * spec.mlp.intermediate_size for s in layer_linears(spec))
    return max(1 + peak, 4) if fused else max(peak, 3)


def _ffn_kinds(spec: ModelSpec) -> set[bool]:
    """Whether the layers with a feed-forward block use the MoE block (True) or the dense MLP (False)."""
    return {layer.ffn is FfnKind.MOE for layer in spec.layers if layer.ffn is not FfnKind.NONE}


def _mlp_elements(
    spec: ModelSpec, tokens: int, tp: int, *, moe_layer: bool, fused: bool, compute_bytes: int = 2
) -> int:
    moe = spec.moe
    if moe_layer and moe is not None:
        k, experts, inner = moe.experts_per_token, moe.num_experts, moe.expert_intermediate_size // tp
        shared = 3 * tokens * moe.shared_intermediate_size // tp
        if fused:  # fused_moe intermediate caches over all routed (token, expert) pairs
            return tokens * experts + tokens * k * (3 * inner + spec.hidden_size) + shared
        router = 5 * tokens * experts  # logits, float32 softmax and top-k weights (~5 bf16 elements)
        if hf_style(spec.model_type).dense_experts:
            return router + dense_experts_elements(spec, tokens, tp)
        # float32 routing weights (DeepSeek, GLM: their routers run in float32) promote the weighted outputs.
        wide = 2 if hf_style(spec.model_type).router_fp32 and compute_bytes < 4 else 1
        routed = tokens * k * routed_copy_elements(moe, spec.hidden_size, inner, weights_widths=wide)
        return router + max(routed, shared + tokens * spec.hidden_size)
    assert spec.mlp is not None
    width = 2 if spec.mlp.kind is MlpKind.PLAIN else 3
    return width * tokens * spec.mlp.intermediate_size // tp


#: Expert gates written out in a family's code: expert-width tensors alive at once per routed copy,
#: the gate/up output (two widths) included. gpt-oss (GptOssExperts._apply_gate): the gate/up output,
#: the clamped gate and up, ``gate * alpha``, its sigmoid and ``glu`` (then ``up + 1`` and the product).
_EXPERT_GATE_PEAK = {"clamped_swiglu": 7}


def routed_copy_elements(moe: MoeSpec, hidden: int, inner: int, *, weights_widths: int = 1) -> int:
    """Elements alive at the widest moment of transformers 5's grouped experts, per routed copy
    of a token (``integrations/moe.py`` ``grouped_mm_experts_forward``, no grad), the larger of:

    * up: the gathered input (``hidden``), the gate/up output and the gate's temporaries
      (``inner`` wide: 2 + the activation's own, at least act(gate) and the product), and with
      expert biases (gpt-oss) the gathered ``gate_up_proj_bias`` rows (2 more);
    * down: the gathered input (still a local), the down output, the output weighted by the
      router and its copy back in token order (``weights_widths`` compute-dtype elements each:
      2 when float32 routing weights promote them from bf16).

    Measured with the simulator on OLMoE, GLM-4.5 and gpt-oss shapes."""
    if moe.expert_kind is MlpKind.PLAIN:
        widths = 1 + max(activation_fn(moe.activation).forward_peak - 1, 1)
    else:
        widths = _EXPERT_GATE_PEAK.get(moe.activation) or 2 + max(activation_fn(moe.activation).forward_peak - 1, 2)
    if moe.expert_bias:
        widths += 2 if moe.expert_kind is MlpKind.GATED else 1
    return max(hidden + widths * inner, hidden * (2 + 2 * weights_widths))


def _masked_sdpa_bytes(spec: ModelSpec, *, batch: int, seq_q: int, seq_kv: int, compute_bytes: int, tp: int) -> int:
    """What SDPA adds in a sliding-window layer whose window is shorter than the keys: transformers
    hands it a mask, so GQA keys and values are repeated to every head (``repeat_kv``) and the
    kernel turns the boolean mask into an additive bias in the query dtype for the call. With one KV
    head (on the rank) the repeat is a view: the reshape of the expanded keys merges the size-1 head
    dimension with the stride-0 one, so nothing is copied (Gemma 3 1B). Bytes."""
    if spec.attn.mla is not None or not any(w is not None and w < seq_kv for w in {la.window for la in spec.layers}):
        return 0
    heads, kv = spec.num_heads // tp, kv_heads_per_rank(spec.num_kv_heads, tp)
    repeated = 2 * (heads - kv) * spec.attn.head_dim * batch * seq_q if heads != kv and kv > 1 else 0
    return (repeated + batch * seq_q * seq_kv) * compute_bytes


def _fp32_rope_bytes(spec: ModelSpec, tokens: int, tp: int, *, compute_bytes: int) -> int:
    """Cohere applies rotary embeddings in fp32 (``q.float()``, ``k.float()``): beside q, k and v
    the fp32 query and key, ``q * cos``, the interleaved ``rotate_half(q)`` and its product with
    ``sin`` are alive at once (counted with the simulator). 0 for families that rotate in place dtype."""
    if not hf_style(spec.model_type).rope_fp32:
        return 0
    q = spec.num_heads // tp * spec.attn.head_dim
    kv = kv_heads_per_rank(spec.num_kv_heads, tp) * spec.attn.head_dim
    return tokens * (compute_bytes * (q + 2 * kv) + 4 * (4 * q + kv))


def dense_experts_elements(spec: ModelSpec, tokens: int, tp: int) -> int:
    """Peak intermediates of Llama 4's experts (every expert on every token, no grad), elements.

    ``E x tokens`` rows: the input copies and their score-scaled product (``2h`` while the
    product is made), then in ``Llama4TextExperts`` the scaled input (``h``), the fused
    gate/up output (``2i``), the activation and the product (``i`` each), then the down output
    (``h``) beside the scaled input, the gate/up output and the product: the larger of
    ``h + 4i`` and ``2h + 3i`` per row. Source: transformers ``modeling_llama4.py``."""
    moe = spec.moe
    assert moe is not None
    h, inner = spec.hidden_size, moe.expert_intermediate_size // tp
    rows = tokens * moe.num_experts
    return rows * max(2 * h, h + 4 * inner, 2 * h + 3 * inner)


def hf_layer_working_bytes(
    spec: ModelSpec,
    *,
    batch: int,
    seq_q: int,
    seq_kv: int,
    attention: AttentionImpl,
    compute_bytes: int,
    tp: int = 1,
) -> int:
    """Peak intermediates of one transformers decoder layer for ``batch x seq_q`` new tokens
    attending to ``seq_kv`` tokens (the larger of its attention and MLP working sets, with
    the tensors held beside each and the attention masks)."""
    tokens, c = batch * seq_q, compute_bytes
    if attention is AttentionImpl.EAGER and spec.attn.mla is None:
        # At the softmax: the rotary queries and the keys/values repeated to every head (GQA), or
        # for MHA the fused or partially rotated projections they are views of; MQA's repeat is
        # a view (stride 0), leaving the queries.
        widths = 1 if spec.num_kv_heads == 1 < spec.num_heads else 3
        attn = widths * (spec.num_heads // tp) * spec.attn.head_dim * tokens * c
        attn += eager_scores_bytes(spec, batch=batch, seq_q=seq_q, seq_kv=seq_kv, compute_bytes=c, tp=tp)
    else:
        attn = _attention_elements(spec, tokens, tp, fused_qkv=False) * c
        if attention is AttentionImpl.EAGER:
            attn += eager_scores_bytes(spec, batch=batch, seq_q=seq_q, seq_kv=seq_kv, compute_bytes=c, tp=tp)
        elif attention is not AttentionImpl.FLASH:
            attn += _masked_sdpa_bytes(spec, batch=batch, seq_q=seq_q, seq_kv=seq_kv, compute_bytes=c, tp=tp)
        attn = max(attn, _fp32_rope_bytes(spec, tokens, tp, compute_bytes=c))
    attn += tokens * _held_bytes_per_token(spec, c, mlp=False)
    kinds = _ffn_kinds(spec)
    if spec.mlp is not None and kinds == {False}:
        mlp = hf_mlp_tensors(spec) * tokens * spec.mlp.intermediate_size // tp * c
    else:
        mlp = (
            max(
                (_mlp_elements(spec, tokens, tp, moe_layer=moe, fused=False, compute_bytes=c) for moe in kinds),
                default=0,
            )
            * c
        )
    mlp += tokens * _held_bytes_per_token(spec, c, mlp=True)
    masks = attention_mask_bytes(spec, attention=attention, batch=batch, seq_q=seq_q, seq_kv=seq_kv, compute_bytes=c)
    mixers = {layer.mixer for layer in spec.layers}
    state = max(
        (hf_mixer_working_bytes(spec, kind, batch=batch, seq_q=seq_q, compute_bytes=c) for kind in mixers), default=0
    )
    if state:  # a Mamba / linear-attention mixer, beside the hidden tensors an attention half holds
        state += tokens * _held_bytes_per_token(spec, c, mlp=False)
    return max(attn, mlp, state) + masks


def vllm_layer_working_bytes(spec: ModelSpec, *, tokens: int, compute_bytes: int, tp: int = 1) -> int:
    """Peak intermediates of one vLLM decoder layer over a step of ``tokens`` tokens."""
    residual = 2 * tokens * spec.hidden_size
    attn = _attention_elements(spec, tokens, tp, fused_qkv=True)
    kinds = _ffn_kinds(spec)
    mlp = max((_mlp_elements(spec, tokens, tp, moe_layer=moe, fused=True) for moe in kinds), default=0)
    return (residual + max(attn, mlp)) * compute_bytes


def logits_bytes(spec: ModelSpec, *, rows: int, compute_bytes: int) -> int:
    """LM head output for ``rows`` positions and its float32 copy for sampling: ``rows x V x (c + 4)``."""
    return rows * spec.vocab_size * (compute_bytes + 4)


def sampler_bytes(spec: ModelSpec, *, rows: int, compute_bytes: int) -> int:
    """vLLM's sampler high point over ``rows`` sequences (engines.SAMPLER_TENSORS per logit)."""
    return rows * spec.vocab_size * sampler_bytes_per_logit(compute_bytes)
