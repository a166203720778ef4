"""The recipe route: estimates of a model described from its code (``spec.generic``).

A model without a native family has no hand-written formulas: its weights come from the
module tree its reader recorded (:class:`~vramlens.model.generic.layout.GenericLayout`), and
what its layers allocate comes from a recipe traced from the real code
(:mod:`vramlens.model.generic.recipe`). Everything else (optimizer state, gradients,
sharding, logits and loss, the phases of a step, the runtime) is the estimator's own.

A recipe is read from the recipe cache in pure Python. On a miss it is traced once, by the
simulator (:mod:`vramlens.simulator.recipe`, which needs the ``[hf]`` extra): the one place
where the analytic engine runs the real code, imported only then.

Settings the traced code cannot show are refused in one line: tensor, expert and context
parallelism (layers are traced whole), frameworks other than transformers (they run their
own model code), ``compile``, selective recompute, and vLLM (its own model code).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from vramlens._notes import note
from vramlens.errors import InputError
from vramlens.estimator.layout import (
    EMBED_NAMES,
    ParamLayout,
    StageView,
    TrainableGroup,
    adapter_groups,
    effective_quant,
    modules_to_save_group,
)
from vramlens.estimator.lora_head import HEAD_NAMES
from vramlens.estimator.qlora import unquantized_bytes
from vramlens.model.generic.layout import Component, GenericLayout
from vramlens.model.generic.recipe import InferenceRecipe, TrainingRecipe, recipe_from_json, recipe_to_json
from vramlens.model.generic.store import RecipeFile, recipe_file, require_code_reading
from vramlens.model.spec import ModelSpec
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import BNB_4BIT_QUANTS, kbit_prepared
from vramlens.workload.options import Framework, Method, Quant, Recompute
from vramlens.workload.spec import ALL_LINEAR

__all__ = [
    "check_generic_training",
    "generic_layout",
    "generic_lora_targets",
    "inference_recipe",
    "recipe_counts",
    "training_recipe",
]

_FIRST_STAGE = (Component.EMBEDDING, Component.POSITION_EMBEDDING, Component.VISION, Component.PROJECTOR)


def _layout(spec: ModelSpec) -> GenericLayout:
    assert spec.generic is not None
    return spec.generic


def _refuse(key: str, value: object, spec: ModelSpec, why: str) -> InputError:
    return InputError(
        f"{key}: {value} is not modelled for {spec.name} ({spec.model_type}, described from transformers' code): {why}"
    )


def check_generic_training(ctx: TrainingContext) -> None:
    """Refuse the settings a traced recipe cannot describe (one line each)."""
    spec, workload = ctx.spec, ctx.workload
    if ctx.profile.name is Framework.PLAIN:
        raise _refuse("framework", ctx.profile.name, spec, "recipes trace the Trainer's loop; use hf")
    if ctx.profile.name is Framework.TRL:
        raise _refuse(
            "framework", ctx.profile.name, spec, "recipes trace transformers' own LM head, not TRL's fused one"
        )
    if ctx.profile.name is not Framework.HF:
        raise _refuse("framework", ctx.profile.name, spec, "that framework runs its own model code; use hf")
    if workload.compile:
        raise _refuse("compile", "true", spec, "recipes trace the eager code")
    if workload.recompute is Recompute.SELECTIVE:
        raise _refuse("recompute", "selective", spec, "transformers checkpoints whole layers; use full or none")
    if spec.quantization is not None and ctx.method is Method.FULL:
        raise _refuse(
            "quantization_config", spec.quantization.workload_name, spec, "the tracer builds its weights unquantized"
        )
    quant = effective_quant(ctx)
    if quant not in (Quant.NONE, *BNB_4BIT_QUANTS):
        raise _refuse("quant", quant, spec, "recipes trace bitsandbytes NF4 (nf4, nf4-dq) or unquantized weights")


# ---- weights -----------------------------------------------------------------------------


def generic_lora_targets(ctx: TrainingContext) -> frozenset[str]:
    """Linear modules (paths inside a layer) that get adapters; unknown targets are an error."""
    if ctx.method not in (Method.LORA, Method.QLORA):
        return frozenset()
    names = {shape.name for kind in _layout(ctx.spec).kinds for shape in kind.linears}
    targets = ctx.workload.lora.targets
    if targets == ALL_LINEAR:
        return frozenset(names)
    chosen: set[str] = set()
    for target in targets:
        matches = {n for n in names if n == target or n.endswith("." + target)}
        if not matches and target in HEAD_NAMES:
            raise _refuse(
                "lora.targets",
                target,
                ctx.spec,
                "recipes trace adapters inside the layers; the LM head adapter is "
                "modelled for the hand-written families only",
            )
        if not matches:
            raise InputError(
                f"lora.targets: {ctx.spec.name} has no linear module {target!r}; its modules are {', '.join(sorted(names))}"
            )
        chosen |= matches
    return frozenset(chosen)


def _kind_weights(ctx: TrainingContext, kind: int, recipe: TrainingRecipe | None) -> tuple[float, int, int]:
    """(frozen bytes, trainable elements, adapter elements) of one layer of ``kind``: all of it
    trained in full fine-tuning; else as the traced model holds it (PEFT's adapters, NF4 weights)."""
    if recipe is None:
        return 0.0, _layout(ctx.spec).kinds[kind].elements, 0
    traced = recipe.kinds[kind]
    return float(traced.frozen_bytes), 0, traced.trainable


def _outside(layout: GenericLayout, *, first: bool, last: bool) -> int:
    """Parameters outside the layers on a stage: embedding side on the first, the rest on the last."""
    total = 0
    for component, count in layout.outside:
        if (component in _FIRST_STAGE and first) or (component not in _FIRST_STAGE and last):
            total += count
    return total


def _peft_groups(
    ctx: TrainingContext, adapters: int, recipe: TrainingRecipe, *, first: bool, last: bool
) -> list[TrainableGroup]:
    groups = adapter_groups(ctx, adapters, head=False)
    table = ctx.spec.vocab_size * ctx.spec.hidden_size
    saved = recipe.trainable_outside if (first and last) else 0
    for name in ctx.workload.lora.modules_to_save:
        if name not in EMBED_NAMES | HEAD_NAMES:
            accepted = ", ".join(sorted(EMBED_NAMES | HEAD_NAMES))
            raise InputError(f"lora.modules_to_save: unknown module {name!r}; accepted: {accepted}")
        if not (first and last):
            saved += table if (first if name in EMBED_NAMES else last) else 0
    if saved:
        groups.append(modules_to_save_group(ctx, saved, largest_tensor=table))
    return groups


def _stage(
    ctx: TrainingContext, name: str, layers: range, *, first: bool, last: bool, recipe: TrainingRecipe | None
) -> StageView:
    layout = _layout(ctx.spec)
    frozen, trainable, adapters = 0.0, 0, 0
    layer_elements = largest = tensor = 0
    for kind_index, count in layout.kind_counts(layers).items():
        kind = layout.kinds[kind_index]
        f, t, a = _kind_weights(ctx, kind_index, recipe)
        frozen, trainable, adapters = frozen + count * f, trainable + count * t, adapters + count * a
        layer_elements = max(layer_elements, kind.elements)
        largest = max([largest, *(s.in_features * s.out_features for s in kind.linears)])
        tensor = max(tensor, kind.largest_tensor)
    edges = _outside(layout, first=first, last=last)
    if ctx.full:
        table = ctx.spec.vocab_size * ctx.spec.hidden_size if (first or last) else 0
        groups = [
            TrainableGroup(
                name="model",
                elements=trainable + edges,
                param_bytes=ctx.param_bytes,
                grad_bytes=ctx.grad_bytes,
                state_bytes=ctx.state_bytes,
                master_bytes=ctx.master_bytes,
                largest_tensor=max(tensor, table),
            )
        ]
    else:
        assert recipe is not None
        frozen += recipe.frozen_outside_bytes if (first and last) else edges * unquantized_bytes(ctx)
        groups = _peft_groups(ctx, adapters, recipe, first=first, last=last)
    return StageView(
        name=name,
        layer_range=layers,
        moe_layers=sum(1 for index in layers if ctx.spec.layers[index].moe),
        first=first,
        last=last,
        frozen_bytes=frozen,
        trainable=tuple(groups),
        layer_elements=layer_elements,
        largest_linear=largest,
    )


def generic_layout(ctx: TrainingContext) -> ParamLayout:
    """The first and last pipeline stages of a model described from its code."""
    check_generic_training(ctx)
    targets = generic_lora_targets(ctx)
    layers, pp = ctx.spec.num_layers, ctx.workload.parallel.pp
    if pp > layers:
        raise InputError(f"parallel.pp: {pp} pipeline stages for {layers} layers; at most one stage per layer")
    recipe = None if ctx.full else training_recipe(ctx, recompute=ctx.workload.recompute is not Recompute.NONE)
    if pp == 1:
        stages: tuple[StageView, ...] = (
            _stage(ctx, "all layers", range(layers), first=True, last=True, recipe=recipe),
        )
    else:
        per_stage = -(-layers // pp)
        stages = (
            _stage(ctx, "first pipeline stage", range(per_stage), first=True, last=False, recipe=recipe),
            _stage(
                ctx, "last pipeline stage", range(per_stage * (pp - 1), layers), first=False, last=True, recipe=recipe
            ),
        )
    return ParamLayout(stages=stages, adapters_per_layer=0, targets=targets)


# ---- recipes -----------------------------------------------------------------------------


def _file(spec: ModelSpec) -> RecipeFile:
    cache = spec.derived_cache
    if "recipe-file" not in cache:
        config = json.loads(json.dumps(dict(spec.config or {}), default=str))
        cache["recipe-file"] = recipe_file(config, spec.model_type, purpose="tracing a layer recipe")
    file = cache["recipe-file"]
    assert isinstance(file, RecipeFile)
    return file


def _recipe(spec: ModelSpec, signature: dict[str, Any], lengths: dict[str, int], derive: str, ctx: Any) -> Any:
    """The recipe stored under ``signature`` and ``lengths``, or one of the same signature that
    interpolates over a range holding them (:func:`_covers`), or a new one traced by
    ``vramlens.simulator.recipe.<derive>`` and stored."""
    key = json.dumps({**signature, **lengths}, sort_keys=True)
    cache = spec.derived_cache
    if ("recipe", key) in cache:
        return cache[("recipe", key)]
    file = _file(spec)
    document = file.read() or {}
    found = document.get("recipes")
    stored: dict[str, Any] = found if isinstance(found, dict) else {}
    recipe = _stored(stored.get(key)) or _interpolating(stored, signature, lengths)
    if recipe is None:
        require_code_reading(f"{spec.name}: tracing its layer recipe for this setting")
        note(
            __name__,
            "tracing the layer recipe of %s from transformers' code for this setting (once; cached in %s)",
            spec.name,
            file.path.parent,
        )
        tracer = importlib.import_module("vramlens.simulator.recipe")
        recipe = getattr(tracer, derive)(ctx)
        document = file.read() or document
        stored_now = document.get("recipes")
        recipes: dict[str, Any] = stored_now if isinstance(stored_now, dict) else {}
        file.write({**document, "recipes": {**recipes, key: recipe_to_json(recipe)}})
    cache[("recipe", key)] = recipe
    return recipe


def _stored(raw: Any) -> TrainingRecipe | InferenceRecipe | None:
    if not isinstance(raw, dict):
        return None
    try:
        return recipe_from_json(raw)
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def _covers(fitted: int, wanted: int) -> bool:
    """A fit centred on ``fitted`` tokens was measured from a quarter of it up to it."""
    return max(1, fitted // 4) <= wanted <= fitted


def _interpolating(
    stored: dict[str, Any], signature: dict[str, Any], lengths: dict[str, int]
) -> TrainingRecipe | InferenceRecipe | None:
    """A stored recipe of the same signature whose check held, fitted over lengths covering ours."""
    for key, raw in stored.items():
        try:
            found = json.loads(key)
        except ValueError:
            continue
        if not isinstance(found, dict) or {k: v for k, v in found.items() if k not in lengths} != signature:
            continue
        recipe = _stored(raw)
        if recipe is None or not recipe.interpolates:
            continue
        fitted = (
            {"seq": recipe.seq}
            if isinstance(recipe, TrainingRecipe)
            else {"prompt": recipe.prompt, "context": recipe.context}
        )
        if all(name in fitted and _covers(fitted[name], want) for name, want in lengths.items()):
            return recipe
    return None


def _training_signature(ctx: TrainingContext, recompute: bool) -> dict[str, Any]:
    workload, lora = ctx.workload, ctx.workload.lora
    return {
        "mode": "train",
        "precision": str(workload.precision),
        "frozen_bytes": ctx.frozen_bytes,
        "compute_bytes": ctx.compute_bytes,
        "autocast": ctx.autocast,
        "method": str(workload.method),
        "quant": str(effective_quant(ctx)),
        "kbit_prepared": kbit_prepared(workload, ctx.profile),
        "lora": [lora.rank, lora.dropout, sorted(lora.targets) if lora.targets != ALL_LINEAR else ALL_LINEAR]
        if ctx.method in (Method.LORA, Method.QLORA)
        else None,
        "attention": str(ctx.attention),
        "recompute": recompute,
    }


def training_recipe(ctx: TrainingContext, *, recompute: bool) -> TrainingRecipe:
    """The training recipe of ``ctx`` with (``recompute``) or without layer checkpointing."""
    from dataclasses import replace

    traced = ctx
    wanted = Recompute.FULL if recompute else Recompute.NONE
    if ctx.workload.recompute is not wanted or ctx.workload.recompute_every != 1:
        traced = replace(ctx, workload=replace(ctx.workload, recompute=wanted, recompute_every=1))
    lengths = {"seq": ctx.workload.seq}
    recipe = _recipe(ctx.spec, _training_signature(ctx, recompute), lengths, "derive_training", traced)
    assert isinstance(recipe, TrainingRecipe)
    return recipe


def inference_recipe(ctx: Any) -> InferenceRecipe:
    """The ``generate()`` recipe of an inference context."""
    workload = ctx.workload
    signature = {
        "mode": "infer",
        "precision": str(workload.precision),
        "compute_bytes": ctx.compute_bytes,
        "attention": str(ctx.attention),
        "weights": ctx.weights.name if ctx.weights is not None else None,
        "generates": ctx.context > ctx.prompt,
    }
    lengths = {"prompt": ctx.prompt, "context": ctx.context}
    recipe = _recipe(ctx.spec, signature, lengths, "derive_inference", ctx)
    assert isinstance(recipe, InferenceRecipe)
    return recipe


def recipe_counts(spec: ModelSpec, layers: range) -> dict[int, int]:
    """Layers of each kind in ``layers``."""
    return _layout(spec).kind_counts(layers)
