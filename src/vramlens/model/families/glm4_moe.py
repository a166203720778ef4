"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (``glm4_moe``): dense first layers, shared expert, sigmoid router.

As transformers' ``Glm4MoeConfig`` / ``modeling_glm4_moe.py`` (5.x) build it:

* attention: GQA with biases on q, k and v (``attention_bias``) but none on o, per-head RMSNorm on
  q and k when ``use_qk_norm``, rotary on half of each head (``partial_rotary_factor`` 0.5);
* the first ``first_k_dense_replace`` (1) layers have a dense SwiGLU MLP of ``intermediate_size``;
  the rest are MoE: ``n_routed_experts`` experts of ``moe_intermediate_size`` behind a sigmoid
  top-k router computed in fp32 with a per-expert score-correction bias (a buffer, not a
  parameter) and group-limited selection (``n_group``, ``topk_group``), plus one shared MLP of
  ``n_shared_experts x moe_intermediate_size``;
* the checkpoints' multi-token-prediction layer (``num_nextn_predict_layers``, stored as layer
  ``num_hidden_layers``) is not built by transformers: it skips those weights on load
  (``_keys_to_ignore_on_load_unexpected``), so it is neither counted nor run.

Absent keys take ``Glm4MoeConfig``'s defaults, each recorded in the assumptions.
"""

from __future__ import annotations

from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import build_spec, moe_spec, read_position
from vramlens.model.families._defaults import floor_head_dim, kv_heads, read_layer_count
from vramlens.model.spec import AttentionSpec, FfnKind, LayerSpec, MlpKind, MlpSpec, ModelSpec, QKNorm

_WHY = "Glm4MoeConfig default"


def _attention(view: ConfigView, hidden: int) -> AttentionSpec:
    heads = view.integer("num_attention_heads", default=96, why=_WHY)
    bias = view.flag("attention_bias", default=False, why=_WHY)
    qk_norm = view.flag("use_qk_norm", default=False, why=_WHY)
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads(view, heads, default=8, why=_WHY),
        head_dim=floor_head_dim(view, hidden, heads, code="Glm4MoeAttention"),
        qkv_bias=bias,
        out_bias=False,
        qk_norm=QKNorm.PER_HEAD if qk_norm else QKNorm.NONE,
        dropout=view.number("attention_dropout", default=0.0, minimum=0.0, maximum=0.999),
    )


@register("glm4_moe")
def parse_glm4_moe(view: ConfigView) -> ModelSpec:
    """GLM-4.5 family: dense first layers, routed + shared experts, fp32 sigmoid router."""
    hidden = view.integer("hidden_size", default=4096, why=_WHY)
    layers = read_layer_count(view, default=46, why=_WHY)
    first_dense = view.integer("first_k_dense_replace", default=1, minimum=0, maximum=MAX_LAYERS, why=_WHY)
    width = view.integer("moe_intermediate_size", default=1408, why=_WHY)
    shared = view.integer("n_shared_experts", default=1, minimum=0, why=_WHY)
    experts = view.integer("n_routed_experts", "num_local_experts", default=128, why=_WHY)
    groups = view.integer("n_group", default=1, why=_WHY)
    if experts % groups:
        raise view.error("n_group", f"must divide n_routed_experts ({experts}), got {groups}")
    moe = moe_spec(
        view,
        num_experts=experts,
        experts_per_token=view.integer("num_experts_per_tok", default=8, why=_WHY),
        expert_intermediate_size=width,
        shared_intermediate_size=shared * width,
        num_shared_experts=shared,
        router_score_bias=True,
        activation=view.text("hidden_act", default="silu"),
    )
    mtp = view.integer("num_nextn_predict_layers", "num_mtp_layers", default=0, minimum=0)
    if mtp:
        view.assumptions.append(
            f"the checkpoint's {mtp} multi-token-prediction layer(s) (num_nextn_predict_layers) are skipped by "
            "transformers on load (Glm4MoePreTrainedModel._keys_to_ignore_on_load_unexpected): not counted, not run"
        )
    needs_dense = first_dense > 0
    mlp = (
        MlpSpec(
            kind=MlpKind.GATED,
            intermediate_size=view.integer("intermediate_size", default=10944, why=_WHY),
            activation=view.text("hidden_act", default="silu"),
        )
        if needs_dense
        else None
    )
    return build_spec(
        view,
        "glm4_moe",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size", default=151552, why=_WHY),
        attention=_attention(view, hidden),
        mlp=mlp,
        moe=moe,
        layers=tuple(LayerSpec(ffn=FfnKind.MOE if i >= first_dense else FfnKind.DENSE) for i in range(layers)),
        position=read_position(view, max_default=131072, rotary_default=0.5),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_WHY),
    )
