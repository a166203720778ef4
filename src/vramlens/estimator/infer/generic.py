"""``generate()`` memory of a model described from its code, from its traced recipe.

The two high points are the hand-written families' (:mod:`vramlens.estimator.infer.phases`):
the prefill (every layer has cached the prompt; the largest layer's, or the LM head's, peak
above that) and the last decode step (the cache holds the whole context; the largest
layer's step peak above it, which includes the old copy of its cache while it is
concatenated). Per-layer caches, peaks and weights come from the recipe
(:class:`~vramlens.model.generic.recipe.InferenceRecipe`): keys and values, and for
recurrent mixers their per-sequence states, exactly as transformers' cache objects hold them.

vLLM runs its own model code, so it is refused for these models; so are tensor parallelism
(layers are traced whole), chunked prefill and a cache dtype other than the compute dtype.
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator.generic import inference_recipe
from vramlens.estimator.infer.context import InferenceContext
from vramlens.estimator.infer.phases import WHOLE_RUN, StagePlan, base_terms, term
from vramlens.estimator.infer.weights import StageWeights
from vramlens.model.generic.layout import GenericLayout
from vramlens.model.generic.recipe import Fit, InferenceRecipe
from vramlens.result.report import PhaseMemory, ServingCapacity, Term
from vramlens.units import format_bytes
from vramlens.workload.options import Engine

__all__ = ["check_generic_inference", "generic_hf_plan", "generic_stage_weights"]

_C = Category
_INPUT_BYTES_PER_TOKEN = 16


def check_generic_inference(ctx: InferenceContext) -> None:
    """Refuse what a traced ``generate()`` recipe cannot describe (one line each)."""
    spec, workload = ctx.spec, ctx.workload
    what = f"is not modelled for {spec.name} ({spec.model_type}, described from transformers' code)"
    if ctx.engine is Engine.VLLM:
        raise InputError(f"engine: vllm {what}: vLLM runs its own model code; use engine hf")
    if workload.max_num_batched_tokens is not None:
        raise InputError(f"max_num_batched_tokens: chunked prefill {what}; leave it unset for generate()")
    if ctx.kv_bytes != ctx.compute_bytes:
        raise InputError(f"kv_dtype: {workload.kv_dtype} {what}; transformers caches keep the compute dtype")
    if ctx.weights is not None and ctx.weights.scheme.value != "bnb-4bit":
        raise InputError(f"quant: {ctx.weights.name} {what}: the tracer builds bitsandbytes NF4 or unquantized weights")


def _kinds(layout: GenericLayout, layers: range) -> dict[int, int]:
    return layout.kind_counts(layers)


def generic_stage_weights(ctx: InferenceContext) -> list[StageWeights]:
    """Weights of the first and last pipeline stages, as the traced model holds them."""
    layout = ctx.spec.generic
    assert layout is not None
    recipe = inference_recipe(ctx)
    layers, pp = layout.num_layers, ctx.workload.parallel.pp
    per_stage = -(-layers // pp)
    ranges = [range(layers)] if pp == 1 else [range(per_stage), range(per_stage * (pp - 1), layers)]
    stages = []
    for index, layer_range in enumerate(ranges):
        first, last = index == 0, index == len(ranges) - 1
        layer_bytes = sum(recipe.kinds[k].weight_bytes * n for k, n in _kinds(layout, layer_range).items())
        outside = recipe.weight_outside_bytes
        stages.append(
            StageWeights(
                name="all layers" if pp == 1 else ("first pipeline stage" if first else "last pipeline stage"),
                layers=layer_range,
                layer_bytes=layer_bytes,
                embedding_bytes=outside if first else 0,
                head_bytes=outside if last and not first else 0,
                first=first,
                last=last,
            )
        )
    return stages


def _sum(recipe: InferenceRecipe, counts: dict[int, int], pick: str, batch: int, seq: int) -> int:
    return sum(getattr(recipe.kinds[k], pick).at(batch, seq) * n for k, n in counts.items())


def _largest(recipe: InferenceRecipe, counts: dict[int, int], pick: str, batch: int, seq: int) -> int:
    return max((getattr(recipe.kinds[k], pick).at(batch, seq) for k in counts), default=0)


def _head(fit: Fit, last: bool, batch: int, seq: int) -> int:
    return fit.at(batch, seq) if last else 0


def _prefill_phase(
    ctx: InferenceContext, recipe: InferenceRecipe, counts: dict[int, int], stage: StageWeights
) -> tuple[PhaseMemory, int, int]:
    """The prefill phase of ``generate()``; also the cache it leaves and its peak above the caches."""
    b, prompt = ctx.batch, ctx.prompt
    cache = _sum(recipe, counts, "prefill_cache", b, prompt)
    layer_peak = _largest(recipe, counts, "prefill_working", b, prompt)
    head_peak = _head(recipe.head_prefill, stage.last, b, prompt)
    where = "a layer" if layer_peak >= head_peak else "the LM head"
    at, tokens = f"inside {where} of the prefill", f"{b} sequences x {prompt} tokens"
    terms = [
        *_base(stage),
        term("cache of the prompt (traced)", _C.KV_CACHE, cache, tokens, "from the prefill to the end"),
        term(
            "largest layer's prefill peak above the caches (traced)",
            _C.ACTIVATIONS,
            layer_peak if layer_peak >= head_peak else 0,
            tokens,
            at,
        ),
        term("LM head's prefill peak (traced)", _C.TEMPORARY, head_peak if head_peak > layer_peak else 0, tokens, at),
        _inputs(b, prompt),
    ]
    phase = PhaseMemory.of_terms("prefill", f"{where} of the prefill of {prompt} tokens x {b} sequences", terms)
    return phase, cache, max(layer_peak, head_peak)


def _inputs(batch: int, tokens: int) -> Term:
    formula = f"{batch} x {tokens} tokens x 2 int64"
    return term("inputs (ids, attention mask)", _C.INPUTS, _INPUT_BYTES_PER_TOKEN * batch * tokens, formula, WHOLE_RUN)


def _decode_phase(
    ctx: InferenceContext, recipe: InferenceRecipe, counts: dict[int, int], stage: StageWeights
) -> tuple[PhaseMemory, int]:
    """The last decode step at the full context, and the cache it holds."""
    b, context = ctx.batch, ctx.context
    full = _sum(recipe, counts, "decode_cache", b, context)
    step = max(
        _largest(recipe, counts, "decode_working", b, context), _head(recipe.head_decode, stage.last, b, context)
    )
    at, tokens = f"the last decode step at {context} tokens", f"{b} sequences x {context} tokens"
    terms = [
        *_base(stage),
        term("cache at the end (keys/values and recurrent states, traced)", _C.KV_CACHE, full, tokens, at),
        term(
            "largest layer's (or the head's) decode step peak, with its old cache (traced)",
            _C.TEMPORARY,
            step,
            tokens,
            at,
        ),
        _inputs(b, context),
    ]
    note = f"last decode step at {context} tokens (a layer's old and new cache while it grows)"
    return PhaseMemory.of_terms("decode", note, terms), full


def _base(stage: StageWeights) -> list[Term]:
    return base_terms(stage, "as the traced model holds them")


def generic_hf_plan(ctx: InferenceContext, stage: StageWeights) -> StagePlan:
    """Prefill and last-decode-step memory of ``generate()`` on one stage, from the recipe."""
    layout = ctx.spec.generic
    assert layout is not None
    recipe = inference_recipe(ctx)
    counts = _kinds(layout, stage.layers)
    b, prompt, context = ctx.batch, ctx.prompt, ctx.context
    prefill, full, above = _prefill_phase(ctx, recipe, counts, stage)
    phases = [prefill]
    if context > prompt:
        decode, full = _decode_phase(ctx, recipe, counts, stage)
        phases.append(decode)
    per_token = max(
        0, _sum(recipe, counts, "decode_cache", 1, context) - _sum(recipe, counts, "decode_cache", 1, context - 1)
    )
    serving = ServingCapacity(
        engine="hf", sequences=b, tokens_per_sequence=context, kv_bytes_per_token=per_token, kv_bytes_needed=full
    )
    terms = [
        _base(stage)[0],
        term(
            "cache at the end (keys/values and recurrent states, traced)",
            _C.KV_CACHE,
            full,
            f"{b} sequences x {context} tokens",
            "from its token's step to the end",
        ),
        term("prefill peak above the caches (traced)", _C.ACTIVATIONS, above, f"{b} x {prompt} tokens", "the prefill"),
    ]
    notes = [
        f"{ctx.spec.model_type}: layers traced from transformers' code (recipe); cache per token "
        f"{format_bytes(per_token)} at {context} tokens (recurrent states are per sequence)"
    ]
    return StagePlan(phases=phases, serving=serving, runtime={}, terms=terms, notes=notes)
