"""Reading the nested ``text_config`` / ``vision_config`` of a multimodal config.

A multimodal ``config.json`` nests the text decoder's keys under ``text_config`` and the
image encoder's under ``vision_config``; transformers builds each from its own config class.
Both parts are required: a config without its text part (or its vision part) is refused in
one line naming the key, rather than filled with a default model's sizes. Qwen2.5-VL also
accepts the older flat layout (text keys at the top level), as transformers does.
"""

from __future__ import annotations

import dataclasses

from vramlens.model.config_reader import ConfigView
from vramlens.model.spec import ModelSpec, VisionSpec

__all__ = ["nested_parts", "wrap_text_spec"]

#: Keys of the top-level config that also describe the text decoder's weights.
_INHERITED = ("torch_dtype", "dtype", "quantization_config")


def _required(view: ConfigView, key: str, model_type: str, part: str) -> ConfigView:
    sub = view.sub(key)
    if sub is None:
        raise view.error(
            key,
            f"is required for model_type {model_type!r} (a multimodal config needs its {part} part; "
            f"transformers would otherwise build a default-sized {part} model)",
        )
    return sub


def nested_parts(view: ConfigView, model_type: str, *, flat_text: bool = False) -> tuple[ConfigView, ConfigView]:
    """The (text, vision) views of a multimodal config, each sharing ``view``'s assumptions.

    The text view inherits the top-level dtype and quantization when it has none of its own.
    ``flat_text``: without ``text_config``, a config carrying ``hidden_size`` at the top level
    is its own text part (Qwen2.5-VL's older layout, read by ``Qwen2_5_VLConfig``)."""
    if flat_text and view.sub("text_config") is None and view.present("hidden_size"):
        text = ConfigView(dict(view.data), source=view.source, assumptions=view.assumptions)
    else:
        text = _required(view, "text_config", model_type, "text")
        inherited = {k: view.data[k] for k in _INHERITED if k in view.data}
        text.data = {**inherited, **text.data}
    vision = _required(view, "vision_config", model_type, "vision")
    return text, vision


def wrap_text_spec(
    view: ConfigView, model_type: str, text_spec: ModelSpec, vision: VisionSpec, *, tie_word_embeddings: bool
) -> ModelSpec:
    """The multimodal spec: the text decoder's, renamed, with the vision part and the wrapper's tying rule."""
    architectures = view.data.get("architectures")
    architecture = text_spec.architecture
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        architecture = architectures[0]
    return dataclasses.replace(
        text_spec,
        name=model_type,
        model_type=model_type,
        vision=vision,
        tie_word_embeddings=tie_word_embeddings,
        architecture=architecture,
        source=view.source,
        assumptions=tuple(view.assumptions),
    )
