"""A PEFT LoRA decoder layer's forward in code order, tensor by tensor, for the allocator replay.

The step pattern (:mod:`vramlens.estimator.step_pattern`) writes a layer's saved tensors in module
order; between them the real forward makes and frees tensors that nobody keeps (a norm's fp32
intermediates, a projection's output until the next op reads it, the rotary embedding's halves, a
residual sum), and in a LoRA step, where the saved tensors are mostly small adapter casts, those
decide which cached blocks the next requests land in. Written in module order, with the short-lived
tensors left out, the replay fragmented the layers' segments unlike the real step (Qwen2.5-1.5B and
Gemma 3 270M with LoRA at 4096 tokens: the second step's last layer then fitted in cached blocks
instead of splitting the freed logits segment, and reserved came out 7-15% low). The simulator's
replay of the same step with each layer's recorded forward put in place of the pattern's agreed
within 1.7% on every LoRA and bf16 case of ``tests/simulator/test_agreement.py``.

:func:`lora_forward_script` writes the forward as transformers 5.x and PEFT run it, for the families
whose layer it describes (pre- and post-norm decoders with RMS norms, rotary attention through SDPA,
flash or eager, a gated MLP; Llama, Qwen 2/3, Gemma 2/3, OLMo 2):

* RMS norm (``LlamaRMSNorm``): the fp32 copy (kept), ``pow(2)`` (freed by ``mean``), the rsqrt
  (kept), ``x * rsqrt`` (fp32), its cast and ``weight *`` it (the output), the cast and the product
  freed on return; Gemma's and OLMo 2's norms multiply by the weight in fp32 before casting
  (``GemmaRMSNorm``: the product rebinds the normalized tensor, which is freed before the cast);
* a projection with a LoRA adapter (PEFT ``lora.Linear.forward``): the frozen base output, the
  adapter's fp32 input cast (kept), ``lora_A``'s output (kept), ``lora_B``'s output and its scaled
  copy, the sum, the base output freed, the sum cast back to the base dtype; without an adapter
  the base output alone; q/k norms right after their projection (Qwen 3, OLMo 2) or after all three
  (Gemma 3, :attr:`~vramlens.resolve.styles.HfStyle.qk_norm_after_values`);
* rotary (``apply_rotary_pos_emb``): ``q * cos``, ``-x2``, ``cat``, ``* sin``, the sum (kept);
* attention: SDPA or flash keeps the rotated queries, keys, values, its output and log-sum-exp; keys
  and values repeated to every head (a mask with GQA) are copies; eager attention writes its score
  chain with grad (:func:`~vramlens.estimator.eager_attention.eager_score_chain`), then
  ``matmul(probs, v)`` and its contiguous transpose, the o_proj input;
* the residual sums, the MLP's ``act(gate) * up`` product (the down projection's input), each
  freed when the code drops it; the layer's input is freed by the caller after the output exists.

The saved tensors are the recipe's parts (:mod:`vramlens.estimator.recompute`): every part is
consumed by one of the rules above, and what the script keeps adds up to the parts' bytes exactly,
else no script is written (the pattern keeps the module-order layer). Bytes are ``int``.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.allocator.pattern import Pattern
from vramlens.estimator.eager_attention import EAGER_KEPT, alive_bytes, eager_score_chain
from vramlens.estimator.layout import effective_quant
from vramlens.estimator.loss_pattern import Step
from vramlens.model.modules import layer_linears
from vramlens.model.spec import LayerKind
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import seq_per_rank
from vramlens.resolve.kernels import liger_layers
from vramlens.resolve.styles import HfStyle, NormStyle
from vramlens.workload.options import AttentionImpl, Quant

__all__ = ["ForwardScript", "lora_forward_script", "write_steps"]

_NORMS = (NormStyle.RMS, NormStyle.RMS_FP32_WEIGHT, NormStyle.GEMMA)
_GATED_MLP = "mlp gate, up and activation outputs"


@dataclass(frozen=True, kw_only=True, slots=True)
class ForwardScript:
    """One layer's forward: ``steps`` as a loss script's (``("+", name, bytes)``, ``("-", name, 0)``);
    the names alive at the end are kept for backward but ``released``, which are freed once the
    layer's output exists (the residual sum's inputs)."""

    steps: tuple[Step, ...]
    released: tuple[str, ...]

    def write(self, pattern: Pattern) -> tuple[list[int], list[int]]:
        """Write the steps into ``pattern``; returns the keys of the kept tensors and of the released."""
        alive = _written(pattern, self.steps)
        released = [alive.pop(name) for name in self.released if name in alive]
        return list(alive.values()), released


def write_steps(pattern: Pattern, steps: tuple[Step, ...]) -> list[int]:
    """Write a script's steps into ``pattern``; returns the keys of the tensors left alive."""
    return list(_written(pattern, steps).values())


def _written(pattern: Pattern, steps: tuple[Step, ...]) -> dict[str, int]:
    alive: dict[str, int] = {}
    for op, name, nbytes in steps:
        if op == "+":
            alive[name] = pattern.alloc(nbytes)
        elif name in alive:
            pattern.free(alive.pop(name))
    return alive


class _Unwritten(Exception):
    """A part or a layer shape the script does not describe."""


class _Writer:
    """Builds the steps; tensors are named ``label#n``."""

    def __init__(self, parts: list[tuple[str, list[int]]], compute_bytes: int, hidden: int) -> None:
        self.parts = {name: tensors for name, tensors in parts}
        self.used: set[str] = set()
        self.steps: list[Step] = []
        self.kept_bytes = 0
        self.a, self.hidden = compute_bytes, hidden
        self._count = 0

    def new(self, nbytes: int, label: str) -> str:
        name = f"{label}#{self._count}"
        self._count += 1
        self.steps.append(("+", name, nbytes))
        return name

    def free(self, *names: str) -> None:
        self.steps += [("-", name, 0) for name in names if name]

    def temporary(self, nbytes: int, label: str) -> None:
        self.free(self.new(nbytes, label))

    def has(self, part: str) -> bool:
        return part in self.parts

    def kept(self, part: str) -> list[str]:
        """Make a part's tensors, kept for backward."""
        if part not in self.parts or part in self.used:
            raise _Unwritten(part)
        self.used.add(part)
        self.kept_bytes += sum(self.parts[part])
        return [self.new(nbytes, part) for nbytes in self.parts[part]]

    def count_kept(self, part: str, nbytes: int) -> None:
        """A tensor made as another's output stands for ``part`` (kept)."""
        if part not in self.parts or part in self.used or sum(self.parts[part]) != nbytes:
            raise _Unwritten(part)
        self.used.add(part)
        self.kept_bytes += nbytes


class _Layer:
    """One decoder layer's forward (see the module doc)."""

    def __init__(self, ctx: TrainingContext, kind: LayerKind, style: HfStyle, w: _Writer, targets: frozenset[str]):
        self.ctx, self.kind, self.style, self.w, self.targets = ctx, kind, style, w, targets
        tp, tokens = ctx.workload.parallel.tp, ctx.tokens
        self.out = {s.name: s.out_features // tp * tokens for s in layer_linears(ctx.spec, kind)}

    def norm(self, label: str) -> str:
        """The norm ``label`` (its parts' prefix) on a tensor alive now; returns its output."""
        w = self.w
        fp32 = w.parts.get(f"{label} fp32 input", [])
        if len(fp32) != 1:
            raise _Unwritten(f"{label} fp32 input")
        w.kept(f"{label} fp32 input")
        w.temporary(fp32[0], "pow")
        w.kept(f"{label} rsqrt")
        normalized = w.new(fp32[0], "normalized")
        if self.style.norm == NormStyle.GEMMA:
            weighted = w.new(fp32[0], "weighted")
            w.free(normalized)
            output = w.new(fp32[0] * w.a // 4, label)
            w.free(weighted)
            return output
        fp32_weight = self.style.norm == NormStyle.RMS_FP32_WEIGHT
        weighted = w.new(fp32[0] if fp32_weight else fp32[0] * w.a // 4, "weighted")
        output = w.new(fp32[0] * w.a // 4, label)
        w.free(weighted, normalized)
        return output

    def linear(self, name: str) -> str:
        """A projection's output: PEFT's adapter sum (fp32 adapters) where it has an adapter."""
        w, out = self.w, self.out.get(name)
        if out is None:
            raise _Unwritten(name)
        base = w.new(out * w.a, f"{name} base")
        if name not in self.targets:
            return base
        w.kept(f"{name} adapter input")
        w.kept(f"{name} lora_A output")
        made = w.new(out * 4, "lora_B")
        scaled = w.new(out * 4, "scaled")
        w.free(made)
        total = w.new(out * 4, "sum")
        w.free(scaled, base)
        result = w.new(out * w.a, name)
        w.free(total)
        return result

    def norm_of(self, label: str, x: str) -> str:
        """The norm ``label`` on ``x`` where the layer has one (q/k norms, post-norms); ``x`` freed after it."""
        if not self.w.has(f"{label} fp32 input"):
            return x
        normed = self.norm(label)
        self.w.free(x)
        return normed

    def rotary(self, x: int, table_bytes: int) -> str:
        """``q * cos + rotate_half(q) * sin`` of an ``x``-byte tensor, the products and the sum in the
        tables' dtype (``table_bytes`` per element); returns the sum."""
        w = self.w
        wide = x * table_bytes // w.a
        by_cos, half = w.new(wide, "cos"), w.new(x // 2, "half")
        rotated = w.new(x, "rotated")
        w.free(half)
        by_sin = w.new(wide, "sin")
        w.free(rotated)
        total = w.new(wide, "embedded")
        w.free(by_cos, by_sin)
        return total

    def rotary_pair(self, query: int, keys: int) -> str:
        """The rotated queries and keys (kept or, where keys are repeated, held); fp32 tables rotate
        both in fp32, cast both back, then free the fp32 sums on return. Returns the keys'."""
        w = self.w
        if not self.style.rope_tables_fp32:
            self.rotary(query, w.a)
            return self.rotary(keys, w.a)
        wide = (self.rotary(query, 4), self.rotary(keys, 4))
        w.new(query, "q embedded")
        k_embed = w.new(keys, "k embedded")
        w.free(*wide)
        return k_embed

    def attention(self, norm_in: str) -> str:
        """From the input norm's output to o_proj's output (the norm's output freed on return)."""
        w, after = self.w, self.style.qk_norm_after_values
        if not self.kind.rope:
            raise _Unwritten("attention without rotary")
        q = self.linear("q_proj") if after else self.norm_of("q_norm", self.linear("q_proj"))
        k = self.linear("k_proj") if after else self.norm_of("k_norm", self.linear("k_proj"))
        v = self.linear("v_proj")
        if after:
            q, k = self.norm_of("q_norm", q), self.norm_of("k_norm", k)
        query, keys, values = (self.out[name] * w.a for name in ("q_proj", "k_proj", "v_proj"))
        k_embed = self.rotary_pair(query, keys)
        w.count_kept("attention q", query)
        w.free(q, k)
        held: list[str] = []
        part = "attention k, v" if w.has("attention k, v") else "attention k, v (repeated to all heads)"
        repeat = sum(w.parts.get(part, [0])) // (keys + values)
        if repeat > 1:  # repeat_kv's copies for every query head (a mask with GQA, or eager attention)
            w.new(keys * repeat, "repeated keys")
            w.new(values * repeat, "repeated values")
            held = [k_embed, v]
        w.count_kept(part, (keys + values) * repeat)  # else the rotated keys and the values themselves
        if self.ctx.attention is AttentionImpl.EAGER or (self.ctx.math_unmasked and not self.kind.sliding):
            held.insert(0, self._eager(query))  # eager attention, or SDPA's math backend (the same tensors)
        else:
            if w.has("attention mask as a bias"):
                w.kept("attention mask as a bias")
            w.kept("attention output")
            w.kept("attention log-sum-exp")
        result = self.linear("o_proj")
        w.free(*held, norm_in)
        return result

    def _eager(self, query: int) -> str:
        """Eager attention's score chain with grad, its kept tensors standing for the parts; returns
        the o_proj input (the contiguous transpose of ``probs @ v``)."""
        w, ctx = self.w, self.ctx
        steps = eager_score_chain(
            ctx.spec,
            self.style,
            compute_bytes=w.a,
            autocast=False,
            seq=seq_per_rank(ctx.workload),
            tokens=ctx.tokens,
            tp=ctx.workload.parallel.tp,
            grad=True,
        )
        if not steps:
            raise _Unwritten("eager attention with sinks")
        w.steps += [(op, f"eager {name}", nbytes) for op, name, nbytes in steps]
        if alive_bytes(steps) != sum(sum(w.parts.get(part, [])) for part in EAGER_KEPT):
            raise _Unwritten("eager attention's kept tensors")
        for part in EAGER_KEPT:
            if w.has(part):
                w.count_kept(part, sum(w.parts[part]))
        product = w.new(query, "probs @ v")
        output = w.new(query, "attention output")
        w.free(product)
        return output

    def mlp(self) -> str:
        """The gated MLP from its input (alive) to the down projection's output; the gate
        projection's output, the activation and the up projection's output are the kept parts."""
        w = self.w
        sizes = w.parts.get(_GATED_MLP, [])
        inner = [self.out.get(name, 0) * w.a for name in ("gate_proj", "up_proj")]
        if len(sizes) != 3 or sizes[0] != inner[0] or sizes[2] != inner[1]:
            raise _Unwritten(_GATED_MLP)
        self.linear("gate_proj")
        w.new(sizes[1], "act")
        self.linear("up_proj")
        w.count_kept(_GATED_MLP, sum(sizes))
        product = w.new(sizes[1], "act * up")
        down = self.linear("down_proj")
        w.free(product)
        return down

    def write(self) -> tuple[str, ...]:
        """The whole forward; returns the names freed after the layer's output."""
        w, style = self.w, self.style
        norm_in = self.norm("input norm") if style.pre_attn_norm else ""
        attended = self.attention(norm_in)
        if style.post_attn_norm:
            attended = self.norm_of("post-attention norm", attended)
        middle = w.new(w.hidden, "residual")
        w.free(attended)
        mlp_in = self.norm("pre-MLP norm") if style.pre_mlp_norm else ""
        down = self.mlp()
        w.free(mlp_in)
        if style.post_mlp_norm:
            down = self.norm_of("post-MLP norm", down)
        return (down, middle)


def lora_forward_script(
    ctx: TrainingContext, kind: LayerKind, parts: list[tuple[str, list[int]]], targets: frozenset[str], style: HfStyle
) -> ForwardScript | None:
    """The forward of one layer of ``kind`` whose saved tensors are ``parts`` (each part's name and
    its tensors, bytes), or None where the module doc's rules do not describe it: a LoRA step in bf16
    or fp16 without autocast, PEFT's adapters on transformers' modules, an attention layer with a
    gated MLP whose norms are RMS norms, every part consumed and the kept bytes the parts' bytes."""
    profile = ctx.profile
    if not targets or ctx.full or ctx.autocast or ctx.compute_bytes == 4 or profile.own_modules is not None:
        return None
    if effective_quant(ctx) is not Quant.NONE:  # k-bit linears return their input's dtype, dequantize inside
        return None
    if not profile.adapters_fp32 or ctx.workload.compile or style.norm not in _NORMS or style.out_proj_copy:
        return None
    if liger_layers(ctx.workload.kernels):  # Liger's norms, MLP and in-place RoPE are not transformers' code
        return None
    writer = _Writer(parts, ctx.compute_bytes, ctx.tokens * ctx.spec.hidden_size * ctx.compute_bytes)
    try:
        released = _Layer(ctx, kind, style, writer, targets).write()
    except _Unwritten:
        return None
    total = sum(sum(tensors) for _, tensors in parts)
    if writer.used != {name for name, _ in parts} or writer.kept_bytes != total:
        return None
    return ForwardScript(steps=tuple(writer.steps), released=tuple(name for name in released if name))
