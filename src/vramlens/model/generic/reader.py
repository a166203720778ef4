"""Read a model's parameters from its real code: build it on the meta device and walk the tree.

Needs the ``[hf]`` extra (torch and transformers); imported only for a ``model_type`` with
no native family, and only when the recipe cache has no layout for the config yet.

The model is built by the auto class transformers maps its ``model_type`` to (causal LM,
or image-text-to-text for multimodal checkpoints), on the meta device (no memory, no
weights). The decoder layers are the module list holding the most parameters outside any
vision or audio tower; layers with the same module classes, parameter shapes and per-layer
config values (``layer_types`` and every other per-layer list of the config) are one
*kind*. Parameters are named by component from their module path and class
(:func:`_layer_component`, :func:`_outside_component`); what no rule names is ``other``,
counted and shown, never dropped. Tied tensors count once, as ``model.parameters()`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from vramlens._extras import require
from vramlens.errors import ConfigError
from vramlens.model.generic.layout import Component, ExpertTensor, GenericLayout, LayerKindLayout
from vramlens.model.modules import LinearShape

__all__ = ["build_hf_config", "build_meta_model", "read_layout"]

_PURPOSE = "describing a model_type without a native vramlens family"
#: Path words of towers that are not the text decoder.
_TOWER_WORDS = ("vision", "visual", "image", "audio", "speech", "patch_embed", "video")
_PROJECTOR_WORDS = ("projector", "multi_modal", "mm_", "connector", "merger", "adapter")
_MTP_WORDS = ("mtp", "nextn", "next_n")
#: Config keys of routed experts per token and experts per MoE layer, as model configs spell them.
_TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk", "n_activated_experts")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
#: Module attributes that tell two otherwise identical layers apart (attention pattern, rope use).
_LAYER_ATTRIBUTES = ("attention_type", "layer_type", "is_sliding", "sliding_window", "use_rope", "is_causal")


def build_hf_config(config: dict[str, Any], model_type: str) -> Any:
    """transformers' config object for ``config`` (``auto_map`` and quantization left out:
    remote code never runs, and the layout is read from unquantized modules)."""
    transformers = require("transformers", purpose=_PURPOSE)
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "auto_map", "quantization_config")}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception as error:  # foreign config code (strict dataclass validators raise their own types)
        raise ConfigError(
            f"model_type {model_type!r}: transformers {transformers.__version__} cannot build its config "
            f"({type(error).__name__}: {_short(error)})"
        ) from None


def _short(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _auto_class(transformers: Any, hf_config: Any, model_type: str, config: dict[str, Any]) -> Any:
    """The auto class for the type: the one whose mapping holds the config's ``architectures[0]``,
    else image-text-to-text for configs with a vision part, else causal LM."""
    names = transformers.models.auto.modeling_auto
    causal = names.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    multimodal = names.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    architectures = config.get("architectures") or ()
    wanted = architectures[0] if architectures and isinstance(architectures[0], str) else None
    if model_type in multimodal and (wanted == multimodal[model_type] or "vision_config" in config):
        return transformers.AutoModelForImageTextToText
    if model_type in causal:
        return transformers.AutoModelForCausalLM
    if model_type in multimodal:
        return transformers.AutoModelForImageTextToText
    raise ConfigError(
        f"model_type {model_type!r}: transformers {transformers.__version__} has no causal-LM or "
        "image-text-to-text model for it; vramlens describes decoder language models"
    )


def build_meta_model(config: dict[str, Any], model_type: str) -> tuple[Any, str]:
    """The model on the meta device and the name of the auto class that built it."""
    torch = require("torch", purpose=_PURPOSE)
    transformers = require("transformers", purpose=_PURPOSE)
    hf_config = build_hf_config(config, model_type)
    auto = _auto_class(transformers, hf_config, model_type, config)
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = auto.from_config(hf_config)
    except Exception as error:  # foreign model code: any failure is the model's, said in one line
        raise ConfigError(
            f"model_type {model_type!r}: transformers {transformers.__version__} cannot build it from this config "
            f"({type(error).__name__}: {_short(error)})"
        ) from None
    return model, auto.__name__


def _in_tower(path: str) -> bool:
    return any(word in part for part in path.lower().split(".") for word in _TOWER_WORDS)


def _decoder_layers(torch: Any, model: Any) -> tuple[str, Any]:
    """The module list of decoder layers: most parameters, outside any vision/audio tower."""
    best: tuple[int, str, Any] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0 or _in_tower(path):
            continue
        count = sum(p.numel() for p in module.parameters())
        if best is None or count > best[0]:
            best = (count, path, module)
    if best is None:
        raise ConfigError(f"{type(model).__name__}: no list of decoder layers found in its module tree")
    return best[1], best[2]


def _per_layer_values(hf_config: Any, layers: int) -> list[tuple[str, Any]]:
    """Config attributes that give each layer a type: lists with one string or flag per layer
    (``layer_types``, ``layers_block_type``, ``no_rope_layers``). Lists of numbers (index lists
    such as ``mlp_only_layers``, per-layer limits) are not types."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    found = []
    for key, value in sorted(vars(text).items()):
        if key.startswith("_") or not isinstance(value, (list, tuple)) or len(value) != layers:
            continue
        if all(isinstance(v, str) for v in value) or all(isinstance(v, bool) or v in (0, 1) for v in value):
            found.append((key, value))
    return found


def _signature(layer: Any, index: int, per_layer: list[tuple[str, Any]]) -> tuple[Any, ...]:
    shapes = tuple((name, tuple(p.shape), str(p.dtype)) for name, p in layer.named_parameters())
    classes = tuple((name, type(m).__name__) for name, m in layer.named_modules())
    attributes = tuple(
        (name, attribute, repr(getattr(m, attribute)))
        for name, m in layer.named_modules()
        for attribute in _LAYER_ATTRIBUTES
        if hasattr(m, attribute) and isinstance(getattr(m, attribute), (bool, int, str, type(None)))
    )
    config_values = tuple((key, repr(values[index])) for key, values in per_layer)
    return shapes, classes, attributes, config_values


def _kind_name(layer: Any, signature: tuple[Any, ...]) -> str:
    """The layer class, the classes of its blocks (norms aside) and the per-layer config values."""
    blocks = [type(m).__name__ for _, m in layer.named_children() if "norm" not in type(m).__name__.lower()]
    values = [f"{key}={value}" for key, value in signature[3]]
    inside = ", ".join([*dict.fromkeys(blocks), *values])
    return f"{type(layer).__name__}({inside})" if inside else type(layer).__name__


def _ancestors(layer: Any, name: str) -> list[tuple[str, Any]]:
    """(path segment, module) from the layer down to the parameter's owner."""
    chain = []
    module = layer
    for part in name.split(".")[:-1]:
        module = getattr(module, part)
        chain.append((part, module))
    return chain


def _layer_component(layer: Any, name: str, parameter: Any) -> Component:
    """The component of a parameter inside a decoder layer, from its module path and classes."""
    chain = _ancestors(layer, name)
    segments = [part.lower() for part, _ in chain]
    classes = [type(module).__name__.lower() for _, module in chain]
    if any(s.startswith(("shared_expert", "shared_mlp")) for s in segments) or any(
        "sharedexpert" in c for c in classes
    ):
        return Component.MOE_SHARED
    if "experts" in segments or (parameter.dim() == 3 and any("expert" in c for c in classes)):
        return Component.MOE_EXPERTS
    if any("router" in c or "topk" in c for c in classes) or (
        segments and segments[-1] in ("gate", "router") and any("moe" in c or "sparse" in c for c in classes[:-1])
    ):
        return Component.MOE_ROUTER
    if any(word in c for c in classes for word in ("mamba", "ssm")) or any("mamba" in s for s in segments):
        return Component.SSM
    if any(word in c for c in classes for word in ("deltanet", "linearattention", "lightning", "gateddelta")):
        return Component.LINEAR_ATTENTION
    if any("attention" in c or "attn" in c for c in classes) or any(
        s in ("self_attn", "attn", "attention") for s in segments
    ):
        return Component.ATTENTION
    if len(chain) == 1 and "norm" in classes[0]:
        return Component.NORMS
    if any(word in c for c in classes for word in ("mlp", "feedforward", "ffn", "moe", "sparse")) or any(
        s in ("mlp", "feed_forward", "ffn") for s in segments
    ):
        return Component.MLP
    if chain and "mixer" in segments[0] and any(hasattr(m, "A_log") for _, m in chain):
        return Component.SSM
    return Component.OTHER


def _outside_component(path: str, module: Any, torch: Any, embedding: Any, head: Any) -> Component:
    lowered = path.lower()
    if module is embedding:
        return Component.EMBEDDING
    if head is not None and module is head:
        return Component.LM_HEAD
    if any(word in lowered for word in _MTP_WORDS):
        return Component.MTP
    if any(word in lowered for word in _PROJECTOR_WORDS) and not _in_tower(path.rsplit(".", 1)[0]):
        return Component.PROJECTOR
    if _in_tower(path):
        return Component.VISION
    if isinstance(module, torch.nn.Embedding):
        return Component.POSITION_EMBEDDING if "pos" in lowered else Component.EMBEDDING
    if "norm" in type(module).__name__.lower():
        return Component.FINAL_NORM
    return Component.OTHER


def _add(counts: dict[Component, int], component: Component, elements: int) -> None:
    counts[component] = counts.get(component, 0) + elements


def _ordered(counts: dict[Component, int]) -> tuple[tuple[Component, int], ...]:
    return tuple((component, counts[component]) for component in Component if counts.get(component))


def _kind_layout(torch: Any, layer: Any, name: str, shared: set[int]) -> LayerKindLayout:
    """One layer's parameters by component; ``shared`` tensors (owned by several layers) are left
    out here and counted once outside the layers."""
    counts: dict[Component, int] = {}
    experts: list[ExpertTensor] = []
    largest = 0
    for pname, parameter in layer.named_parameters():
        if id(parameter) in shared:
            continue
        component = _layer_component(layer, pname, parameter)
        _add(counts, component, parameter.numel())
        largest = max(largest, parameter.numel())
        if component is Component.MOE_EXPERTS and parameter.dim() == 3:
            experts.append(ExpertTensor(name=pname, experts=int(parameter.shape[0]), elements=parameter.numel()))
    linears = tuple(
        LinearShape(
            name=path,
            in_features=int(module.in_features),
            out_features=int(module.out_features),
            group=path.rsplit(".", 1)[0] if "." in path else "",
            bias=module.bias is not None,
        )
        for path, module in layer.named_modules()
        if isinstance(module, torch.nn.Linear)
    )
    return LayerKindLayout(
        name=name, components=_ordered(counts), linears=linears, experts=tuple(experts), largest_tensor=largest
    )


def _config_integer(hf_config: Any, keys: Iterable[str]) -> int | None:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    for key in keys:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _shared_across_layers(layers: Any) -> dict[int, tuple[Any, str, Any]]:
    """Tensors that several decoder layers own (a block shared by many layers, as Zamba's),
    by id: (the first layer owning it, its name there, the tensor)."""
    owners: dict[int, list[tuple[Any, str, Any]]] = {}
    for layer in layers:
        for name, parameter in layer.named_parameters():
            owners.setdefault(id(parameter), []).append((layer, name, parameter))
    return {key: found[0] for key, found in owners.items() if len(found) > 1}


def _outside(
    torch: Any, model: Any, layers_path: str, shared: dict[int, tuple[Any, str, Any]]
) -> tuple[dict[Component, int], Any, Any]:
    """Parameters outside the layers by component, plus the tensors shared by several layers (once)."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    counts: dict[Component, int] = {}
    for layer, name, parameter in shared.values():
        _add(counts, _layer_component(layer, name, parameter), parameter.numel())
    seen = set(shared) | {id(p) for p in model.get_submodule(layers_path).parameters()}
    prefix = layers_path + "."
    for path, module in model.named_modules():
        if path == layers_path or path.startswith(prefix):
            continue
        for pname, parameter in module.named_parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            _add(
                counts,
                _outside_component(f"{path}.{pname}" if path else pname, module, torch, embedding, head),
                parameter.numel(),
            )
    return counts, embedding, head


def read_layout(config: dict[str, Any], model_type: str, dtype: str) -> GenericLayout:
    """Build ``config`` on the meta device and read its :class:`GenericLayout` (a model whose
    code does not expose what the reader needs is refused in one line)."""
    model, auto_name = build_meta_model(config, model_type)
    try:
        return _read(model, auto_name, dtype)
    except ConfigError:
        raise
    except Exception as error:  # foreign model code
        raise ConfigError(
            f"model_type {model_type!r}: its {type(model).__name__} cannot be read ({type(error).__name__}: {_short(error)})"
        ) from None


def _read(model: Any, auto_name: str, dtype: str) -> GenericLayout:
    torch = require("torch", purpose=_PURPOSE)
    layers_path, layers = _decoder_layers(torch, model)
    hf_config = model.config
    per_layer = _per_layer_values(hf_config, len(layers))
    shared = _shared_across_layers(layers)
    signatures: dict[tuple[Any, ...], int] = {}
    kinds: list[LayerKindLayout] = []
    layer_kinds: list[int] = []
    for index, layer in enumerate(layers):
        signature = _signature(layer, index, per_layer)
        if signature not in signatures:
            signatures[signature] = len(kinds)
            kinds.append(_kind_layout(torch, layer, _kind_name(layer, signature), set(shared)))
        layer_kinds.append(signatures[signature])
    outside, embedding, head = _outside(torch, model, layers_path, shared)
    if embedding is None or getattr(embedding, "weight", None) is None or embedding.weight.dim() != 2:
        raise ConfigError(f"{type(model).__name__}: no token embedding matrix found (get_input_embeddings)")
    tied = head is not None and head.weight is embedding.weight
    head_elements = 0 if head is None or tied else sum(p.numel() for p in head.parameters())
    has_experts = any(kind.experts or kind.component(Component.MOE_EXPERTS) for kind in kinds)
    return GenericLayout(
        model_class=type(model).__name__,
        auto_class=auto_name,
        layers_path=layers_path,
        kinds=tuple(kinds),
        layer_kinds=tuple(layer_kinds),
        outside=_ordered(outside),
        hidden_size=int(embedding.weight.shape[1]),
        vocab_size=int(embedding.weight.shape[0]),
        tied_embeddings=tied,
        head_elements=head_elements,
        experts_per_token=_config_integer(hf_config, _TOPK_KEYS) if has_experts else None,
        num_experts=_config_integer(hf_config, _EXPERT_KEYS) if has_experts else None,
        dtype=dtype,
        sdpa=bool(getattr(type(model), "_supports_sdpa", False)),
    )
