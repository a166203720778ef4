"""``vramlens activations MODEL``: activation elements per token, counted on a fake forward pass.

Values go through the workload loader, so ``--seq 8k`` works and bad values are the same
one-line errors as ``vramlens estimate`` gives (exit status 2).
"""

from __future__ import annotations

from typing import Any

import click

from vramlens.cli._output import dumps, echo
from vramlens.units import format_bytes

__all__ = ["activations_command"]

#: Tokens per sequence when --seq is not given (cut to the model's context).
DEFAULT_SEQ = 2048


@click.command("activations")
@click.argument("model")
@click.option("--batch", default="1", show_default=True, metavar="N", help="Sequences in the batch.")
@click.option(
    "--seq",
    default=None,
    metavar="TOKENS",
    help="Tokens per sequence (e.g. 4096 or 8k) [default: 2048, or the model's context if shorter].",
)
@click.option(
    "--precision",
    default="bf16",
    show_default=True,
    metavar="VALUE",
    help="fp32 | bf16 | fp16 | mixed-bf16 | mixed-fp16",
)
@click.option(
    "--attention", default="auto", show_default=True, metavar="VALUE", help="auto | flash | efficient | sdpa | eager"
)
@click.option(
    "--seed-count/--no-seed-count",
    default=True,
    show_default=True,
    help="Also count as seed 002 does (every module hooked, float32, one token) and show it beside.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def activations_command(
    model: str, batch: str, seq: str | None, precision: str, attention: str, seed_count: bool, fmt: str
) -> None:
    """Count activations per token of MODEL by hooking every leaf module's output in one training
    forward on fake tensors (no weights, no GPU), beside seed 002's own count (every module, float32,
    one token) and its published linear heuristic."""
    from vramlens.model.resolve import load_model
    from vramlens.simulator.activations import count_activations

    spec = load_model(model)
    chosen = seq
    if chosen is None:  # the default, cut to the model's context (gpt2: 1024)
        limit = spec.max_position_embeddings
        chosen = str(min(DEFAULT_SEQ, limit)) if limit else str(DEFAULT_SEQ)
    count = count_activations(spec, batch=batch, seq=chosen, precision=precision, attention=attention)
    seed = None
    if seed_count:
        from vramlens.simulator.seed_count import seed_count as count_seed

        seed = count_seed(spec)
    if fmt == "json":
        data = count.to_dict()
        if seed is not None:
            data["seed_count"] = {"bytes_per_token": seed.bytes_per_token, "elements_per_token": seed.elements_per_token,
                                  "modules": seed.modules}  # fmt: skip
        click.echo(dumps(data, indent=2))
        return
    if seq is None and chosen != str(DEFAULT_SEQ):
        echo(f"seq: {chosen} ({spec.name}'s context; the default {DEFAULT_SEQ} is longer)")
    for line in _text(count):
        echo(line)
    for line in _seed_lines(count, seed):
        echo(line)


def _number(value: float) -> str:
    """Thousands-separated, with one decimal only when the value is not whole (e.g. rotary tables / batch)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _per_token_bytes(value: float) -> str:
    return format_bytes(round(value))


def _text(count: Any) -> list[str]:
    tokens = count.tokens
    lines = [
        f"{count.model}: training forward, batch {count.batch} x seq {count.seq} = {tokens:,} tokens, "
        f"{count.precision}, attention {count.attention}, {count.num_parameters:,} parameters",
        "",
        "Leaf-module outputs (forward hooks; layer modules summed over "
        f"{len(count.per_layer_elements)} decoder layers), per token:",
    ]
    width = max(len(row.name) for row in count.rows) if count.rows else 6
    types = max(len(row.module_type) for row in count.rows) if count.rows else 4
    lines.append(f"  {'module':<{width}}  {'type':<{types}}  {'calls':>5}  {'elements':>12}  {'bytes':>11}")
    for row in count.rows:
        lines.append(
            f"  {row.name:<{width}}  {row.module_type:<{types}}  {row.calls:>5}  "
            f"{_number(row.elements / tokens):>12}  {_per_token_bytes(row.nbytes / tokens):>11}"
        )
    return [*lines, *_totals(count), *_comparison(count)]


def _totals(count: Any) -> list[str]:
    tokens = count.tokens
    layers = count.per_layer_elements
    per_layer = sorted({n / tokens for n in layers})
    layer_text = " to ".join(dict.fromkeys(_number(v) for v in (per_layer[0], per_layer[-1]))) if per_layer else "n/a"
    outside = ", ".join(row.name for row in count.rows if not row.in_layers)
    lines = ["", "By module type (elements per token):"]
    for name, elements in count.by_module_type.items():
        lines.append(f"  {name:<28} {_number(elements / tokens):>14}")
    return [
        *lines,
        "",
        f"per decoder layer:        {layer_text} elements/token",
        f"outside the layers:       {_number(count.non_layer_elements / tokens)} elements/token ({outside})",
        f"total hooked outputs:     {_number(count.elements_per_token)} elements/token = "
        f"{_per_token_bytes(count.bytes_per_token)}/token at the output dtypes "
        f"({format_bytes(count.nbytes)} for the whole forward)",
        f"kept alive after forward: {_per_token_bytes(count.saved_bytes_per_token)}/token "
        f"({format_bytes(count.saved_bytes)} for the whole forward, of which "
        f"{format_bytes(count.output_bytes)} logits and loss)",
        "  Hooked outputs are not the tensors saved for backward: autograd keeps some inputs rather",
        "  than outputs, and functions that are not modules (attention, residual adds, norm upcasts,",
        "  the loss) save tensors no hook sees. The second figure is the tracked live memory at the",
        "  end of forward (loss from labels, as HF Trainer computes it), weights and inputs excluded.",
    ]


def _comparison(count: Any) -> list[str]:
    return [
        "",
        "Seed heuristic, " + count.heuristic_source,
        f"  A = {_number(round(count.heuristic_per_token))} per token for N = {count.num_parameters:,}; "
        f"A x P = {_per_token_bytes(count.heuristic_bytes_per_token)}/token at P = {count.activation_bytes} bytes",
        f"  hooked outputs / heuristic = {count.heuristic_ratio:.3f}; "
        f"kept alive after forward / heuristic = {count.saved_ratio:.3f}",
        "  The guide's A was measured as output bytes of a float32 model hooked on every module, nested",
        "  ones included, so A x P counts the element size twice. Read as elements, A / 4 = "
        f"{_number(round(count.heuristic_elements_per_token))} per token",
        f"  (counted here: {_number(count.elements_per_token)}, ratio {count.elements_per_token / count.heuristic_elements_per_token:.3f}).",
    ]


def _seed_lines(count: Any, seed: Any) -> list[str]:
    """Seed 002's own figure beside vramlens's: the comparison the guide makes, made visible."""
    if seed is None:
        return []
    return [
        "",
        "Seed 002's own count (its hook on every module, nested ones too; float32; eval; one token):",
        f"  {_number(seed.bytes_per_token)} per token - the guide's 'activations per token', which are bytes:",
        f"  {_number(seed.elements_per_token)} float32 elements over {seed.modules} modules",
        f"  vramlens, leaf modules only: {_number(count.elements_per_token)} elements/token "
        f"(guide / vramlens = {seed.elements_per_token / count.elements_per_token:.3f}:",
        "  the guide counts a layer's output again as its MLP's and as down_proj's)",
        f"  kept alive after a training forward: {_per_token_bytes(count.saved_bytes_per_token)}/token "
        f"at {count.precision}, the figure memory depends on",
    ]
