"""Layer recipes: the bytes a model's real code allocates, fitted per layer kind (pure data).

A recipe is measured by :mod:`vramlens.simulator.recipe` (a few layers of the real model on
fake tensors, at a few batch and sequence sizes) and stored in the recipe cache
(:mod:`vramlens.model.generic.store`) under a *signature*: the settings that change what a
layer allocates (dtypes, method, LoRA shape, attention kernel, recompute). The analytic
engine reads it in pure Python (:mod:`vramlens.estimator.recipe_route`).

Every quantity is a :class:`Fit`: ``constant + shared_per_token x s + batch x
(per_sequence + per_token x s + per_token2 x s^2)`` bytes, exact at the five sizes it was
fitted on (batches of 2 and 3), two of which have the workload's own sequence length, and
checked on a sixth size it was not fitted on (one sequence, a length in between). ``constant`` holds what grows with neither
(autocast weight copies, tensors of parameter size), ``shared_per_token`` what one sequence
length shares across the batch (rotary tables computed for ``[1, s]`` positions); the rest is
per sequence. When the check misses, one sequence of the workload's length is measured on its
own (``batch_one``): there the code may keep other tensors (a view of a fused projection is
contiguous only for one sequence, so no copy is made and the whole fused output stays
alive, GPT-NeoX), and the recipe is used at its own length only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final

__all__ = [
    "RECIPE_TOLERANCE",
    "Fit",
    "InferenceKind",
    "InferenceRecipe",
    "TrainingKind",
    "TrainingRecipe",
    "check_size",
    "fit_sizes",
    "recipe_from_json",
    "recipe_to_json",
    "solve_fit",
]

#: Largest relative miss of a fit on the probe it was not fitted on, for it to be used at other
#: sequence lengths (beyond it the recipe is used only at its own sequence length).
RECIPE_TOLERANCE: Final = 0.005


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """Bytes of one quantity as a function of batch ``b`` and sequence ``s`` (see module docstring)."""

    constant: float
    shared_per_token: float
    per_sequence: float
    per_token: float
    per_token2: float
    seq: int = 0
    """The length the fit is centred on."""
    batch_one: int | None = None
    """Bytes measured for one sequence of ``seq`` tokens, when they differ from the fit's."""

    def at(self, batch: int, seq: int) -> int:
        """Bytes at ``batch`` sequences of ``seq`` tokens (never negative)."""
        if batch == 1 and seq == self.seq and self.batch_one is not None:
            return self.batch_one
        per_sequence = self.per_sequence + self.per_token * seq + self.per_token2 * seq * seq
        return max(0, round(self.constant + self.shared_per_token * seq + batch * per_sequence))


#: The two batch sizes a fit is measured at (batch 1 is measured on its own, see the module docstring).
_LOW, _HIGH = 2, 3


def fit_sizes(seq: int) -> tuple[tuple[int, int], ...]:
    """The (batch, seq) sizes a fit centred on ``seq`` is measured at: three lengths (``seq / 4``,
    ``seq / 2``, ``seq``) at batch 2, the last two at batch 3."""
    quarter, half = max(1, seq // 4), max(1, seq // 2)
    return ((_LOW, quarter), (_LOW, half), (_LOW, seq), (_HIGH, half), (_HIGH, seq))


def check_size(seq: int) -> tuple[int, int]:
    """The size a fit is checked on (not fitted on): one sequence, between the shortest and the
    longest length, so that the check tests the batch down to one and the length in between."""
    quarter = max(1, seq // 4)
    return 1, max(1, (quarter + seq) // 2)


def solve_fit(seq: int, values: tuple[int, ...], *, batch_one: int | None = None) -> Fit:
    """The :class:`Fit` through the five ``values`` measured at :func:`fit_sizes` of ``seq``
    (and ``batch_one``, measured at one sequence of ``seq``, kept when the fit misses it).

    The per-sequence part ``f(s)`` is the batch-3 value minus the batch-2 one at ``seq / 2`` and
    ``seq``; what remains of batch 2 is the shared part, a line through those two lengths; ``f``
    at ``seq / 4`` follows from the batch-2 value there minus the line, and a quadratic passes
    through the three values of ``f`` (fewer distinct lengths for a tiny ``seq``: a lower degree).
    """
    (_, s1), (_, s2), (_, s3), _, _ = fit_sizes(seq)
    v1, v2, v3, v4, v5 = values
    f2, f3 = (v4 - v2) / (_HIGH - _LOW), (v5 - v3) / (_HIGH - _LOW)
    shared2, shared3 = v2 - _LOW * f2, v3 - _LOW * f3
    slope = (shared3 - shared2) / (s3 - s2) if s3 != s2 else 0.0
    constant = shared3 - slope * s3
    points = sorted({s1: (v1 - constant - slope * s1) / _LOW, s2: f2, s3: f3}.items())
    per_sequence, per_token, per_token2 = _through(points)
    fit = Fit(
        constant=constant,
        shared_per_token=slope,
        per_sequence=per_sequence,
        per_token=per_token,
        per_token2=per_token2,
        seq=seq,
    )
    if batch_one is not None and fit.at(1, seq) != batch_one:
        fit = replace(fit, batch_one=batch_one)
    return fit


def _through(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(c0, c1, c2) of the polynomial of degree ``len(points) - 1`` through ``points``."""
    if len(points) == 1:
        return points[0][1], 0.0, 0.0
    if len(points) == 2:
        (x1, y1), (x2, y2) = points
        slope = (y2 - y1) / (x2 - x1)
        return y1 - slope * x1, slope, 0.0
    (x1, y1), (x2, y2), (x3, y3) = points
    d1, d2 = (y2 - y1) / (x2 - x1), (y3 - y2) / (x3 - x2)
    a = (d2 - d1) / (x3 - x1)
    b = d1 - a * (x1 + x2)
    return y1 - a * x1 * x1 - b * x1, b, a


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingKind:
    """One layer of a kind in a training step (bytes allocated inside the layer)."""

    end_of_forward: Fit
    """Still alive at the loss: what the layer keeps for backward (and autocast weight copies)."""
    start_of_backward: Fit
    """Still alive when backward starts (the autocast cache of weight copies is gone)."""
    forward_transient: Fit
    """How far the layer's own allocations rise, inside its forward, above what it keeps at the
    loss: its peak is the layers before it, what it keeps, and this."""
    backward_working: Fit
    """How far, inside the layer's backward, what it kept plus what backward allocated and still
    holds (activation gradients, recomputed activations, temporaries; parameter gradients
    aside) rises above what it kept when backward started."""
    trainable: int = 0
    """Elements of the layer's trainable parameters as the run's code made them (PEFT adapters,
    on fused experts too), or all of them in full fine-tuning."""
    frozen_bytes: int = 0
    """Bytes of the layer's frozen parameters and buffers as stored (NF4 weights and their
    quantization state for QLoRA)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingRecipe:
    """The training recipe of a model under one signature."""

    seq: int
    """The sequence length the fits are centred on (exact there)."""
    interpolates: bool
    """The check on an unfitted size held (within :data:`RECIPE_TOLERANCE`): usable at other lengths."""
    kinds: tuple[TrainingKind, ...]
    """One per layer kind of the model's :class:`~vramlens.model.generic.layout.GenericLayout`."""
    outside_forward: Fit
    """Outside the layers, alive at the loss: embedding output, position tables, masks, final norm."""
    outside_backward: Fit
    """The same, alive when backward starts."""
    head_constant: int
    """Bytes the LM head region keeps whatever the batch and length (an autocast copy of the head
    weight); its logits and loss are the estimator's own terms."""
    trainable_outside: int = 0
    """Trainable elements outside the layers (``modules_to_save`` copies; everything in full fine-tuning)."""
    frozen_outside_bytes: int = 0
    """Bytes of frozen parameters and buffers outside the layers."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceKind:
    """One layer of a kind in transformers ``generate()``."""

    prefill_cache: Fit
    """Cache (keys/values or recurrent state) the layer holds after a prefill of ``s`` tokens."""
    prefill_working: Fit
    """Peak inside the layer during the prefill above what the whole model holds when the prefill
    ends (its caches): the layer's intermediates, its input, masks and position tables."""
    decode_cache: Fit
    """Cache the layer holds after the decode step at a context of ``s`` tokens."""
    decode_working: Fit
    """Peak inside the layer during that decode step above what is held when it ends (the old
    copy of the layer's cache while it is concatenated, intermediates)."""
    weight_bytes: int = 0
    """Bytes of the layer's weights and buffers as built (quantized formats included)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceRecipe:
    """The inference recipe of a model under one signature (prompt and context lengths)."""

    prompt: int
    context: int
    interpolates: bool
    kinds: tuple[InferenceKind, ...]
    head_prefill: Fit
    """Peak at the LM head during the prefill above what is held after it: hidden states, logits."""
    head_decode: Fit
    """The same during the decode step."""
    weight_outside_bytes: int = 0
    """Bytes of the weights and buffers outside the layers (embedding, head, towers)."""
    notes: tuple[str, ...] = ()


def _fit_json(fit: Fit) -> list[float | int | None]:
    return [fit.constant, fit.shared_per_token, fit.per_sequence, fit.per_token, fit.per_token2, fit.seq, fit.batch_one]


def _fit(raw: Any) -> Fit:
    constant, shared, per_sequence, per_token, per_token2 = (float(x) for x in raw[:5])
    batch_one = raw[6]
    return Fit(
        constant=constant,
        shared_per_token=shared,
        per_sequence=per_sequence,
        per_token=per_token,
        per_token2=per_token2,
        seq=int(raw[5]),
        batch_one=None if batch_one is None else int(batch_one),
    )


def recipe_to_json(recipe: TrainingRecipe | InferenceRecipe) -> dict[str, Any]:
    """A JSON-safe dict of a recipe (fits as four numbers)."""
    out: dict[str, Any] = {"type": type(recipe).__name__}
    for item in fields(recipe):
        value = getattr(recipe, item.name)
        if isinstance(value, Fit):
            out[item.name] = _fit_json(value)
        elif item.name == "kinds":
            out[item.name] = [
                {f.name: _fit_json(v) if isinstance(v := getattr(kind, f.name), Fit) else v for f in fields(kind)}
                for kind in value
            ]
        else:
            out[item.name] = list(value) if isinstance(value, tuple) else value
    return out


def _training_kind(raw: Mapping[str, Any]) -> TrainingKind:
    return TrainingKind(
        end_of_forward=_fit(raw["end_of_forward"]),
        start_of_backward=_fit(raw["start_of_backward"]),
        forward_transient=_fit(raw["forward_transient"]),
        backward_working=_fit(raw["backward_working"]),
        trainable=int(raw["trainable"]),
        frozen_bytes=int(raw["frozen_bytes"]),
    )


def recipe_from_json(data: Mapping[str, Any]) -> TrainingRecipe | InferenceRecipe:
    """The inverse of :func:`recipe_to_json` (``KeyError``/``ValueError``/``TypeError`` on a bad document)."""
    if data["type"] == "TrainingRecipe":
        return TrainingRecipe(
            seq=int(data["seq"]),
            interpolates=bool(data["interpolates"]),
            kinds=tuple(_training_kind(kind) for kind in data["kinds"]),
            outside_forward=_fit(data["outside_forward"]),
            outside_backward=_fit(data["outside_backward"]),
            head_constant=int(data["head_constant"]),
            trainable_outside=int(data["trainable_outside"]),
            frozen_outside_bytes=int(data["frozen_outside_bytes"]),
            notes=tuple(str(n) for n in data["notes"]),
        )
    if data["type"] == "InferenceRecipe":
        return InferenceRecipe(
            prompt=int(data["prompt"]),
            context=int(data["context"]),
            interpolates=bool(data["interpolates"]),
            kinds=tuple(
                InferenceKind(
                    prefill_cache=_fit(kind["prefill_cache"]),
                    prefill_working=_fit(kind["prefill_working"]),
                    decode_cache=_fit(kind["decode_cache"]),
                    decode_working=_fit(kind["decode_working"]),
                    weight_bytes=int(kind["weight_bytes"]),
                )
                for kind in data["kinds"]
            ),
            head_prefill=_fit(data["head_prefill"]),
            head_decode=_fit(data["head_decode"]),
            weight_outside_bytes=int(data["weight_outside_bytes"]),
            notes=tuple(str(n) for n in data["notes"]),
        )
    raise ValueError(f"unknown recipe type {data['type']!r}")
