"""Simulated ``generate()``: prefill of the prompt, then the last (largest) decode step.

Prefill runs the model over ``batch x prompt`` tokens with the default ``DynamicCache`` and
``logits_to_keep=1`` (what ``generate`` passes since transformers 4.45), and takes the
fp32 copy of the last position's logits that ``generate``'s sampling makes. Running every
decode step would cost one forward per generated token; memory grows monotonically with
the cache, so only the last step is simulated: after the prefill, a cache of
``context - 1`` tokens is built with the tracker paused (sliding-window layers then get
window-sized tensors of their own, as by generate()'s second step) and recorded as
``kv_cache``, then one decode step runs with ``generate``'s growing ``input_ids``
(``batch x context``). Every forward gets generate()'s per-sequence ``position_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens._extras import require
from vramlens.categories import Category
from vramlens.estimator.infer.context import InferenceContext
from vramlens.result.timeline import Timeline
from vramlens.simulator.build import SimulationError, attention_note, build_model, torch_dtype
from vramlens.workload.options import Engine

__all__ = ["InferenceRun", "simulate_inference"]


@dataclass(frozen=True, kw_only=True)
class InferenceRun:
    """The events of a simulated generate() call."""

    timeline: Timeline
    notes: tuple[str, ...]


def check_inference(ctx: InferenceContext) -> None:
    """Refuse what the simulator cannot run, naming the key."""
    workload = ctx.workload
    if ctx.engine is not Engine.HF:
        raise SimulationError(
            "engine: the simulator runs transformers generate(); vLLM's pre-allocated KV pool is estimated, "
            "use `vramlens estimate` for engine vllm"
        )
    if ctx.weights is not None and ctx.weights.scheme.value != "bnb-4bit":
        raise SimulationError(
            f"quant: {ctx.weights.name} weights need GPU kernels the simulator cannot run (it runs bitsandbytes "
            "4-bit: nf4, nf4-dq); use `vramlens estimate`"
        )
    if workload.parallel.tp * workload.parallel.pp > 1:
        raise SimulationError("parallel: the simulator runs one GPU (tp=pp=1); use `vramlens estimate`")
    if workload.kv_dtype.value not in ("auto", "bf16", "fp16"):
        raise SimulationError(f"kv_dtype: {workload.kv_dtype} caches are not simulated; use `vramlens estimate`")


def simulate_inference(ctx: InferenceContext, *, fake_mode: Any, tracker: Any) -> InferenceRun:
    """Prefill and last decode step of ``ctx`` under ``tracker``."""
    torch = require("torch", purpose="vramlens simulate")
    check_inference(ctx)
    dtype = torch_dtype(ctx.workload.precision, ctx.compute_bytes)
    model = build_model(
        ctx.spec, ctx.workload, dtype=dtype, attention=ctx.attention, fake_mode=fake_mode, weights=ctx.weights
    )
    model.eval()
    model.config.use_cache = True
    batch = ctx.batch
    tracker.register_model(model)
    with fake_mode, torch.no_grad():
        prompt = torch.randint(0, ctx.spec.vocab_size, (batch, ctx.prompt))
        tracker.register(prompt, Category.INPUTS)
        with tracker:
            with tracker.phase("prefill"):
                cache = _step(torch, model, prompt, None, tracker, start=0)
            if ctx.context > ctx.prompt:
                del cache, prompt  # generate() replaces both as it goes
                _decode(torch, model, ctx, tracker)
    from vramlens.simulator.quant import quant_note

    notes = [note for note in (attention_note(model), quant_note(model)) if note]
    notes.append("decode: the last step at the full context is simulated (the cache is grown to context - 1 first)")
    return InferenceRun(timeline=tracker.timeline(), notes=tuple(notes))


def _decode(torch: Any, model: Any, ctx: InferenceContext, tracker: Any) -> None:
    batch = ctx.batch
    with tracker.paused():
        filled = torch.randint(0, ctx.spec.vocab_size, (batch, ctx.context - 1))
        positions = _positions(torch, batch, 0, ctx.context - 1)
        cache = model(input_ids=filled, position_ids=positions, use_cache=True, logits_to_keep=1).past_key_values
        del filled, positions
        _own_windows(cache)
    with tracker.phase("decode"):
        tracker.register(cache_tensors(cache), Category.KV_CACHE)
        ids = torch.randint(0, ctx.spec.vocab_size, (batch, ctx.context))
        tracker.set_category(ids, Category.INPUTS)
        _step(torch, model, ids[:, -1:], cache, tracker, start=ctx.context - 1)


def _positions(torch: Any, batch: int, start: int, count: int) -> Any:
    """``position_ids`` as generate() passes them: one row per sequence, ``[batch, count]``
    (a model given none makes ``[1, count]``, and with it ``[1, ...]`` position embeddings
    and rotary tables instead of one per sequence)."""
    return torch.arange(start, start + count).unsqueeze(0).expand(batch, -1)


def _own_windows(cache: Any) -> None:
    """Give sliding-window layers their own window-sized tensors. Filled in one forward, a
    ``DynamicSlidingWindowLayer`` keeps views of the whole prompt's keys and values; a real
    generate() has replaced them with window-sized tensors by its second decode step."""
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "sliding_window", None) and getattr(layer, "keys", None) is not None:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()


def _step(torch: Any, model: Any, ids: Any, cache: Any, tracker: Any, *, start: int) -> Any:
    """One forward as generate() runs it; returns the cache, relabelled ``kv_cache``."""
    positions = _positions(torch, ids.shape[0], start, ids.shape[1])
    out = model(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
    cache = out.past_key_values
    del out
    logits.argmax(dim=-1)
    tracker.set_category(cache_tensors(cache), Category.KV_CACHE)
    return cache


def cache_tensors(cache: Any) -> list[Any]:
    """Every tensor a transformers cache object holds: keys and values of each layer, and the
    convolution and recurrent states a linear-attention / Mamba layer keeps in dicts by state index."""
    torch = require("torch", purpose="vramlens simulate")
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise SimulationError("model: its cache is not a transformers Cache with layers; use `vramlens estimate`")
    tensors = []
    for layer in layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, dict):
                tensors += [state for state in value.values() if isinstance(state, torch.Tensor)]
    return tensors
