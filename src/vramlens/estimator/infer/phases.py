"""The inference estimate: per-GPU memory of generation, phase by phase.

transformers ``generate()`` (engine ``hf``) has two high points:

* ``prefill`` - every layer has cached the prompt, the last layer's intermediates
  are alive, and the LM head has produced the logits of each sequence's last
  position (generate passes ``logits_to_keep=1``; a plain forward would keep them all);
* ``decode`` - the last step: the cache holds the whole context, ``DynamicCache``
  concatenates one layer's old and new keys/values (both alive for a moment), and
  one token's intermediates.

vLLM (engine ``vllm``) first profiles one step of ``max_num_batched_tokens`` tokens
and a sampler step over ``max_num_seqs`` sequences (``profile``), then pre-allocates
the KV pool: ``gpu_memory_utilization x capacity`` minus weights, that activation
peak, non-torch memory and CUDA graphs (``serving``). Without a GPU the pool is
what ``batch`` sequences of the full context need.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramlens.categories import Category
from vramlens.estimator.infer.context import InferenceContext
from vramlens.estimator.infer.engines import VLLM
from vramlens.estimator.infer.kv_cache import kv_cache_bytes
from vramlens.estimator.infer.state_cache import HybridPages, hf_state_bytes, hybrid_pages, state_layers
from vramlens.estimator.infer.weights import StageWeights
from vramlens.estimator.infer.working import (
    hf_layer_working_bytes,
    logits_bytes,
    sampler_bytes,
    vllm_layer_working_bytes,
)
from vramlens.estimator.runtime import CUBLAS_FORMULA, CUBLAS_WORKSPACE_BYTES
from vramlens.result.report import PhaseMemory, ServingCapacity, Term
from vramlens.units import format_bytes
from vramlens.workload.versions import older_than, rule_note

__all__ = ["WHOLE_RUN", "StagePlan", "base_terms", "hf_plan", "term", "vllm_plan"]

#: When weights, the cuBLAS workspace and vLLM's pool are alive.
WHOLE_RUN = "the whole run"

_C = Category
#: int64 input_ids and attention_mask per token (generate's inputs; position ids are recomputed per step).
_INPUT_BYTES_PER_TOKEN = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """Phases of one stage plus what the report needs besides them."""

    phases: list[PhaseMemory]
    serving: ServingCapacity
    runtime: dict[str, int]
    """Memory outside PyTorch's allocator, by part (vLLM); empty for transformers."""
    terms: list[Term]
    """Each explained quantity at its full size (the report's catalogue)."""
    notes: list[str]

    @property
    def peak(self) -> PhaseMemory:
        return max(self.phases, key=lambda phase: phase.allocated_bytes)


def term(name: str, category: Category, value: int, formula: str, alive: str) -> Term:
    """One explained quantity of ``value`` bytes."""
    return Term(name=name, category=category, bytes=int(value), explain=formula, alive=alive)


def base_terms(stage: StageWeights, weights_formula: str, *, cublas: bool = True) -> list[Term]:
    """The weights and (through PyTorch's allocator, not vLLM's budget) the cuBLAS workspace: alive throughout."""
    weights = term("weights", _C.PARAMETERS, stage.total, weights_formula, WHOLE_RUN)
    if not cublas:
        return [weights]
    return [
        weights,
        term(
            "cuBLAS workspace (from the caching allocator)", _C.OTHER, CUBLAS_WORKSPACE_BYTES, CUBLAS_FORMULA, WHOLE_RUN
        ),
    ]


def _kv(
    ctx: InferenceContext, stage: StageWeights, tokens: int, *, block_size: int | None = None, windowed: bool = True
) -> int:
    """KV cache bytes of the stage's layers. ``windowed=False``: sliding-window (and chunked) layers hold every
    token, as transformers' ``DynamicSlidingWindowLayer`` does right after a prefill: it keeps a
    view of the last ``window - 1`` positions of the concatenated keys/values, so the whole
    prompt's storage stays alive until the first decode step replaces it (cache_utils.py)."""
    layers = [ctx.spec.layers[index] for index in stage.layers]
    if not windowed:
        layers = [replace(layer, window=None, chunk=None) for layer in layers]
    return kv_cache_bytes(
        ctx.spec.attn,
        layers,
        tokens=tokens,
        sequences=ctx.batch,
        kv_bytes=ctx.kv_bytes,
        tp=ctx.tp,
        latent=ctx.latent_kv,
        block_size=block_size,
    )


def _states(ctx: InferenceContext, stage: StageWeights) -> int:
    """The per-sequence convolution and recurrent states transformers caches for the stage's
    Mamba / linear-attention layers (state_cache.py); 0 for attention-only models."""
    layers = [ctx.spec.layers[index] for index in stage.layers]
    return hf_state_bytes(ctx.spec, layers, sequences=ctx.batch, compute_bytes=ctx.compute_bytes)


def _attending(stage: StageWeights, ctx: InferenceContext) -> int:
    return sum(1 for index in stage.layers if ctx.spec.layers[index].attends)


def _per_token(ctx: InferenceContext, stage: StageWeights) -> int:
    layers = [ctx.spec.layers[index] for index in stage.layers]
    return kv_cache_bytes(
        ctx.spec.attn, layers, tokens=1, sequences=1, kv_bytes=ctx.kv_bytes, tp=ctx.tp, latent=ctx.latent_kv
    )


def hf_plan(ctx: InferenceContext, stage: StageWeights) -> StagePlan:
    """Prefill and last-decode-step memory of ``generate()`` on one stage."""
    spec, b, cb = ctx.spec, ctx.batch, ctx.compute_bytes
    seq_q = max(ctx.step_tokens // b, 1)
    working = hf_layer_working_bytes(
        spec, batch=b, seq_q=seq_q, seq_kv=ctx.prompt, attention=ctx.attention, compute_bytes=cb, tp=ctx.tp
    )
    versions, notes = ctx.workload.versions, []
    every_position = older_than(versions, "logits_to_keep")
    rows = b * ctx.prompt if every_position else b
    logits = logits_bytes(spec, rows=rows, compute_bytes=cb) if stage.last else 0
    base = base_terms(stage, _weights_formula(ctx, stage))
    phases = [_prefill_phase(ctx, stage, base, working=working, logits=logits)]
    states = _states(ctx, stage)
    attention_kv = _kv(ctx, stage, ctx.context)
    kv_full = attention_kv + states
    if every_position:
        notes.append(rule_note(versions, "logits_to_keep"))
        logits = logits_bytes(spec, rows=b, compute_bytes=cb) if stage.last else 0  # decode: one position
    per_token = _per_token(ctx, stage)
    kv_formula = f"{b} sequences x {ctx.context} tokens x {format_bytes(per_token)} per token (window-capped)"
    if states:
        kv_formula += f" + {b} sequences x {format_bytes(states // b)} of convolution and recurrent states"
    kv_end = term("KV cache at the end", _C.KV_CACHE, kv_full, kv_formula, "from its token's step to the end")
    if ctx.context > ctx.prompt:
        phases.append(_decode_phase(ctx, stage, [*base, kv_end], attention_kv=attention_kv, logits=logits, notes=notes))
    serving = ServingCapacity(
        engine="hf", sequences=b, tokens_per_sequence=ctx.context, kv_bytes_per_token=per_token, kv_bytes_needed=kv_full
    )
    terms = [
        base[0],
        kv_end,
        term(
            "prefill layer working set",
            _C.ACTIVATIONS,
            working,
            f"one layer for {b} x {seq_q} tokens ({ctx.attention})",
            "inside a layer's prefill",
        ),
        term("last-position logits", _C.TEMPORARY, logits, _logits_formula(ctx), "at the LM head"),
    ]
    return StagePlan(phases=phases, serving=serving, runtime={}, terms=terms, notes=notes)


def _logits_formula(ctx: InferenceContext) -> str:
    return f"{ctx.batch} x vocab {ctx.spec.vocab_size} x ({ctx.compute_bytes} + 4 float32) bytes"


def _decode_phase(
    ctx: InferenceContext, stage: StageWeights, kept: list[Term], *, attention_kv: int, logits: int, notes: list[str]
) -> PhaseMemory:
    """The last decode step: the whole cache (in ``kept``), one token's layer working set and logits, and
    one layer's old cache while ``DynamicCache`` concatenates it (the whole old tuple cache before
    transformers' ``generate_cache`` rule)."""
    b, versions = ctx.batch, ctx.workload.versions
    layer_kv = attention_kv // max(_attending(stage, ctx), 1)
    old = f"KV cache {attention_kv:,} B / {max(_attending(stage, ctx), 1)} attending layers"
    if older_than(versions, "generate_cache"):  # the old tuple cache is alive beside the new one
        layer_kv, old = attention_kv, "the whole old tuple cache beside the new one"
        notes.append(rule_note(versions, "generate_cache"))
    step = hf_layer_working_bytes(
        ctx.spec,
        batch=b,
        seq_q=1,
        seq_kv=ctx.context,
        attention=ctx.attention,
        compute_bytes=ctx.compute_bytes,
        tp=ctx.tp,
    )
    at = f"the last decode step at {ctx.context} tokens"
    inputs = _INPUT_BYTES_PER_TOKEN * b * ctx.context
    terms = [
        *kept,
        term("decode step layer working set", _C.ACTIVATIONS, step, f"one layer for {b} x 1 token", at),
        term("last-position logits", _C.TEMPORARY, logits, _logits_formula(ctx), at),
        term("one layer's old cache while it is concatenated", _C.TEMPORARY, layer_kv, old, at),
        term("inputs (ids, attention mask)", _C.INPUTS, inputs, f"{b} x {ctx.context} tokens x 2 int64", WHOLE_RUN),
    ]
    note = f"last decode step at {ctx.context} tokens (one layer's cache concatenated: old and new copies)"
    return PhaseMemory.of_terms("decode", note, terms)


def _prefill_phase(
    ctx: InferenceContext, stage: StageWeights, base: list[Term], *, working: int, logits: int
) -> PhaseMemory:
    """The prefill's high point: the last layer's working set, or the LM head if larger.

    At the head the model's forward has returned, so only the final normed hidden states
    (``b x prompt x h``) are alive beside the last positions' logits and their float32 copy;
    the two moments never overlap. The cache holds the whole prompt in every layer
    (``windowed=False`` in :func:`_kv`).
    """
    b = ctx.batch
    hidden = b * ctx.prompt * ctx.spec.hidden_size * ctx.compute_bytes if stage.last else 0
    layer_peak = working >= hidden + logits
    at = f"{'inside the last layer' if layer_peak else 'at the LM head'} of the prefill"
    prompt = f"{b} sequences x {ctx.prompt} tokens"
    terms = [
        *base,
        term(
            "KV cache of the prompt (every layer, whole prompt)",
            _C.KV_CACHE,
            _kv(ctx, stage, ctx.prompt, windowed=False) + _states(ctx, stage),
            f"{prompt}, sliding windows not yet applied, + recurrent states",
            "from the prefill to the end",
        ),
        term(
            "prefill layer working set",
            _C.ACTIVATIONS,
            working if layer_peak else 0,
            f"one layer for {prompt} ({ctx.attention})",
            at,
        ),
        term(
            "final normed hidden states",
            _C.ACTIVATIONS,
            0 if layer_peak else hidden,
            f"{prompt} x hidden x {ctx.compute_bytes} B",
            at,
        ),
        term(
            "last-position logits",
            _C.TEMPORARY,
            0 if layer_peak else logits,
            f"{b} x vocab {ctx.spec.vocab_size} x ({ctx.compute_bytes} + 4 float32) bytes",
            at,
        ),
        term(
            "inputs (ids, attention mask)",
            _C.INPUTS,
            _INPUT_BYTES_PER_TOKEN * b * ctx.prompt,
            f"{prompt} x 2 int64",
            WHOLE_RUN,
        ),
    ]
    return PhaseMemory.of_terms(
        "prefill",
        f"{'last layer' if layer_peak else 'LM head'} of the prefill of {ctx.prompt} tokens x {b} sequences",
        terms,
    )


def _weights_formula(ctx: InferenceContext, stage: StageWeights) -> str:
    fmt = ctx.weights
    what = f"linears as {fmt.name} ({fmt.source}), the rest" if fmt else "all"
    return (
        f"{what} in {ctx.compute_bytes}-byte elements; layers {format_bytes(stage.layer_bytes)} + embedding "
        f"{format_bytes(stage.embedding_bytes)} + head {format_bytes(stage.head_bytes)} (tp {ctx.tp})"
    )


def _vllm_activation(ctx: InferenceContext, stage: StageWeights) -> tuple[int, str]:
    """The profile run's torch peak above the weights: a forward step or the sampler."""
    spec, cb, rows = ctx.spec, ctx.compute_bytes, ctx.workload.max_num_seqs
    tokens = ctx.step_tokens
    forward = vllm_layer_working_bytes(spec, tokens=tokens, compute_bytes=cb, tp=ctx.tp)
    sampler = tokens * spec.hidden_size * cb + sampler_bytes(spec, rows=rows, compute_bytes=cb) if stage.last else 0
    if sampler > forward:
        return sampler, f"sampler step over max_num_seqs {rows} sequences x vocab {spec.vocab_size}"
    return forward, f"one layer over a step of {tokens} tokens"


def _runtime(ctx: InferenceContext) -> dict[str, int]:
    runtime = {"cuda_context_and_kernels": VLLM.non_torch_bytes, "cuda_graphs": VLLM.cuda_graph_bytes}
    if ctx.tp > 1 or ctx.workload.parallel.pp > 1:
        runtime["nccl_and_custom_allreduce"] = VLLM.tp_comm_bytes
    return runtime


def _hybrid_pages(ctx: InferenceContext, stage: StageWeights) -> HybridPages | None:
    """vLLM's page layout when the stage has Mamba / linear-attention layers (state_cache.py); else None."""
    layers = [ctx.spec.layers[index] for index in stage.layers]
    if not state_layers(layers):
        return None
    return hybrid_pages(
        ctx.spec,
        layers,
        kv_bytes=ctx.kv_bytes,
        state_bytes=ctx.compute_bytes,  # mamba_cache_dtype / mamba_ssm_cache_dtype auto: the model dtype
        tp=ctx.tp,
        block_size=ctx.workload.block_size,
    )


def _vllm_needed(ctx: InferenceContext, stage: StageWeights, per_token: int, notes: list[str]) -> tuple[int, int, str]:
    """(bytes of the KV blocks ``batch`` sequences of the full context need, bytes of one block
    number across the pool, the formula): paged attention layers, or vLLM's hybrid page layout."""
    block = ctx.workload.block_size
    pages = _hybrid_pages(ctx, stage)
    if pages is None:
        block_bytes = per_token * block
        formula = f"{ctx.batch} x ceil({ctx.context} / {block}) blocks x {format_bytes(block_bytes)} per block"
        return _kv(ctx, stage, ctx.context, block_size=block), block_bytes, formula
    blocks_per_sequence = pages.blocks_per_sequence(ctx.context)
    notes.append(_hybrid_note(pages, block))
    formula = (
        f"{ctx.batch} x {blocks_per_sequence} blocks ({len(pages.attention_groups)} attention group(s) x "
        f"ceil({ctx.context} / {pages.block_size}) + {pages.state_groups} state group(s) x 1) x "
        f"{format_bytes(pages.block_bytes)} per block ({pages.group_size} layers x {format_bytes(pages.page_bytes)} pages)"
    )
    return ctx.batch * blocks_per_sequence * pages.block_bytes, pages.block_bytes, formula


def _hybrid_note(pages: HybridPages, requested: int) -> str:
    raised = f" (raised from block_size {requested})" if pages.block_size != requested else ""
    return (
        f"vllm hybrid KV cache: attention blocks of {pages.block_size} tokens{raised} so that one page of "
        f"{format_bytes(pages.page_bytes)} holds a layer's Mamba / linear-attention state; layers grouped "
        f"{pages.group_size} per group, each state group takes one block per sequence; states in the model dtype "
        "(mamba_cache_dtype and mamba_ssm_cache_dtype auto)"
    )


def vllm_plan(ctx: InferenceContext, stage: StageWeights, capacity: int | None) -> StagePlan:
    """Profile-run and serving memory of vLLM on one stage (``capacity``: the GPU's bytes, if known)."""
    workload = ctx.workload
    activation, what = _vllm_activation(ctx, stage)
    runtime = _runtime(ctx)
    base = base_terms(stage, _weights_formula(ctx, stage), cublas=False)
    peak = term(
        "profile activation peak", _C.ACTIVATIONS, activation, what, "inside a forward step (profiled, kept free)"
    )
    profile = PhaseMemory.of_terms("profile", f"profile run: {what}", [*base, peak])
    per_token = _per_token(ctx, stage)
    notes: list[str] = []
    needed, block_bytes, blocks_formula = _vllm_needed(ctx, stage, per_token, notes)
    per_sequence = needed // ctx.batch
    if capacity is None:
        pool, budget, blocks, concurrent = needed, None, None, None
        notes.append("vllm without a GPU: the KV pool shown is what batch x context needs")
    else:
        budget = int(workload.gpu_memory_utilization * capacity)
        outside = runtime["cuda_graphs"] if older_than(workload.versions, "cudagraphs_in_budget") else 0
        if outside:
            notes.append(rule_note(workload.versions, "cudagraphs_in_budget"))
        pool = budget - stage.total - activation - sum(runtime.values()) + outside
        blocks = max(pool, 0) // block_bytes if block_bytes else 0
        concurrent = min(workload.max_num_seqs, max(pool, 0) // per_sequence) if per_sequence else 0
    pool_formula = (
        f"{blocks_formula} (no GPU given)"
        if capacity is None
        else f"{workload.gpu_memory_utilization} x {format_bytes(capacity)} - weights - activation peak"
        " - non-torch memory - CUDA graphs"
    )
    kv_pool = term(
        "KV pool" if capacity is not None else "KV needed", _C.KV_CACHE, max(pool, 0), pool_formula, WHOLE_RUN
    )
    serving_phase = PhaseMemory.of_terms(
        "serving", "weights, the pre-allocated KV pool and the profiled activation peak", [*base, kv_pool, peak]
    )
    serving = ServingCapacity(
        engine="vllm",
        sequences=ctx.batch,
        tokens_per_sequence=ctx.context,
        kv_bytes_per_token=per_token,
        kv_bytes_needed=needed,
        budget_bytes=budget,
        kv_pool_bytes=pool if capacity is not None else None,
        kv_block_bytes=block_bytes,
        kv_blocks=blocks,
        max_concurrent_sequences=concurrent,
    )
    terms = [*base, peak, term("KV needed", _C.KV_CACHE, needed, blocks_formula, WHOLE_RUN)]
    if budget is not None:
        terms.append(kv_pool)
    return StagePlan(phases=[profile, serving_phase], serving=serving, runtime=runtime, terms=terms, notes=notes)
