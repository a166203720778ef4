"""Vision towers and projectors of multimodal models, parameter by parameter.

Each reader takes the ``vision_config`` (and the text width the projector maps to) and
returns a :class:`~vramlens.model.spec.VisionSpec`: every parameter of the tower and of
the projector, and their ``nn.Linear`` modules (what LoRA can target and bitsandbytes
quantizes). Absent keys take the transformers vision config class's defaults, recorded in
the spec's assumptions. What counts as projector, by transformers module path:

* Pixtral (Mistral 3): ``model.multi_modal_projector`` (RMSNorm, patch merger, two linears);
* Qwen2.5-VL: ``model.visual.merger``; Qwen3-VL: ``model.visual.merger`` and
  ``model.visual.deepstack_merger_list`` (they map tower features to the text width);
* Llama 4: ``multi_modal_projector``; its pixel-shuffle MLP ``vision_model.vision_adapter``
  is part of the tower;
* Gemma 3 (SigLIP): ``model.multi_modal_projector``.

The rest of each vision module is the tower. Checked against transformers' meta-device
models, module by module, in ``tests/model/test_towers.py``.
"""

from __future__ import annotations

from vramlens.model.components import PROJECTOR
from vramlens.model.config_reader import MAX_LAYERS, ConfigView
from vramlens.model.spec import TowerLinear, VisionSpec

__all__ = ["llama4_vision", "pixtral_vision", "qwen2_5_vl_vision", "qwen3_vl_vision", "siglip_vision"]


def _spec(
    kind: str, linears: list[TowerLinear], *, other_tower: int, other_projector: int, hidden: int, layers: int
) -> VisionSpec:
    """Assemble a spec from the linears and the parameters outside them (norms, convolutions, tables)."""
    tower = sum(s.parameters for s in linears if s.part != PROJECTOR) + other_tower
    projector = sum(s.parameters for s in linears if s.part == PROJECTOR) + other_projector
    return VisionSpec(
        kind=kind,
        tower_parameters=tower,
        projector_parameters=projector,
        linears=tuple(linears),
        hidden_size=hidden,
        num_layers=layers,
    )


def _layers(view: ConfigView, *keys: str, default: int, why: str) -> int:
    return view.integer(*keys, default=default, maximum=MAX_LAYERS, why=why)


def _square(view: ConfigView, key: str, *, default: int, why: str) -> int:
    """``image_size``/``patch_size`` as one integer (transformers also accepts [n, n]; a non-square one is refused)."""
    value = view.data.get(key)
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        return ConfigView({key: value[0]}, source=view.source).integer(key)
    return view.integer(key, default=default, why=why)


def pixtral_vision(view: ConfigView, *, text_hidden: int, outer: ConfigView) -> VisionSpec:
    """Pixtral tower (transformers ``PixtralVisionModel``) and Mistral 3's projector.

    Tower: ``patch_conv`` (``C x p x p -> h``, no bias), ``ln_pre`` RMSNorm; per layer an
    ``attention_norm`` and ``ffn_norm`` RMSNorm, bias-free q/k/v/o (``h -> h``) and a bias-free
    gated MLP (``h -> i -> h``). Projector (``Mistral3MultiModalProjector``): an RMSNorm of ``h``,
    the patch merger ``merging_layer`` (``h x m^2 -> h``), ``linear_1`` (``h x feature_layers ->
    text``) and ``linear_2`` (``text -> text``), biased when ``multimodal_projector_bias``.
    """
    why = "transformers' PixtralVisionConfig default"
    hidden = view.integer("hidden_size", default=1024, why=why)
    inner = view.integer("intermediate_size", default=4096, why=why)
    layers = _layers(view, "num_hidden_layers", default=24, why=why)
    channels = view.integer("num_channels", default=3, why=why)
    patch = _square(view, "patch_size", default=16, why=why)
    merge = outer.integer("spatial_merge_size", default=2, why="transformers' Mistral3Config default")
    feature = outer.data.get("vision_feature_layer", -1)
    feature_layers = len(feature) if isinstance(feature, list) else 1
    if not isinstance(feature, (int, list)) or isinstance(feature, bool):
        raise outer.error("vision_feature_layer", f"must be an integer or a list of integers, got {feature!r}")
    bias = outer.flag("multimodal_projector_bias", default=False, why="transformers' Mistral3Config default")
    linears = [
        TowerLinear(name="attention.q_proj", in_features=hidden, out_features=hidden, bias=False, count=layers),
        TowerLinear(name="attention.k_proj", in_features=hidden, out_features=hidden, bias=False, count=layers),
        TowerLinear(name="attention.v_proj", in_features=hidden, out_features=hidden, bias=False, count=layers),
        TowerLinear(name="attention.o_proj", in_features=hidden, out_features=hidden, bias=False, count=layers),
        TowerLinear(name="feed_forward.gate_proj", in_features=hidden, out_features=inner, bias=False, count=layers),
        TowerLinear(name="feed_forward.up_proj", in_features=hidden, out_features=inner, bias=False, count=layers),
        TowerLinear(name="feed_forward.down_proj", in_features=inner, out_features=hidden, bias=False, count=layers),
        TowerLinear(
            name="patch_merger.merging_layer",
            in_features=hidden * merge * merge,
            out_features=hidden,
            bias=False,
            part=PROJECTOR,
        ),
        TowerLinear(
            name="multi_modal_projector.linear_1",
            in_features=hidden * feature_layers,
            out_features=text_hidden,
            bias=bias,
            part=PROJECTOR,
        ),
        TowerLinear(
            name="multi_modal_projector.linear_2",
            in_features=text_hidden,
            out_features=text_hidden,
            bias=bias,
            part=PROJECTOR,
        ),
    ]
    other = channels * patch * patch * hidden + hidden + layers * 2 * hidden
    return _spec("pixtral", linears, other_tower=other, other_projector=hidden, hidden=hidden, layers=layers)


def _qwen_blocks(hidden: int, inner: int, layers: int, *, gated: bool) -> list[TowerLinear]:
    """A Qwen-VL vision block's linears: fused ``attn.qkv`` and ``attn.proj`` (biased), and
    the MLP: gated ``gate_proj``/``up_proj``/``down_proj`` (Qwen2.5-VL) or plain
    ``linear_fc1``/``linear_fc2`` (Qwen3-VL), biased."""
    linears = [
        TowerLinear(name="attn.qkv", in_features=hidden, out_features=3 * hidden, bias=True, count=layers),
        TowerLinear(name="attn.proj", in_features=hidden, out_features=hidden, bias=True, count=layers),
    ]
    if gated:
        linears += [
            TowerLinear(name="mlp.gate_proj", in_features=hidden, out_features=inner, bias=True, count=layers),
            TowerLinear(name="mlp.up_proj", in_features=hidden, out_features=inner, bias=True, count=layers),
            TowerLinear(name="mlp.down_proj", in_features=inner, out_features=hidden, bias=True, count=layers),
        ]
    else:
        linears += [
            TowerLinear(name="mlp.linear_fc1", in_features=hidden, out_features=inner, bias=True, count=layers),
            TowerLinear(name="mlp.linear_fc2", in_features=inner, out_features=hidden, bias=True, count=layers),
        ]
    return linears


def _qwen_patch(view: ConfigView, hidden: int, *, patch_default: int, why: str) -> int:
    """Elements of the ``Conv3d(C, h, [t, p, p])`` patch embedding's weight (``in_chans`` in
    hub configs is not read by transformers: ``in_channels`` is)."""
    channels = view.integer("in_channels", default=3, why=why)
    patch = _square(view, "patch_size", default=patch_default, why=why)
    temporal = _square(view, "temporal_patch_size", default=2, why=why)
    return channels * temporal * patch * patch * hidden


def qwen2_5_vl_vision(view: ConfigView) -> VisionSpec:
    """Qwen2.5-VL vision transformer (transformers ``Qwen2_5_VisionTransformerPretrainedModel``).

    Tower: a bias-free ``Conv3d`` patch embedding; ``depth`` blocks of two RMSNorms, fused
    biased ``qkv`` (``h -> 3h``) and ``proj``, a biased gated MLP (``h -> i -> h``).
    Projector (``visual.merger``): an RMSNorm ``ln_q`` of ``h``, then ``mlp.0``
    (``h m^2 -> h m^2``) and ``mlp.2`` (``h m^2 -> out_hidden_size``), biased.
    """
    why = "transformers' Qwen2_5_VLVisionConfig default"
    hidden = view.integer("hidden_size", default=3584, why=why)
    inner = view.integer("intermediate_size", default=3420, why=why)
    layers = _layers(view, "depth", "num_hidden_layers", default=32, why=why)
    merge = view.integer("spatial_merge_size", default=2, why=why)
    out = view.integer("out_hidden_size", default=3584, why=why)
    merged = hidden * merge * merge
    linears = [
        *_qwen_blocks(hidden, inner, layers, gated=True),
        TowerLinear(name="merger.mlp.0", in_features=merged, out_features=merged, bias=True, part=PROJECTOR),
        TowerLinear(name="merger.mlp.2", in_features=merged, out_features=out, bias=True, part=PROJECTOR),
    ]
    other = _qwen_patch(view, hidden, patch_default=14, why=why) + layers * 2 * hidden
    return _spec("qwen2_5_vl", linears, other_tower=other, other_projector=hidden, hidden=hidden, layers=layers)


def qwen3_vl_vision(view: ConfigView) -> VisionSpec:
    """Qwen3-VL vision model (transformers ``Qwen3VLVisionModel``, also Qwen3-VL-MoE's).

    Tower: a biased ``Conv3d`` patch embedding, a learned ``pos_embed`` table of
    ``num_position_embeddings x h``; ``depth`` blocks of two LayerNorms with bias, fused biased
    ``qkv`` and ``proj``, a biased plain MLP ``linear_fc1``/``linear_fc2``. Projector:
    ``visual.merger`` (LayerNorm of ``h``, ``linear_fc1`` ``h m^2 -> h m^2``, ``linear_fc2``
    ``h m^2 -> out_hidden_size``, biased) and one DeepStack merger per
    ``deepstack_visual_indexes`` entry (the same, with its LayerNorm over ``h m^2``).
    """
    why = "transformers' Qwen3VLVisionConfig default"
    hidden = view.integer("hidden_size", default=1152, why=why)
    inner = view.integer("intermediate_size", default=4304, why=why)
    layers = _layers(view, "depth", "num_hidden_layers", default=27, why=why)
    merge = view.integer("spatial_merge_size", default=2, why=why)
    out = view.integer("out_hidden_size", default=3584, why=why)
    positions = view.integer("num_position_embeddings", default=2304, why=why)
    deepstack = view.integers("deepstack_visual_indexes")
    if deepstack is None:
        deepstack = (8, 16, 24)
        view.assumptions.append(f"'deepstack_visual_indexes' not in config; using [8, 16, 24] ({why})")
    merged = hidden * merge * merge
    mergers = 1 + len(deepstack)
    linears = [
        *_qwen_blocks(hidden, inner, layers, gated=False),
        TowerLinear(
            name="linear_fc1", in_features=merged, out_features=merged, bias=True, part=PROJECTOR, count=mergers
        ),
        TowerLinear(name="linear_fc2", in_features=merged, out_features=out, bias=True, part=PROJECTOR, count=mergers),
    ]
    tower_other = (
        _qwen_patch(view, hidden, patch_default=16, why=why) + hidden + positions * hidden + layers * 4 * hidden
    )
    projector_other = 2 * hidden + len(deepstack) * 2 * merged
    return _spec(
        "qwen3_vl", linears, other_tower=tower_other, other_projector=projector_other, hidden=hidden, layers=layers
    )


def llama4_vision(view: ConfigView, *, text_hidden: int) -> VisionSpec:
    """Llama 4 vision model (transformers ``Llama4VisionModel``) and ``Llama4MultiModalProjector``.

    Tower: ``patch_embedding.linear`` (``C p^2 -> h``, no bias), a class embedding of ``h``,
    ``(image/patch)^2 + 1`` learned positions, LayerNorms with bias before and after the
    encoder; per layer two LayerNorms with bias, biased q/k/v/o (``h -> h``) and a biased
    plain MLP ``fc1``/``fc2`` (``h -> i -> h``); the pixel-shuffle adapter
    ``vision_adapter.mlp`` (``fc1`` ``i -> projector_input_dim``, ``fc2``
    ``projector_output_dim -> projector_output_dim``, no biases). Projector: ``linear_1``
    (``vision_output_dim -> text hidden``, no bias).
    """
    why = "transformers' Llama4VisionConfig default"
    hidden = view.integer("hidden_size", default=768, why=why)
    inner = view.integer("intermediate_size", default=5632, why=why)
    layers = _layers(view, "num_hidden_layers", default=34, why=why)
    channels = view.integer("num_channels", default=3, why=why)
    image = _square(view, "image_size", default=448, why=why)
    patch = _square(view, "patch_size", default=14, why=why)
    if patch > image:
        raise view.error("patch_size", f"must not exceed image_size ({image}), got {patch}")
    adapter_in = view.integer("projector_input_dim", default=4096, why=why)
    adapter_out = view.integer("projector_output_dim", default=4096, why=why)
    output = view.integer("vision_output_dim", default=7680, why=why)
    linears = [
        TowerLinear(
            name="patch_embedding.linear", in_features=channels * patch * patch, out_features=hidden, bias=False
        ),
        *(
            TowerLinear(name=f"self_attn.{name}", in_features=hidden, out_features=hidden, bias=True, count=layers)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj")
        ),
        TowerLinear(name="mlp.fc1", in_features=hidden, out_features=inner, bias=True, count=layers),
        TowerLinear(name="mlp.fc2", in_features=inner, out_features=hidden, bias=True, count=layers),
        TowerLinear(name="vision_adapter.mlp.fc1", in_features=inner, out_features=adapter_in, bias=False),
        TowerLinear(name="vision_adapter.mlp.fc2", in_features=adapter_out, out_features=adapter_out, bias=False),
        TowerLinear(
            name="multi_modal_projector.linear_1",
            in_features=output,
            out_features=text_hidden,
            bias=False,
            part=PROJECTOR,
        ),
    ]
    positions = (image // patch) ** 2 + 1
    other = hidden + positions * hidden + 2 * 2 * hidden + layers * 2 * 2 * hidden
    return _spec("llama4", linears, other_tower=other, other_projector=0, hidden=hidden, layers=layers)


def siglip_vision(view: ConfigView, *, text_hidden: int) -> VisionSpec:
    """SigLIP vision encoder (transformers ``SiglipVisionModel``) and Gemma 3's projector.

    Tower: a ``patch x patch`` convolution from ``num_channels`` to ``h`` with bias, a learned
    table of ``(image_size // patch)**2`` positions; per layer two LayerNorms with bias,
    biased q/k/v/out projections and a biased ``fc1``/``fc2`` MLP; a post LayerNorm, and, when
    ``vision_use_head``, an attention-pooling head (probe, ``nn.MultiheadAttention``,
    LayerNorm, MLP). Projector (``Gemma3MultiModalProjector``): ``mm_input_projection_weight``
    ``[h, text hidden]`` and an RMSNorm of ``h``. Absent keys take SiglipVisionConfig's defaults.
    """
    why = "transformers' SiglipVisionConfig default"
    hidden = view.integer("hidden_size", default=768, why=why)
    inner = view.integer("intermediate_size", default=3072, why=why)
    layers = _layers(view, "num_hidden_layers", default=12, why=why)
    channels = view.integer("num_channels", default=3, why=why)
    image = view.integer("image_size", default=224, why=why)
    patch = view.integer("patch_size", default=16, why=why)
    if patch > image:
        raise view.error("patch_size", f"must not exceed image_size ({image}), got {patch}")
    linears = [
        *(
            TowerLinear(name=f"self_attn.{name}", in_features=hidden, out_features=hidden, bias=True, count=layers)
            for name in ("q_proj", "k_proj", "v_proj", "out_proj")
        ),
        TowerLinear(name="mlp.fc1", in_features=hidden, out_features=inner, bias=True, count=layers),
        TowerLinear(name="mlp.fc2", in_features=inner, out_features=hidden, bias=True, count=layers),
    ]
    other = channels * patch * patch * hidden + hidden + (image // patch) ** 2 * hidden
    other += layers * 2 * 2 * hidden + 2 * hidden
    if view.flag("vision_use_head", default=True, why=why):
        # probe, nn.MultiheadAttention (in_proj packed, out_proj is an NonDynamicallyQuantizableLinear), LayerNorm, MLP.
        linears += [
            TowerLinear(name="head.attention.out_proj", in_features=hidden, out_features=hidden, bias=True),
            TowerLinear(name="head.mlp.fc1", in_features=hidden, out_features=inner, bias=True),
            TowerLinear(name="head.mlp.fc2", in_features=inner, out_features=hidden, bias=True),
        ]
        other += hidden + 3 * hidden * hidden + 3 * hidden + 2 * hidden
    projector = hidden * text_hidden + hidden
    return _spec("siglip", linears, other_tower=other, other_projector=projector, hidden=hidden, layers=layers)
