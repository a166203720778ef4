"""Fit the closed-form allocator-slack fractions of ``vramlens.estimator.reserved`` to replays.

Run: ``python benchmarks/allocator_fit.py [--cases 240]``. Prints the fractions the estimator's
tables hold (``LAYER_SLACK_FRACTION``, ``KV_GROWTH_FRACTION``) and their spread; no public
measurement is read. The estimator replays only the vocabulary-sized tensors of a step through
the caching-allocator model (a few dozen requests); the slack of the per-layer tensors, which
repeat once per layer and would cost a replay of thousands of requests per estimate, is a
fraction of the memory they churn, and this script measures that fraction:

* training: the per-layer part of the step pattern (``vramlens.estimator.step_pattern``, every
  layer, two steps, vocabulary tensors removed) replayed through ``vramlens.allocator`` for a
  seeded sample of catalog models x method x precision x recompute x sequence x batch x
  optimizer implementation x sharding; slack fitted as fractions of the three kinds of churn
  (``reserved.layer_churn``) by non-negative least squares of relative errors, per (expandable
  segments, parameters sharded), with the spread of the rest;
* inference: transformers' ``DynamicCache`` growth (every decode step ``torch.cat`` makes each
  layer's keys and values one token longer, the old tensors freed after) replayed for a grid of
  layers x prompt x generated tokens x bytes per token x batch; fraction = slack / final cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
from collections import defaultdict

import numpy as np

from vramlens.allocator import AllocatorSettings
from vramlens.allocator.pattern import Pattern, pattern_peaks
from vramlens.errors import VramlensError
from vramlens.estimator.layout import param_layout
from vramlens.estimator.loss_pattern import LossScript
from vramlens.estimator.quantities import stage_memory
from vramlens.estimator.reserved import layer_churn, replayed_slack
from vramlens.estimator.step_shape import step_shape
from vramlens.model.resolve import load_model
from vramlens.resolve.context import resolve_training
from vramlens.workload.load import load_workload

MODELS = (
    "gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "olmo-2-1b", "pythia-1b", "qwen2.5-1.5b",
    "llama-3.2-3b", "mistral-7b", "llama-3.1-8b",
)  # fmt: skip
SETTINGS = {False: AllocatorSettings(), True: AllocatorSettings(expandable_segments=True)}
_NO_LOSS = LossScript(forward=(), backward=())


def training_fractions(cases: int, seed: int) -> dict[tuple[bool, bool], list[tuple[int, ...]]]:
    """(slack, *churn) of the per-layer pattern of sampled training workloads, by (expandable,
    parameters sharded); churn in the kinds of ``reserved.layer_churn``."""
    grid = list(
        itertools.product(
            MODELS, ("full", "lora"), ("bf16", "mixed-bf16", "fp32"), ("none", "full"), (512, 2048), (1, 4),
            ("fused", "foreach"), ("none", "fsdp", "zero2", "ddp"),
        )
    )  # fmt: skip
    found: dict[tuple[bool, bool], list[tuple[int, ...]]] = defaultdict(list)
    for model, method, precision, recompute, seq, batch, impl, shard in random.Random(seed).sample(grid, cases):
        parallel = {"gpus": 8, "shard": shard} if shard != "none" else {}  # ZeRO-2 and DDP: grads, not params
        workload = {"model": model, "method": method, "precision": precision, "recompute": recompute, "seq": seq,
                    "batch": batch, "optimizer_impl": impl, "parallel": parallel}  # fmt: skip
        try:
            resolved = load_workload(workload)
            spec = load_model(resolved.model)
            ctx = resolve_training(spec, resolved)
            layout = param_layout(ctx)
        except VramlensError:
            continue
        mem = stage_memory(ctx, layout.stages[0], layout.targets)
        shape = step_shape(ctx, mem, layout.targets)
        layers_only = dataclasses.replace(
            shape, edge_params=(), edge_trained=(), embedding_trained=False, head_trained=False, head_cast=0,
            non_layer=0,
        )  # fmt: skip
        churn = layer_churn(mem)
        for expandable, settings in SETTINGS.items():
            slack = replayed_slack(layers_only, _NO_LOSS, layers=shape.layers, micro_steps=1, settings=settings)
            found[(expandable, shard == "fsdp")].append((slack, *churn))
    return found


def decode_slack(layers: int, prompt: int, generate: int, per_token: int, settings: AllocatorSettings) -> float:
    """Slack / final cache bytes of a DynamicCache decode: each step every layer's keys and
    values are concatenated into tensors one token longer, then the old ones are freed."""
    pattern = Pattern()
    cache = {layer: [pattern.alloc(prompt * per_token) for _ in range(2)] for layer in range(layers)}
    for step in range(generate):
        for layer in range(layers):
            grown = [pattern.alloc((prompt + step + 1) * per_token) for _ in range(2)]
            pattern.free_all(cache[layer])
            cache[layer] = grown
    final = 2 * layers * (prompt + generate) * per_token
    return pattern_peaks(pattern, settings).slack_bytes / final


def kv_fractions() -> dict[bool, list[float]]:
    """Decode slack / cache over a grid of layers, prompt, generated tokens and bytes per token (x batch)."""
    found: dict[bool, list[float]] = defaultdict(list)
    grid = itertools.product((16, 32), (128, 1024, 4096), (128, 512), (512, 2048, 8192))
    for layers, prompt, generate, per_token in grid:
        for expandable, settings in SETTINGS.items():
            found[expandable].append(decode_slack(layers, prompt, generate, per_token, settings))
    return found


def fit_fractions(samples: list[tuple[int, ...]]) -> tuple[tuple[float, ...], float]:
    """Non-negative least squares of slack on the churn kinds, each workload weighted by 1 / its
    total churn (relative errors); returns the fractions and the upper quartile minus the median
    of the residual over the total churn."""
    rows = np.array([sample[1:] for sample in samples], dtype=float)
    slack = np.array([sample[0] for sample in samples], dtype=float)
    total = rows.sum(axis=1)
    x, y = rows / total[:, None], slack / total
    kinds = x.shape[1]
    best, best_error = np.zeros(kinds), float(np.sum(y**2))
    for size in range(1, kinds + 1):
        for active in itertools.combinations(range(kinds), size):
            coef = np.zeros(kinds)
            coef[list(active)] = np.linalg.lstsq(x[:, list(active)], y, rcond=None)[0]
            error = float(np.sum((x @ coef - y) ** 2))
            if (coef >= 0).all() and error < best_error:
                best, best_error = coef, error
    relative = sorted(y - x @ best)
    n = len(relative)
    return tuple(float(c) for c in best), relative[3 * n // 4] - relative[n // 2]


def _show(label: str, values: list[float]) -> None:
    values = sorted(values)
    n = len(values)
    print(
        f"{label:58s} n={n:4d} median {statistics.median(values):.3f}  p25 {values[n // 4]:.3f}  "
        f"p75 {values[3 * n // 4]:.3f}  p90 {values[min(n - 1, 9 * n // 10)]:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=480)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for (expandable, sharded), samples in sorted(training_fractions(args.cases, args.seed).items()):
        fractions, spread = fit_fractions(samples)
        print(
            f"training expandable={expandable!s:5} sharded={sharded!s:5} n={len(samples):3d} fractions "
            f"(saved, backward, parameters) {tuple(round(f, 3) for f in fractions)}  spread {spread:.3f}"
        )
    for expandable, values in sorted(kv_fractions().items()):
        _show(f"decode cache growth expandable={expandable}", values)


if __name__ == "__main__":
    main()
