"""Mistral 3 (Mistral Small 3.1/3.2, Ministral 3): a Pixtral vision tower, Mistral 3's
projector, and a Mistral or Ministral 3 text decoder; and ``ministral3`` text checkpoints.

``Mistral3Model`` builds its language model with ``AutoModel`` from ``text_config``
(``model_type`` ``mistral`` when absent, ``ministral3`` for Ministral 3) and its vision
tower from ``vision_config`` (``pixtral``). The text part is read by that type's own parser;
the wrapper's ``tie_word_embeddings`` (default true in ``Mistral3Config``) decides whether
the LM head is tied. Ministral 3's decoder is Mistral's (head size 128 by default, one
``sliding_window`` for every layer) with a per-position query scale (Llama 4 style, from
``rope_parameters.llama_4_scaling_beta``), which adds no parameters.
"""

from __future__ import annotations

from vramlens.model.config_reader import ConfigView
from vramlens.model.families import register
from vramlens.model.families._common import (
    build_spec,
    dense_gated_mlp,
    layer_specs,
    read_layers,
    read_position,
    standard_attention,
)
from vramlens.model.families._nested import nested_parts, wrap_text_spec
from vramlens.model.families.llama import parse_mistral
from vramlens.model.families.towers import pixtral_vision
from vramlens.model.spec import ModelSpec

_MINISTRAL3 = "transformers' Ministral3Config default"


@register("ministral3")
def parse_ministral3(view: ConfigView) -> ModelSpec:
    """Ministral 3 text decoder (``Ministral3ForCausalLM``)."""
    hidden = view.integer("hidden_size")
    layers = read_layers(view, "num_hidden_layers")
    attention = standard_attention(
        view,
        hidden,
        qkv_bias=False,
        out_bias=False,
        head_dim_default=None if view.present("head_dim") else 128,
        head_dim_why=_MINISTRAL3,
    )
    window = view.opt_integer("sliding_window")
    return build_spec(
        view,
        "ministral3",
        hidden_size=hidden,
        num_layers=layers,
        vocab_size=view.integer("vocab_size"),
        attention=attention,
        mlp=dense_gated_mlp(view),
        layers=layer_specs((window,) * layers),
        position=read_position(view, max_default=262144),
        tie_word_embeddings=view.flag("tie_word_embeddings", default=False, why=_MINISTRAL3),
    )


#: Text decoders Mistral 3 checkpoints use, read by their own parsers.
_TEXT_PARSERS = {"mistral": parse_mistral, "ministral3": parse_ministral3}


@register("mistral3")
def parse_mistral3(view: ConfigView) -> ModelSpec:
    """Mistral 3 multimodal (``Mistral3ForConditionalGeneration``)."""
    text, vision_view = nested_parts(view, "mistral3")
    text_type = text.data.get("model_type", "mistral")
    parser = _TEXT_PARSERS.get(text_type) if isinstance(text_type, str) else None
    if parser is None:
        raise text.error(
            "model_type", f"{text_type!r} is not a text decoder vramlens reads for mistral3; expected one of "
            f"{', '.join(sorted(_TEXT_PARSERS))}",
        )  # fmt: skip
    vision_type = vision_view.data.get("model_type", "pixtral")
    if vision_type != "pixtral":
        raise vision_view.error("model_type", f"{vision_type!r} is not a vision tower vramlens reads; expected pixtral")
    spec = parser(text)
    vision = pixtral_vision(vision_view, text_hidden=spec.hidden_size, outer=view)
    tie = view.flag("tie_word_embeddings", default=True, why="transformers' Mistral3Config default")
    return wrap_text_spec(view, "mistral3", spec, vision, tie_word_embeddings=tie)
