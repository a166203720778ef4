"""How quantized linear weights are stored: elements plus their scales, zeros and indices.

A :class:`WeightFormat` comes either from the workload's ``quant`` key (the
layout the quantizing library writes by default) or from a checkpoint's
``quantization_config`` (its own bits, group size, blocks and skipped modules).
Only the linear layers of the decoder are quantized: embeddings, the LM head,
norms, biases and MoE routers stay in the compute dtype, as GPTQ/AWQ
checkpoints, bitsandbytes (which keeps ``lm_head`` unconverted) and FP8
checkpoints do. The byte counts of the side tensors are the functions of
:mod:`vramlens.dtypes` (each cites its source).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vramlens.dtypes import (
    fp8_block_scale_bytes,
    gptq_awq_overhead_bytes,
    int8_rowwise_scale_bytes,
    mxfp4_scale_bytes,
    nf4_scale_bytes,
    nf4_state_bytes,
)
from vramlens.model.quant_formats import QUANT_FORMATS, Quant, QuantMethod, Scheme
from vramlens.model.quantization import QuantizationSpec

__all__ = ["Scheme", "WeightFormat", "format_for_checkpoint", "format_for_quant", "layer_index"]

#: GPTQ/AWQ group size when the workload names only the format (AutoGPTQ, AutoAWQ default).
DEFAULT_GROUP_SIZE = 128


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightFormat:
    """Storage of the quantized linear weights of one model."""

    name: str
    """The workload name of the format (nf4-dq, gptq-int4, fp8, ...)."""
    scheme: Scheme
    bits: int
    """Bits per element."""
    group_size: int = DEFAULT_GROUP_SIZE
    """Input features per scale group (grouped ints; -1 = one group per column)."""
    g_idx: bool = False
    """GPTQ's per-input-feature group index (int32), stored by GPTQ checkpoints."""
    double_quant: bool = False
    """bitsandbytes nested quantization of the 4-bit absmax."""
    block: tuple[int, int] | None = (128, 128)
    """FP8 scale tile; None for one per-tensor scale."""
    skip_modules: tuple[str, ...] = ()
    """Module names left in the compute dtype (``modules_to_not_convert``, ``ignore``)."""
    source: str = "workload"
    """``workload`` (the ``quant`` key) or ``checkpoint`` (its quantization_config)."""

    @property
    def skipped_layers(self) -> frozenset[int]:
        """Decoder layers named by a skip entry (their linears are counted one layer at a time)."""
        return frozenset(i for i in map(layer_index, self.skip_modules) if i is not None)

    def linear_bytes(self, out_features: int, in_features: int) -> float:
        """Bytes of one quantized ``out x in`` weight with its side tensors (no bias)."""
        n = out_features * in_features
        if self.scheme is Scheme.BNB_4BIT:
            return (
                n / 2
                + nf4_scale_bytes(n, double_quant=self.double_quant)
                + nf4_state_bytes(double_quant=self.double_quant)
            )
        if self.scheme is Scheme.BNB_INT8:
            return n + int8_rowwise_scale_bytes(out_features)
        if self.scheme is Scheme.GROUPED_INT:
            side = gptq_awq_overhead_bytes(
                out_features, in_features, bits=self.bits, group_size=self.group_size, g_idx=self.g_idx
            )
            return n * self.bits / 8 + side
        if self.scheme is Scheme.MXFP4:
            return n / 2 + mxfp4_scale_bytes(n)
        return n + fp8_block_scale_bytes(out_features, in_features, block=self.block)

    def quantizes(self, module: str, group: str, layer: int | None = None) -> bool:
        """Whether the linear ``module`` (of ``group`` attn_*/mlp_*/moe/mla_*) of decoder layer
        ``layer`` is stored quantized. A skip entry naming a layer (``model.layers.0.mlp.down_proj``)
        applies to that layer only, as transformers matches skips against full module names.
        MXFP4 stores only routed experts (transformers' ``replace_with_mxfp4_linear`` converts
        gpt-oss's expert modules and nothing else), whatever ``modules_to_not_convert`` says."""
        if self.scheme is Scheme.MXFP4 and group != "moe":
            return False
        for skipped in self.skip_modules:
            index = layer_index(skipped)
            if index is not None and index != layer:
                continue
            last = skipped.rsplit(".", 1)[-1]
            if last == module or (last in ("self_attn", "attn", "attention") and group.startswith(("attn", "mla"))):
                return False
            if last == "mlp" and group.startswith("mlp"):
                return False
        return True


def layer_index(name: str) -> int | None:
    """The decoder layer a module name points into (``model.layers.3.mlp`` -> 3), if any."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)(?:\.|$)")

#: The default storage of each workload ``quant`` value, from the vocabulary's one table.
_BY_QUANT = {
    quant: WeightFormat(
        name=quant.value, scheme=fmt.scheme, bits=fmt.bits, g_idx=fmt.g_idx, double_quant=fmt.double_quant
    )
    for quant, fmt in QUANT_FORMATS.items()
}


def format_for_quant(quant: Quant) -> WeightFormat | None:
    """The default storage of a workload ``quant`` value (None for ``none``)."""
    return _BY_QUANT.get(quant)


def format_for_checkpoint(spec: QuantizationSpec) -> WeightFormat:
    """The storage a checkpoint's ``quantization_config`` declares."""
    name = spec.workload_name
    skip = spec.skip_modules
    if spec.method is QuantMethod.BNB_4BIT:
        return WeightFormat(name=name, scheme=Scheme.BNB_4BIT, bits=4, double_quant=spec.double_quant, skip_modules=skip, source="checkpoint")  # fmt: skip
    if spec.method is QuantMethod.BNB_8BIT:
        return WeightFormat(name=name, scheme=Scheme.BNB_INT8, bits=8, skip_modules=skip, source="checkpoint")
    if spec.method is QuantMethod.MXFP4:
        return WeightFormat(name=name, scheme=Scheme.MXFP4, bits=4, skip_modules=skip, source="checkpoint")
    if spec.weight_dtype.startswith("float8") or spec.method is QuantMethod.FP8:
        return WeightFormat(name=name, scheme=Scheme.FP8, bits=8, block=spec.block_size, skip_modules=skip, source="checkpoint")  # fmt: skip
    group = spec.group_size if spec.group_size is not None else -1
    return WeightFormat(
        name=name,
        scheme=Scheme.GROUPED_INT,
        bits=spec.bits,
        group_size=group,
        g_idx=spec.method is QuantMethod.GPTQ,
        skip_modules=skip,
        source="checkpoint",
    )
