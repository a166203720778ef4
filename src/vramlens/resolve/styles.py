"""How each model family's transformers implementation keeps tensors for backward.

These are facts about the eager PyTorch code of ``transformers`` 5.x (read from
the modeling files, and checked by measuring the tensors autograd saves on CPU
in ``tests/estimator/test_activations_hf.py``). They decide per-layer activation
bytes in :mod:`vramlens.estimator.activations`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

__all__ = ["HF_STYLES", "HfStyle", "NormStyle", "hf_style", "litgpt_style", "torchtune_style"]


class NormStyle:
    """Names of norm implementations (what one norm keeps for backward)."""

    RMS = "rms"
    """LlamaRMSNorm: fp32 copy of the input, rsqrt per token, normalized tensor cast back to the input dtype."""
    RMS_FP32_WEIGHT = "rms-fp32-weight"
    """OLMo 2: like RMS but the weight is applied in fp32, so the normalized tensor is kept in fp32."""
    GEMMA = "gemma"
    """GemmaRMSNorm: computed in fp32 with (1 + weight); the normalized fp32 tensor is kept."""
    LAYERNORM = "layernorm"
    """nn.LayerNorm: keeps its input, and mean and rstd per token."""
    COHERE = "cohere"
    """Cohere2LayerNorm (bias-free LayerNorm written in fp32 arithmetic): ``x - mean`` is computed
    twice (once for the variance, once to normalize) and both fp32 copies are kept, with the rsqrt
    per token and, when the weight trains, the fp32 normalized tensor."""
    TORCHTUNE = "torchtune"
    """torchtune's ``RMSNorm``: ``F.rms_norm(x.float(), weight=self.scale).to(x.dtype)``. ATen's
    ``rms_norm_symint`` runs the fused kernel (input and rstd kept) only when the weight's dtype is
    the input's; a bf16/fp16 scale on the fp32 input takes ``rms_norm_composite``, which keeps the
    fp32 input, the rsqrt per token and, when the scale trains, the fp32 normalized tensor
    (aten/src/ATen/native/layer_norm.cpp; torchtune/modules/rms_norm.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HfStyle:
    """Saved-tensor facts of one family's decoder layer."""

    norm: str = NormStyle.RMS
    pre_attn_norm: bool = True
    pre_mlp_norm: bool = True
    post_attn_norm: bool = False
    """A norm on the attention output before the residual add (Gemma 2/3, OLMo 2)."""
    post_mlp_norm: bool = False
    out_proj_copy: bool = False
    """The attention output is copied before the output projection even with SDPA."""
    eager_softmax_fp32: bool = True
    """Eager attention up-casts the scores to fp32 for the softmax (keeps fp32 and bf16 probabilities)."""
    sdpa: bool = True
    """transformers supports SDPA for this family (Gemma 2 does not: eager by default)."""
    router_fp32: bool = False
    """The MoE router runs in fp32 on an fp32 copy of its input (DeepSeek V2/V3)."""
    qkv_views: bool = False
    """Queries, keys and values are views of one fused projection output and the rotary
    embedding replaces queries and keys with new tensors (GPT-NeoX, sequential Falcon): a
    fused kernel keeping the value view keeps the whole buffer, queries and keys included,
    beside their rotary copies. Found with HF Trainer's ``use_cache=False`` (with a cache
    the keys and values are its concatenated copies)."""
    sdpa_mask: bool = False
    """Every layer hands SDPA an explicit mask (Falcon): keys/values are repeated to all heads
    and the mask is kept per layer, as for sliding-window layers."""
    training_cache: bool = False
    """The multimodal wrapper leaves ``use_cache`` to its text model, which takes it from the text
    config (true by default): a training forward builds a ``DynamicCache`` even under HF Trainer's
    ``use_cache=False``, which Trainer sets on the top-level config only (Qwen2.5-VL, Qwen3-VL,
    Gemma 3; Mistral 3 and Llama 4 pass the wrapper's value down). Checked on CPU with
    transformers 5.23 (``out.past_key_values`` after a training forward)."""
    held_embeddings: int = 1
    """Hidden-size tensors the model's ``forward`` holds in locals through every layer
    (inference working set): ``inputs_embeds``; GPT-2 also ``position_embeds``."""
    mlp_held: int = 1
    """Hidden-size tensors a decoder layer still references while its MLP runs, besides the
    residual stream and the MLP input: the layer's input (the caller's loop variable, once
    the layer rebinds ``residual``) in sequential blocks, the attention output in parallel
    blocks (Phi, GPT-NeoX); GPT2Block holds both (``attn_output`` is a local)."""
    qk_norm_after_values: bool = False
    """The q/k norms run after all three projections (Gemma 3: ``q_norm`` on the transposed queries
    once ``v_proj`` has run); False: each right after its projection (Qwen 3 and OLMo 2:
    ``q_norm(q_proj(x))``). Where the layer's tensors are made, not how many
    (:mod:`vramlens.estimator.layer_script`)."""
    rope_sets: int = 1
    """Rotary (cos, sin) tables the model computes once per forward (Gemma 3: local and global)."""
    rope_fp32: bool = False
    """Rotary embeddings are applied in fp32 (Cohere's ``apply_rotary_pos_emb`` up-casts q and k)."""
    rope_tables_fp32: bool = False
    """The rotary (cos, sin) tables stay fp32 (OLMo 2's ``Olmo2RotaryEmbedding`` does not cast them to
    the input's dtype), so ``q * cos``, ``rotate_half(q) * sin`` and their sum are fp32, cast back
    once both q and k are rotated (:mod:`vramlens.estimator.layer_script`)."""
    router_topk_first: bool = False
    """The MoE router takes the top-k of its logits and softmaxes only those, in the compute dtype
    (gpt-oss ``GptOssTopKRouter``): no expert-wide fp32 probabilities are kept."""
    peft_wraps_experts: bool = False
    """PEFT's ``target_modules="all-linear"`` (0.21) also adapts the MoE router weight and 3-D
    experts (``ParamWrapper``; :mod:`vramlens.estimator.expert_lora`): the families whose v4
    checkpoints PEFT converts (``peft/utils/transformers_weight_conversion.py``
    ``_MODEL_TO_CONVERSION_PATTERN`` to a pattern of ``_MOE_TARGET_MODULE_MAPPING``; checked against
    it by ``tests/estimator/test_expert_lora.py``). Not Qwen2-MoE, Qwen3-VL-MoE, gpt-oss, Llama 4,
    Jamba, Nemotron-H or Granite-MoE-hybrid, whose experts PEFT leaves alone."""
    gpu_kernel: str = "flash-attention 2 (soft-capping in the kernel)"
    """What ``attention: flash`` runs for a family without SDPA (its class's flash path)."""
    dense_experts: bool = False
    """Every routed expert runs on every token (Llama 4: ``torch.bmm`` over all experts on
    copies of the input scaled by a sigmoid router score, zero for the unrouted ones);
    see :func:`vramlens.estimator.moe_dense.dense_expert_parts`."""
    flash: bool = True
    """transformers supports flash-attention 2 for this family (Llama 4 does not)."""
    all_linear_lora: bool = True
    """PEFT's ``all-linear`` LoRA runs on this family. Llama 4's ``Llama4Router`` subclasses
    ``nn.Linear`` but returns a tuple: PEFT wraps it and its forward fails."""
    kv_repeat: bool = False
    """Keys and values are expanded to every query head before SDPA whatever the mask
    (torchtune's ``MultiHeadAttention``: ``k.unsqueeze(2).expand(...).flatten(1, 2)``, a copy)."""
    kv_repeat_interleave: bool = False
    """The repeat is ``repeat_interleave`` (litgpt), a copy even of a single key/value head; an
    expand and a reshape or flatten of one head merges a size-1 dimension with the stride-0 one,
    a view."""
    rope_buffer: bool = False
    """The rotary table is a module buffer built once for ``max_seq_len`` positions in fp32
    (torchtune's ``RotaryPositionalEmbeddings.rope_cache``), not a per-forward (cos, sin) pair."""
    logits_fp32: bool = False
    """The model's forward returns float32 logits (Nemotron-H: ``self.lm_head(hidden_states).float()``),
    which the loss and the kept ``outputs.logits`` then hold."""
    lora_fused_qkv: bool = False
    """LoRA on the queries, keys and values is one adapter on a fused ``qkv`` linear (litgpt's
    ``LoRAQKVLinear``): one ``lora_A`` (rank x adapted projections) reads the input once, through
    one dropout, and when some of q, k, v are not adapted ``zero_pad``'s ``index_copy_`` keeps its
    source, the adapted projections' ``lora_B`` outputs (:func:`vramlens.estimator.saved_parts.fused_qkv_lora_parts`)."""


HF_STYLES: Final[dict[str, HfStyle]] = {
    "llama": HfStyle(),
    "mistral": HfStyle(),
    "mixtral": HfStyle(peft_wraps_experts=True),
    "qwen2": HfStyle(),
    "qwen2_moe": HfStyle(),
    "qwen3": HfStyle(),
    "qwen3_moe": HfStyle(peft_wraps_experts=True),
    "phi3": HfStyle(out_proj_copy=True),
    "deepseek_v2": HfStyle(router_fp32=True, peft_wraps_experts=True),
    "deepseek_v3": HfStyle(router_fp32=True, peft_wraps_experts=True),
    "olmo2": HfStyle(
        norm=NormStyle.RMS_FP32_WEIGHT,
        pre_attn_norm=False,
        pre_mlp_norm=False,
        post_attn_norm=True,
        post_mlp_norm=True,
        rope_tables_fp32=True,
    ),
    "gemma": HfStyle(norm=NormStyle.GEMMA),
    "gemma2": HfStyle(norm=NormStyle.GEMMA, post_attn_norm=True, post_mlp_norm=True, sdpa=False),
    "gemma3_text": HfStyle(
        norm=NormStyle.GEMMA, post_attn_norm=True, post_mlp_norm=True, rope_sets=2, qk_norm_after_values=True
    ),
    "gemma3": HfStyle(
        norm=NormStyle.GEMMA,
        post_attn_norm=True,
        post_mlp_norm=True,
        rope_sets=2,
        training_cache=True,
        qk_norm_after_values=True,
    ),
    "phi": HfStyle(norm=NormStyle.LAYERNORM, pre_mlp_norm=False, out_proj_copy=True),
    "gpt2": HfStyle(norm=NormStyle.LAYERNORM, eager_softmax_fp32=False, held_embeddings=2, mlp_held=2),
    "gpt_neox": HfStyle(norm=NormStyle.LAYERNORM, out_proj_copy=True, qkv_views=True),
    "falcon": HfStyle(norm=NormStyle.LAYERNORM, eager_softmax_fp32=False, sdpa_mask=True, qkv_views=True),
    "starcoder2": HfStyle(norm=NormStyle.LAYERNORM),
    # GptOssRMSNorm multiplies by the weight before casting back (fp32 normalized tensor kept);
    # transformers refuses SDPA (sinks); eager softmaxes in the scores' dtype.
    "gpt_oss": HfStyle(
        norm=NormStyle.RMS_FP32_WEIGHT,
        eager_softmax_fp32=False,
        sdpa=False,
        router_topk_first=True,
        gpu_kernel="flash-attention 3 with sinks (kernels-community/vllm-flash-attn3, which transformers "
        "substitutes for flash_attention_2 on gpt-oss)",
    ),
    "olmoe": HfStyle(peft_wraps_experts=True),
    "smollm3": HfStyle(),
    "cohere2": HfStyle(norm=NormStyle.COHERE, pre_mlp_norm=False, rope_fp32=True),
    # Glm4Moe's rotary concatenates the rotated and passed-through halves (torch.cat), so queries are
    # contiguous (b, heads, s, d); SDPA's output follows the query layout and the transpose before o_proj copies.
    "glm4_moe": HfStyle(router_fp32=True, out_proj_copy=True, peft_wraps_experts=True),
    # Multimodal wrappers keep their text decoder's style (the vision side computes nothing on text batches).
    # Llama4TextDecoderLayer keeps its attention output (``attention_states``) through the MLP.
    "llama4_text": HfStyle(
        eager_softmax_fp32=False, dense_experts=True, flash=False, all_linear_lora=False, mlp_held=2
    ),
    "llama4": HfStyle(eager_softmax_fp32=False, dense_experts=True, flash=False, all_linear_lora=False, mlp_held=2),
    "qwen2_5_vl": HfStyle(training_cache=True),
    "qwen3_vl": HfStyle(training_cache=True),
    "qwen3_vl_moe": HfStyle(training_cache=True),
    "mistral3": HfStyle(),
    "ministral3": HfStyle(),
    "qwen3_next": HfStyle(norm=NormStyle.GEMMA, out_proj_copy=True, peft_wraps_experts=True),
    "jamba": HfStyle(),
    "falcon_h1": HfStyle(),
    "nemotron_h": HfStyle(norm=NormStyle.RMS_FP32_WEIGHT, router_fp32=True, logits_fp32=True),
    "granitemoehybrid": HfStyle(),
}


def torchtune_style(style: HfStyle) -> HfStyle:
    """A family's layer as torchtune's own modules build it (``torchtune.modules``: the
    ``TransformerSelfAttentionLayer`` of every torchtune decoder builder), which replace
    transformers' classes: its RMSNorm (where the family's is Llama's; Gemma's ``GemmaRMSNorm``
    computes as transformers' does), its GQA expansion and its rotary buffer. Checked with
    torchtune 0.6.1's recipes on CPU (tests/estimator/test_trainer_torchtune.py)."""
    norm = NormStyle.TORCHTUNE if style.norm == NormStyle.RMS else style.norm
    return replace(style, norm=norm, kv_repeat=True, rope_buffer=True)


def litgpt_style(style: HfStyle) -> HfStyle:
    """A family's layer as litgpt's own ``GPT`` builds it (litgpt 0.5.13 ``model.py``/``lora.py``; the
    ``Block`` of every family), which replaces transformers' classes:

    * one fused ``qkv`` linear whose output is split into views (``CausalSelfAttention.forward``);
      rotary makes new queries and keys (``torch.cat((q_roped, q[..., rope_n_elem:]))``), so with as
      many key/value heads as query heads SDPA keeps a value view of the whole fused output; the
      concatenated queries are contiguous ``(b, heads, s, d)``, SDPA's output follows their layout,
      and ``y.transpose(1, 2).reshape(...)`` before the output projection copies (as Glm4Moe's);
    * keys and values ``repeat_interleave``'d to every query head whenever there are fewer key/value
      heads (training: ``input_pos`` is None), a copy SDPA keeps;
    * LoRA on q, k, v as one ``LoRAQKVLinear`` (:attr:`HfStyle.lora_fused_qkv`);
    * SDPA with ``is_causal`` and no mask outside sliding-window layers, whatever the family
      (transformers' Falcon hands SDPA a mask: ``sdpa_mask``);
    * its ``RMSNorm`` multiplies the fp32 normalized tensor by ``weight.float()`` before casting back,
      so a trained norm keeps the fp32 product (as OLMo 2's); a LayerNorm family's is ``nn.LayerNorm``.

    Checked with saved-tensor hooks and a tracked ``fit`` loop on CPU (tests/estimator/test_litgpt.py)."""
    norm = NormStyle.RMS_FP32_WEIGHT if style.norm in (NormStyle.RMS, NormStyle.GEMMA) else style.norm
    return replace(
        style,
        norm=norm,
        kv_repeat=True,
        kv_repeat_interleave=True,
        qkv_views=True,
        lora_fused_qkv=True,
        out_proj_copy=True,
        sdpa_mask=False,
    )


def hf_style(model_type: str) -> HfStyle:
    """The style of a native family's ``model_type`` (every native family has one: a test checks it;
    types described from transformers' code use traced recipes, never a look-alike's style)."""
    return HF_STYLES[model_type]
