"""One decoder layer's tensors as the allocator is asked for them (:mod:`vramlens.estimator.step_shape`).

The saved activations of every layer kind come from the layer recipe's parts
(:mod:`vramlens.estimator.recompute`), each part as the tensors it holds; PEFT's adapter sums
(``result = base(x); result = result + lora_B(lora_A(dropout(x))) * scaling``, the terms'
``adapter_transients`` in :mod:`vramlens.estimator.mlp_working`) where the adapted linear runs.
Bytes are ``int``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramlens.estimator.eager_attention import EAGER_KEPT, alive_bytes
from vramlens.estimator.layer_script import ForwardScript, lora_forward_script
from vramlens.estimator.loss_pattern import Step
from vramlens.estimator.quantities import StageMemory
from vramlens.estimator.recompute import layer_activations, layer_kind, train_state
from vramlens.estimator.saved_parts import GATHERED, HEADS, SEQUENCE, Part
from vramlens.estimator.score_chains import forward_score_chain, recomputed_score_chain
from vramlens.model.modules import layer_linears
from vramlens.model.spec import LayerKind
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.frameworks import layer_style
from vramlens.workload.options import AttentionImpl

__all__ = ["EagerChain", "Saved", "saved_tensors", "score_chain", "tensor_widths", "working_pieces"]


def saved_tensors(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str]) -> Saved:
    """Each activation kind's saved tensors and the kind of each of the stage's layers: the
    recipe's parts of every layer kind (:func:`layer_kind`) when the layers keep them all (with
    PEFT's adapter sums after each adapter, :func:`kind_tensors`); under recompute each layer's
    share of the saved total as one tensor (the checkpointed input) and the largest kind's parts
    re-created in its backward."""
    stage = mem.stage
    state = train_state(ctx, targets)
    acts = layer_activations(ctx, state, stage.layer_range)
    built = {kind: kind_tensors(ctx, kind, parts, targets) for kind, parts in acts.parts_by_kind}
    style = layer_style(ctx.spec.model_type, ctx.profile)
    scripts = {
        kind: lora_forward_script(ctx, kind, part_tensors(ctx, parts), targets, style)
        for kind, parts in acts.parts_by_kind
    }
    chains = {
        kind: None if scripts[kind] else eager_chain(forward_score_chain(ctx, state, kind), part_tensors(ctx, parts))
        for kind, parts in acts.parts_by_kind
    }
    kinds = list(built)
    index = tuple(
        kinds.index(layer_kind(ctx.spec.layers[i], ctx.workload.seq)) if kinds else 0 for i in stage.layer_range
    )
    lists = [built[kind][0] for kind in kinds] or [[]]
    total = sum(sum(lists[i]) for i in index)
    if total and abs(total - mem.activations_bytes) <= 0.02 * total:
        adapters = [built[kind][1] for kind in kinds] or [[]]
        return Saved(
            lists=lists,
            index=index,
            recomputed=[],
            adapters=adapters,
            scripts=[scripts[k] for k in kinds],
            chains=[chains[k] for k in kinds],
        )
    per_layer = mem.activations_bytes // max(stage.layers, 1)
    largest = max(lists, key=sum)
    if mem.recompute_bytes and abs(sum(largest) - mem.recompute_bytes) > 0.02 * mem.recompute_bytes:
        largest = _greedy(mem.recompute_bytes, tensor_widths(ctx))  # selective: the attention core's share
    return Saved(lists=[[per_layer] if per_layer else []], index=(), recomputed=largest if mem.recompute_bytes else [])


def score_chain(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str]) -> tuple[Step, ...]:
    """Eager attention's score tensors of a recomputed layer's first forward, one by one
    (:func:`~vramlens.estimator.score_chains.recomputed_score_chain`; empty when none are written)."""
    return recomputed_score_chain(ctx, train_state(ctx, targets), mem.stage.layer_range)


def _greedy(total: int, widths: tuple[int, ...]) -> list[int]:
    """``total`` bytes as the layer's natural tensors, largest first, the rest as one tensor."""
    found: list[int] = []
    for width in widths:
        while width > 0 and total >= width:
            found.append(width)
            total -= width
    return [*found, total] if total > 0 else found


@dataclass(frozen=True, kw_only=True, slots=True)
class Saved:
    """What :func:`_saved` finds (see the :class:`StepShape` fields of the same meaning)."""

    lists: list[list[int]]
    index: tuple[int, ...]
    recomputed: list[int]
    adapters: list[list[tuple[int, int, int]]] = field(default_factory=lambda: [[]])
    scripts: list[ForwardScript | None] = field(default_factory=list)
    chains: list[EagerChain | None] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class EagerChain:
    """Eager attention's score chain in a layer written from its saved tensors: ``steps`` are written
    in place of the saved tensors at ``replaced`` (positions in the layer kind's list, the first where
    the chain goes), whose bytes are what the chain leaves alive (:data:`EAGER_KEPT`)."""

    steps: tuple[Step, ...]
    replaced: tuple[int, ...]


def eager_chain(steps: tuple[Step, ...], named: list[tuple[str, list[int]]]) -> EagerChain | None:
    """The chain ``steps`` of a layer whose saved tensors are ``named`` (each part's name and its
    tensors, in the order of the kind's list), or None: no chain, or one that does not leave alive
    exactly the kept parts' bytes (a layer the chain does not describe keeps its saved tensors)."""
    if not steps:
        return None
    replaced: list[int] = []
    kept = at = 0
    for name, tensors in named:
        if name in EAGER_KEPT:
            replaced += range(at, at + len(tensors))
            kept += sum(tensors)
        at += len(tensors)
    if not replaced or alive_bytes(steps) != kept:
        return None
    return EagerChain(steps=steps, replaced=tuple(replaced))


def kind_tensors(
    ctx: TrainingContext, kind: LayerKind, parts: tuple[Part, ...], targets: frozenset[str]
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """One layer kind's saved tensors in module order (a part that is a family of equal tensors,
    such as gate, up and activation outputs or keys and values, split into them) and PEFT's adapter
    sums of ``result = base(x); result = result + lora_B(lora_A(dropout(x))) * scaling``: the base
    output before the adapter's input copy, the sum after its ``lora_A`` output (the terms'
    ``adapter_transients``), as :attr:`StepShape.adapter_sums` lists them."""
    outs = {
        s.name: s.out_features // ctx.workload.parallel.tp for s in layer_linears(ctx.spec, kind) if s.name in targets
    }
    tensors: list[int] = []
    adapters: list[tuple[int, int, int]] = []
    starts: dict[str, int] = {}
    for name, each in part_tensors(ctx, parts):
        linear = name.removesuffix(" adapter input")
        if linear != name:
            starts[linear] = len(tensors)
        tensors += each
        linear = name.removesuffix(" lora_A output")
        if linear != name and linear in outs:
            adapters.append((starts.get(linear, len(tensors) - 1), len(tensors), outs[linear] * ctx.tokens))
    return tensors, adapters


def part_tensors(ctx: TrainingContext, parts: tuple[Part, ...]) -> list[tuple[str, list[int]]]:
    """Each part's name and the tensors it holds on this rank (:func:`_tensors`), bytes."""
    tp, tokens = ctx.workload.parallel.tp, ctx.tokens
    divisor = {HEADS: tp, SEQUENCE: tp, GATHERED: 1}
    widths, compute = tensor_widths(ctx), tensor_widths(ctx, (ctx.compute_bytes,))
    return [
        (part.name, _tensors(int(part.bytes_per_token / divisor[part.split] * tokens), widths, compute))
        for part in parts
    ]


def tensor_widths(ctx: TrainingContext, dtypes: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Bytes of one layer's natural activation tensors of the micro-batch (the MLP intermediate, the
    queries, the keys or values, the hidden state, eager attention's scores; in ``dtypes``, bytes per element, by default the
    compute dtype and fp32), largest first."""
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    found = {spec.hidden_size, spec.num_heads * spec.head_dim // tp, spec.num_kv_heads * spec.head_dim // tp}
    if spec.mlp is not None:
        found.add(spec.mlp.intermediate_size // tp)
    if (ctx.attention is AttentionImpl.EAGER or ctx.math_unmasked) and spec.num_heads:  # scores: heads x s x s
        found.add(spec.num_heads // tp * ctx.workload.seq)
    sizes = {w * b * ctx.tokens for w in found if w for b in dtypes or {ctx.compute_bytes, 4}}
    return tuple(sorted(sizes, reverse=True))


def _tensors(nbytes: int, widths: tuple[int, ...], compute: tuple[int, ...]) -> list[int]:
    """A saved part as the tensors it holds: one tensor when it is one natural width (``widths``);
    else ``k`` equal tensors (2 <= k <= 8) of the largest natural width in the compute dtype
    (``compute``) it is a whole multiple of (a family of activations: gate, up and activation
    outputs, keys and values), then of any natural width; else one tensor."""
    if nbytes <= 0:
        return []
    if nbytes in widths:
        return [nbytes]
    for width in (*compute, *widths):
        if nbytes % width == 0 and 2 <= nbytes // width <= 8:
            return [width] * (nbytes // width)
    return [nbytes]


def working_pieces(total: int, widths: tuple[int, ...]) -> list[int]:
    """``total`` bytes of a working set as the layer's natural tensors (``widths``, largest first):
    greedily the largest that still fits, the rest as one tensor; a set over eight of the largest
    (attention scores) as equal tensors of about that size. Intermediates are created and freed
    among the layer's other tensors, not as one block."""
    if total <= 0:
        return []
    largest = max(widths[0], 1)
    if total > 8 * largest:
        count = -(-total // largest)
        return [total // count] * count
    found: list[int] = []
    rest = total
    for width in widths:
        while width > 0 and rest >= width:
            found.append(width)
            rest -= width
    return [*found, rest] if rest > 0 else found
