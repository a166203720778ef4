"""The linear layers of one decoder layer, by their transformers module names.

LoRA targets, activation saving (a linear saves its input only when its weight
or an adapter on it is trained) and tensor parallelism all need to know which
linear layers a layer has, what they read and what they produce. Names follow
each family's transformers implementation; fused projections (Phi-3
``qkv_proj``, GPT-2 ``c_attn``, Falcon ``query_key_value``) are one module.

Groups say which linears read the same input tensor:

* ``attn_in``  - reads the normalized hidden state (q/k/v projections),
* ``attn_out`` - reads the attention output (o_proj),
* ``mlp_in``   - reads the normalized hidden state before the MLP (gate/up),
* ``mlp_out``  - reads the MLP intermediate (down),
* ``mla_q``/``mla_kv`` - MLA second-stage projections reading the compressed latents,
* ``ssm_in``/``ssm_x``/``ssm_dt``/``ssm_out`` - a Mamba mixer's input projection, Mamba 1's
  selective and time-step projections, its output projection,
* ``gdn_in``/``gdn_out`` - gated DeltaNet's input projections and output projection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramlens.errors import ConfigError
from vramlens.model.spec import FfnKind, LayerKind, MixerKind, MlpKind, ModelSpec
from vramlens.model.ssm import MambaVersion

__all__ = [
    "LinearShape",
    "all_layer_linears",
    "is_shared_expert",
    "layer_kinds",
    "layer_linears",
    "register_mixer_linears",
    "shared_expert_prefix",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class LinearShape:
    """One ``nn.Linear`` (or Conv1D) of a decoder layer."""

    name: str
    """Module name as in transformers (q_proj, gate_up_proj, c_attn, ...)."""
    in_features: int
    out_features: int
    group: str
    """Which tensor it reads (see module docstring)."""
    bias: bool = False


_FUSED_QKV = {"phi3": "qkv_proj", "gpt2": "c_attn", "falcon": "query_key_value", "gpt_neox": "query_key_value"}
_OUT_NAME = {"phi": "dense", "gpt2": "c_proj", "falcon": "dense", "gpt_neox": "dense"}
_PLAIN_MLP = {
    "gpt2": ("c_fc", "c_proj"),
    "starcoder2": ("c_fc", "c_proj"),
    "phi": ("fc1", "fc2"),
    "falcon": ("dense_h_to_4h", "dense_4h_to_h"),
    "gpt_neox": ("dense_h_to_4h", "dense_4h_to_h"),
}


def _attention_linears(spec: ModelSpec) -> list[LinearShape]:
    attention = spec.attn
    h = spec.hidden_size
    mla = attention.mla
    if mla is not None:
        heads = attention.num_heads
        shapes = []
        if mla.q_lora_rank is None:
            shapes.append(
                LinearShape(name="q_proj", in_features=h, out_features=heads * mla.qk_head_dim, group="attn_in")
            )
        else:
            shapes.append(LinearShape(name="q_a_proj", in_features=h, out_features=mla.q_lora_rank, group="attn_in"))
            shapes.append(
                LinearShape(
                    name="q_b_proj", in_features=mla.q_lora_rank, out_features=heads * mla.qk_head_dim, group="mla_q"
                )
            )
        shapes.append(
            LinearShape(
                name="kv_a_proj_with_mqa",
                in_features=h,
                out_features=mla.kv_lora_rank + mla.qk_rope_head_dim,
                group="attn_in",
            )
        )
        shapes.append(
            LinearShape(
                name="kv_b_proj",
                in_features=mla.kv_lora_rank,
                out_features=heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                group="mla_kv",
            )
        )
        shapes.append(LinearShape(name="o_proj", in_features=heads * mla.v_head_dim, out_features=h, group="attn_out"))
        return shapes
    q = attention.num_heads * attention.head_dim
    kv = attention.num_kv_heads * attention.head_dim
    q_out = 2 * q if attention.output_gate else q  # Qwen3-Next's q_proj also yields the output gate
    bias = attention.qkv_bias
    fused = _FUSED_QKV.get(spec.model_type)
    if fused is not None:
        shapes = [LinearShape(name=fused, in_features=h, out_features=q + 2 * kv, group="attn_in", bias=bias)]
    else:
        shapes = [
            LinearShape(name="q_proj", in_features=h, out_features=q_out, group="attn_in", bias=bias),
            LinearShape(name="k_proj", in_features=h, out_features=kv, group="attn_in", bias=bias),
            LinearShape(name="v_proj", in_features=h, out_features=kv, group="attn_in", bias=bias),
        ]
    out_name = _OUT_NAME.get(spec.model_type, "o_proj")
    shapes.append(LinearShape(name=out_name, in_features=q, out_features=h, group="attn_out", bias=attention.out_bias))
    return shapes


#: Gated MLPs whose gate and up projections are one fused linear of ``2 x inner`` outputs.
_FUSED_GATE_UP = {"phi3": ("gate_up_proj", "down_proj"), "granitemoehybrid": ("input_linear", "output_linear")}
#: Module path of the dense MLP / the shared expert inside a layer, where it is not the usual one.
_DENSE_PREFIX = {"granitemoehybrid": "shared_mlp."}
_SHARED_PREFIX = {"granitemoehybrid": "shared_mlp."}


def _mlp_linears(spec: ModelSpec, inner: int, kind: MlpKind, *, bias: bool, prefix: str = "") -> list[LinearShape]:
    h = spec.hidden_size
    if kind is MlpKind.PLAIN:
        up, down = _PLAIN_MLP.get(spec.model_type, ("up_proj", "down_proj"))
        return [
            LinearShape(name=prefix + up, in_features=h, out_features=inner, group="mlp_in", bias=bias),
            LinearShape(name=prefix + down, in_features=inner, out_features=h, group="mlp_out", bias=bias),
        ]
    fused = _FUSED_GATE_UP.get(spec.model_type)
    down = "down_proj"
    if fused is not None:
        first = [LinearShape(name=prefix + fused[0], in_features=h, out_features=2 * inner, group="mlp_in")]
        down = fused[1]
    else:
        first = [
            LinearShape(name=prefix + "gate_proj", in_features=h, out_features=inner, group="mlp_in", bias=bias),
            LinearShape(name=prefix + "up_proj", in_features=h, out_features=inner, group="mlp_in", bias=bias),
        ]
    return [*first, LinearShape(name=prefix + down, in_features=inner, out_features=h, group="mlp_out", bias=bias)]


def _dense_linears(spec: ModelSpec) -> list[LinearShape]:
    mlp = spec.mlp
    assert mlp is not None
    prefix = _DENSE_PREFIX.get(spec.model_type, "")
    return _mlp_linears(spec, mlp.intermediate_size, mlp.kind, bias=mlp.bias, prefix=prefix)


def _moe_linears(spec: ModelSpec) -> list[LinearShape]:
    moe = spec.moe
    if moe is None or not moe.shared_intermediate_size:
        return []
    prefix = shared_expert_prefix(spec)
    return _mlp_linears(spec, moe.shared_intermediate_size, moe.shared_kind, bias=moe.shared_bias, prefix=prefix)


def _mamba_linears(spec: ModelSpec) -> list[LinearShape]:
    """Mamba 1: ``in_proj``, ``x_proj``, ``dt_proj``, ``out_proj``; Mamba 2: ``in_proj``, ``out_proj``
    (the convolution is an ``nn.Conv1d``, not a linear, and no LoRA target)."""
    mamba = spec.mamba
    assert mamba is not None
    h, d = spec.hidden_size, mamba.intermediate_size
    shapes = [
        LinearShape(name="in_proj", in_features=h, out_features=mamba.in_proj_size, group="ssm_in", bias=mamba.in_bias)
    ]
    if mamba.version is MambaVersion.MAMBA1:
        r = mamba.time_step_rank
        shapes.append(LinearShape(name="x_proj", in_features=d, out_features=r + 2 * mamba.state_size, group="ssm_x"))
        shapes.append(LinearShape(name="dt_proj", in_features=r, out_features=d, group="ssm_dt", bias=True))
    shapes.append(LinearShape(name="out_proj", in_features=d, out_features=h, group="ssm_out", bias=mamba.out_bias))
    return shapes


def _gated_deltanet_linears(spec: ModelSpec) -> list[LinearShape]:
    linear = spec.linear_attention
    assert linear is not None
    h, k, v = spec.hidden_size, linear.key_dim, linear.value_dim
    return [
        LinearShape(name="in_proj_qkvz", in_features=h, out_features=2 * k + 2 * v, group="gdn_in"),
        LinearShape(name="in_proj_ba", in_features=h, out_features=2 * linear.num_value_heads, group="gdn_in"),
        LinearShape(name="out_proj", in_features=v, out_features=h, group="gdn_out"),
    ]


MixerLinears = Callable[[ModelSpec], list[LinearShape]]

_MIXER_LINEARS: dict[MixerKind, MixerLinears] = {
    MixerKind.ATTENTION: _attention_linears,
    MixerKind.MAMBA: _mamba_linears,
    MixerKind.LINEAR_ATTENTION: _gated_deltanet_linears,
    MixerKind.ATTENTION_AND_MAMBA: lambda spec: _attention_linears(spec) + _mamba_linears(spec),
    MixerKind.NONE: lambda spec: [],
}
_FFN_LINEARS: dict[FfnKind, MixerLinears] = {
    FfnKind.DENSE: _dense_linears,
    FfnKind.MOE: _moe_linears,
    FfnKind.NONE: lambda spec: [],
}


def register_mixer_linears(kind: MixerKind, linears: MixerLinears) -> None:
    """Register the linear modules of a token mixer (a new mixer is an entry, not an ``elif``)."""
    _MIXER_LINEARS[kind] = linears


def layer_kinds(spec: ModelSpec) -> tuple[LayerKind, ...]:
    """The distinct (mixer, FFN) kinds of the model's decoder layers, dense before MoE (cached per spec)."""
    cache = spec.derived_cache
    if "layer_kinds" not in cache:
        kinds = {layer.kind for layer in spec.layers}
        order = (list(FfnKind), list(MixerKind))
        cache["layer_kinds"] = tuple(sorted(kinds, key=lambda k: (order[0].index(k.ffn), order[1].index(k.mixer))))
    return cache["layer_kinds"]  # type: ignore[return-value]


#: Families whose one ungated shared expert is the module ``shared_expert`` (Llama 4's ``Llama4TextMoe``).
_SINGLE_SHARED_EXPERT = {"llama4", "llama4_text"}


def shared_expert_prefix(spec: ModelSpec) -> str:
    """Module-name prefix of an MoE layer's shared expert: ``shared_expert.`` (Qwen2-MoE's gated
    one, Llama 4's), ``shared_mlp.`` (Granite 4.0-H's) or ``shared_experts.`` (DeepSeek's fused ones,
    Nemotron-H's)."""
    assert spec.moe is not None
    if spec.model_type in _SHARED_PREFIX:
        return _SHARED_PREFIX[spec.model_type]
    single = spec.moe.shared_expert_gate or spec.model_type in _SINGLE_SHARED_EXPERT
    return "shared_expert." if single else "shared_experts."


def is_shared_expert(spec: ModelSpec, shape: LinearShape) -> bool:
    """Whether a linear belongs to an MoE layer's shared expert (not to the dense MLP)."""
    moe = spec.moe
    if moe is None or not moe.shared_intermediate_size:
        return False
    return shape.name.startswith(shared_expert_prefix(spec))


def layer_linears(
    spec: ModelSpec, kind: LayerKind | None = None, *, moe_layer: bool = False
) -> tuple[LinearShape, ...]:
    """The ``nn.Linear`` modules of one decoder layer of ``kind`` (default: an attention layer,
    MoE when ``moe_layer``), cached per spec.

    Routed experts are stored as 3-D parameters in transformers 5 (not
    ``nn.Linear``), so they are not listed; MoE layers list their shared expert.
    """
    if kind is None:
        kind = LayerKind(ffn=FfnKind.MOE if moe_layer else FfnKind.DENSE)
    kind = LayerKind(mixer=kind.mixer, ffn=kind.ffn)  # the window does not change the modules
    cache = spec.derived_cache
    key = ("layer_linears", kind)
    if key not in cache:
        mixer = _MIXER_LINEARS.get(kind.mixer)
        if mixer is None:
            raise ConfigError(f"{spec.name}: layers with a {kind.mixer.value} token mixer are not modelled by vramlens")
        cache[key] = tuple(mixer(spec) + _FFN_LINEARS[kind.ffn](spec))
    return cache[key]  # type: ignore[return-value]


def all_layer_linears(spec: ModelSpec) -> tuple[LinearShape, ...]:
    """The linears of every kind of decoder layer the model has, each (group, name) once:
    what LoRA can target and what full fine-tuning trains (cached per spec)."""
    cache = spec.derived_cache
    if "all_layer_linears" not in cache:
        unique = {(s.group, s.name): s for kind in layer_kinds(spec) for s in layer_linears(spec, kind)}
        cache["all_layer_linears"] = tuple(unique.values())
    return cache["all_layer_linears"]  # type: ignore[return-value]
