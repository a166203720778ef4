"""Terminal views of models: the catalog table and one model's description (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vramlens.model.catalog import CatalogEntry
from vramlens.model.generic.layout import GenericLayout
from vramlens.model.serialize import weight_bytes
from vramlens.model.spec import ModelSpec, PositionKind, QKNorm
from vramlens.report.terminal import terminal_console
from vramlens.units import format_bytes, format_count

__all__ = ["describe_model", "models_table", "print_model", "print_models_table"]

_BAR_WIDTH = 24


def _console() -> Console:
    """A console for stdout: the terminal's width on a terminal, 120 columns when piped."""
    return terminal_console()


def models_table(rows: Sequence[tuple[CatalogEntry, ModelSpec]]) -> Table:
    """One row per catalog entry: name, family, parameters, shape, context."""
    table = Table(box=box.SIMPLE_HEAD, title="Bundled models", title_justify="left")
    for header, justify in (
        ("name", "left"),
        ("family", "left"),
        ("params", "right"),
        ("active", "right"),
        ("layers", "right"),
        ("hidden", "right"),
        ("heads/kv", "right"),
        ("context", "right"),
        ("dtype", "left"),
    ):
        table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for entry, spec in rows:
        active = format_count(spec.active_parameters) if spec.is_moe else ""
        table.add_row(
            entry.name,
            entry.family,
            format_count(spec.num_parameters),
            active,
            str(spec.num_layers),
            str(spec.hidden_size),
            f"{spec.num_heads}/{spec.num_kv_heads}" if spec.attention is not None else "",
            f"{spec.max_position_embeddings:,}",
            spec.dtype,
        )
    return table


def _layers_text(spec: ModelSpec) -> str:
    sliding = [layer.window for layer in spec.layers if layer.window is not None]
    text = f"{spec.num_layers}"
    if sliding:
        windows = ", ".join(str(w) for w in sorted(set(sliding)))
        text += f" ({len(sliding)} sliding-window [{windows}], {spec.num_layers - len(sliding)} global)"
    chunked = [layer.chunk for layer in spec.layers if layer.chunk is not None]
    if chunked:
        chunks = ", ".join(str(c) for c in sorted(set(chunked)))
        text += f" ({len(chunked)} chunked-attention [{chunks}])"
    nope = sum(1 for layer in spec.layers if not layer.rope)
    if nope and spec.position.kind.value == "rope":
        text += f" ({nope} without rotary embeddings)"
    if spec.is_moe:
        dense = sum(1 for layer in spec.layers if layer.ffn.value == "dense")
        text += f"; {spec.num_moe_layers} MoE, {dense} dense"
    mixers = {layer.mixer.value for layer in spec.layers}
    if mixers != {"attention"}:
        counts = {kind: sum(1 for layer in spec.layers if layer.mixer.value == kind) for kind in sorted(mixers)}
        text += "; " + ", ".join(f"{count} {kind}" for kind, count in counts.items())
    return text


def _mixer_rows(spec: ModelSpec) -> list[tuple[str, str]]:
    """The Mamba and linear-attention mixers, when the model has them."""
    rows = []
    if spec.mamba is not None:
        m = spec.mamba
        heads = f", {m.num_heads} heads x {m.head_dim}, {m.n_groups} groups" if m.version.value == "mamba2" else ""
        rows.append(
            (
                "Mamba",
                f"{m.version.value}: inner {m.intermediate_size}, state {m.state_size}{heads}, conv {m.conv_kernel}",
            )
        )
    if spec.linear_attention is not None:
        g = spec.linear_attention
        rows.append(
            (
                "linear attention",
                f"gated DeltaNet: {g.num_key_heads} key heads x {g.key_head_dim}, "
                f"{g.num_value_heads} value heads x {g.value_head_dim}, conv {g.conv_kernel}",
            )
        )
    return rows


def _attention_text(spec: ModelSpec) -> str:
    attention = spec.attn
    if attention.mla is not None:
        mla = attention.mla
        return (
            f"MLA: {attention.num_heads} heads, kv_lora_rank {mla.kv_lora_rank}, q_lora_rank {mla.q_lora_rank}, "
            f"qk {mla.qk_nope_head_dim}+{mla.qk_rope_head_dim} (rope), v {mla.v_head_dim}"
        )
    text = f"{attention.kind}: {attention.num_heads} query heads, {attention.num_kv_heads} KV heads, head_dim {attention.head_dim}"
    if attention.qk_norm is not QKNorm.NONE:
        text += f", q/k norm {attention.qk_norm.value.replace('_', ' ')}"
    if attention.qkv_bias:
        text += ", qkv bias"
    return text


def _ffn_text(spec: ModelSpec) -> list[tuple[str, str]]:
    rows = []
    if spec.mlp is not None:
        bias = ", bias" if spec.mlp.bias else ""
        rows.append(
            ("MLP", f"{spec.mlp.kind.value} {spec.mlp.activation}, intermediate {spec.mlp.intermediate_size}{bias}")
        )
    if spec.moe is not None:
        moe = spec.moe
        shared = f", shared width {moe.shared_intermediate_size}" if moe.shared_intermediate_size else ""
        rows.append(
            (
                "MoE",
                f"{moe.num_experts} experts, top-{moe.experts_per_token}, expert width {moe.expert_intermediate_size}{shared}",
            )
        )
    return rows


def _position_text(spec: ModelSpec) -> str:
    position = spec.position
    text = position.kind.value
    if position.kind is PositionKind.ROPE:
        if position.rope_theta is not None:
            text += f" theta={position.rope_theta:g}"
        if position.rotary_fraction < 1.0:
            text += f", partial {position.rotary_fraction:g}"
        if position.rope_scaling:
            factor = f" x{position.rope_scaling_factor:g}" if position.rope_scaling_factor else ""
            text += f", {position.rope_scaling} scaling{factor}"
    return f"{text}; max positions {position.max_positions:,}"


def describe_model(spec: ModelSpec, entry: CatalogEntry | None = None) -> Table:
    """A two-column description of ``spec``."""
    table = Table(box=box.SIMPLE, show_header=False, title=spec.name, title_justify="left")
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value")
    published = f"   (published: {entry.published_parameters})" if entry else ""
    table.add_row("parameters", f"{format_count(spec.num_parameters)} = {spec.num_parameters:,}{published}")
    if spec.is_moe:
        table.add_row("active per token", f"{format_count(spec.active_parameters)} = {spec.active_parameters:,}")
    table.add_row("model type", f"{spec.model_type} ({spec.architecture or 'no architectures key'})")
    if spec.hf_id:
        table.add_row("hf id", spec.hf_id)
    table.add_row("layers", _layers_text(spec))
    table.add_row("hidden size", str(spec.hidden_size))
    if spec.generic is not None:
        _generic_rows(table, spec.generic)
    else:
        table.add_row("attention", _attention_text(spec))
        for name, text in _mixer_rows(spec) + _ffn_text(spec):
            table.add_row(name, text)
    head = "tied to the embedding" if spec.tie_word_embeddings else "separate LM head"
    table.add_row("vocabulary", f"{spec.vocab_size:,} ({head})")
    if spec.generic is None:
        table.add_row("positions", _position_text(spec))
        bias = " with bias" if spec.norm.bias else ""
        table.add_row("norms", f"{spec.norm.kind.value}{bias}, {spec.norms_per_layer} per layer")
    size = weight_bytes(spec)
    weights = f"; weights {format_bytes(size)}" if size is not None else ""
    if spec.vision is not None:
        v = spec.vision
        table.add_row(
            "vision",
            f"{v.kind} tower ({v.num_layers} layers, width {v.hidden_size}): {format_count(v.tower_parameters)}; "
            f"projector {format_count(v.projector_parameters)}",
        )
    table.add_row("dtype", f"{spec.dtype}{weights}")
    if spec.quantization is not None:
        q = spec.quantization
        group = f", group {q.group_size}" if q.group_size else ""
        table.add_row("quantization", f"{q.workload_name} ({q.method.value}, {q.bits}-bit {q.weight_dtype}{group})")
    if spec.checkpoint is not None:
        ckpt = spec.checkpoint
        dtypes = ", ".join(f"{d} {format_bytes(b)}" for d, b in ckpt.bytes_by_dtype.items())
        table.add_row(
            "checkpoint",
            f"{len(ckpt.files)} file(s), {ckpt.num_tensors} tensors, {ckpt.total_elements:,} elements, {format_bytes(ckpt.total_bytes)} ({dtypes})",
        )
    return table


def _generic_rows(table: Table, layout: GenericLayout) -> None:
    """What the generic reader found: the built class and each kind of layer."""
    table.add_row("described from", f"transformers' {layout.model_class} ({layout.auto_class}), on the meta device")
    counts = layout.kind_counts()
    for index, kind in enumerate(layout.kinds):
        table.add_row(
            f"layer kind {index + 1}",
            f"{counts.get(index, 0)} x {kind.name}: {format_count(kind.elements)} parameters, {len(kind.linears)} linears",
        )
    if layout.num_experts:
        table.add_row("experts", f"{layout.num_experts} routed, top-{layout.experts_per_token or '?'}")


def _bar(share: float) -> str:
    """A proportional bar; a sliver for shares too small for one full cell."""
    cells = round(share * _BAR_WIDTH)
    return "█" * cells if cells else "▏"


def breakdown_table(spec: ModelSpec) -> Table:
    """Parameters per component with their share and a bar."""
    table = Table(box=box.SIMPLE_HEAD, title="parameter breakdown", title_justify="left")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    breakdown = spec.parameter_breakdown.as_dict()
    total = breakdown.pop("total")
    breakdown.pop("persistent_buffers")
    for name, count in breakdown.items():
        if count == 0:
            continue
        share = count / total
        table.add_row(name.replace("_", " "), f"{count:,}", f"{share:6.1%}", _bar(share))
    table.add_row("total", f"{total:,}", "100.0%", "")
    return table


def print_models_table(rows: Sequence[tuple[CatalogEntry, ModelSpec]]) -> None:
    """Print the catalog table to stdout."""
    _console().print(models_table(rows))


def print_model(spec: ModelSpec, entry: CatalogEntry | None = None) -> None:
    """Print a model's description, its parameter breakdown and the parser's assumptions."""
    console = _console()
    console.print(describe_model(spec, entry))
    console.print(breakdown_table(spec))
    if spec.assumptions:
        console.print(Text("assumptions", style="bold"))
        for assumption in spec.assumptions:
            console.print(f"  - {assumption}", markup=False)
