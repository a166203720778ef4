"""The quantization vocabulary: every named weight format, declared once.

Three questions are asked of a quantized weight, and each has one enum here:

* :class:`QuantMethod`: which library family wrote it (a checkpoint's ``quant_method``);
* :class:`Scheme`: how it is stored (the side tensors beside the elements);
* :class:`Quant`: the name a workload gives it (the ``quant`` key of WORKLOAD.md).

:data:`QUANT_FORMATS` is the one table joining them: for each workload name, the library family,
the storage scheme, bits, element format and defaults the quantizing library writes. Everything
else is derived from it: the estimator's default storage of a ``quant`` value
(:func:`vramlens.estimator.weight_format.format_for_quant`), the bytes a decode step reads per
weight element, which formats are bitsandbytes 4-bit bases (k-bit preparation, the simulator's
NF4 linears), which are accepted as a QLoRA base, and the workload name a checkpoint's
``quantization_config`` maps to (:attr:`vramlens.model.quantization.QuantizationSpec.workload_name`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens._compat import StrEnum

__all__ = [
    "QUANT_FORMATS",
    "Quant",
    "QuantFormat",
    "QuantMethod",
    "Scheme",
    "bnb_4bit_quants",
    "qlora_bases",
    "workload_quant",
]


class QuantMethod(StrEnum):
    """Weight quantization families (a checkpoint's ``quant_method``)."""

    GPTQ = "gptq"
    AWQ = "awq"
    BNB_4BIT = "bnb-4bit"
    BNB_8BIT = "bnb-8bit"
    FP8 = "fp8"
    COMPRESSED_TENSORS = "compressed-tensors"
    MXFP4 = "mxfp4"


class Scheme(StrEnum):
    """Storage schemes with distinct side tensors."""

    BNB_4BIT = "bnb-4bit"
    """bitsandbytes NF4/FP4: packed 4-bit pairs plus one absmax per 64 elements."""
    BNB_INT8 = "bnb-int8"
    """bitsandbytes LLM.int8: int8 elements plus one fp32 scale per output row."""
    GROUPED_INT = "grouped-int"
    """GPTQ/AWQ/compressed-tensors integers: fp16 scales and packed zeros per group."""
    FP8 = "fp8"
    """float8 elements with per-tensor or block scales."""
    MXFP4 = "mxfp4"
    """OCP MXFP4: 4-bit elements with one E8M0 exponent per 32."""


class Quant(StrEnum):
    """A workload's ``quant`` value: ``none`` or a key of :data:`QUANT_FORMATS`."""

    NONE = "none"
    INT8 = "int8"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    GPTQ_INT4 = "gptq-int4"
    GPTQ_INT8 = "gptq-int8"
    AWQ_INT4 = "awq-int4"
    FP8 = "fp8"


@dataclass(frozen=True, kw_only=True, slots=True)
class QuantFormat:
    """One named weight format, as its quantizing library writes it by default."""

    method: QuantMethod
    """The library family that writes it."""
    scheme: Scheme
    """How the elements and their side tensors are stored."""
    bits: int
    """Bits per weight element."""
    weight_dtype: str
    """Element format (the ``weight_dtype`` a checkpoint's config parses to)."""
    double_quant: bool = False
    """bitsandbytes nested quantization of the 4-bit absmax (``bnb_4bit_use_double_quant``)."""
    g_idx: bool = False
    """GPTQ's per-input-feature group index (int32): AutoGPTQ/GPTQModel write it."""
    qlora_base: bool = False
    """``method: qlora`` accepts it as the frozen 4-bit base (PEFT LoRA over bitsandbytes 4-bit,
    GPTQ or AWQ linears); the 8-bit formats are not 4-bit bases."""
    source: str

    def __post_init__(self) -> None:
        if self.bits not in (2, 3, 4, 8):
            raise ValueError(f"QuantFormat.bits: {self.bits} is not one of 2, 3, 4, 8")


#: Every workload ``quant`` value but ``none`` (the keys are exactly the other :class:`Quant`
#: members: tests/model/test_quant_formats.py).
QUANT_FORMATS: dict[Quant, QuantFormat] = {
    Quant.NF4: QuantFormat(
        method=QuantMethod.BNB_4BIT,
        scheme=Scheme.BNB_4BIT,
        bits=4,
        weight_dtype="nf4",
        qlora_base=True,
        source="bitsandbytes Linear4bit, BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')",
    ),
    Quant.NF4_DQ: QuantFormat(
        method=QuantMethod.BNB_4BIT,
        scheme=Scheme.BNB_4BIT,
        bits=4,
        weight_dtype="nf4",
        double_quant=True,
        qlora_base=True,
        source="the QLoRA paper's setting: nf4 with bnb_4bit_use_double_quant=True",
    ),
    Quant.INT8: QuantFormat(
        method=QuantMethod.BNB_8BIT,
        scheme=Scheme.BNB_INT8,
        bits=8,
        weight_dtype="int8",
        source="bitsandbytes Linear8bitLt (LLM.int8), BitsAndBytesConfig(load_in_8bit=True)",
    ),
    Quant.GPTQ_INT4: QuantFormat(
        method=QuantMethod.GPTQ,
        scheme=Scheme.GROUPED_INT,
        bits=4,
        weight_dtype="int4",
        g_idx=True,
        qlora_base=True,
        source="AutoGPTQ/GPTQModel QuantLinear: bits 4, group_size 128, g_idx stored",
    ),
    Quant.GPTQ_INT8: QuantFormat(
        method=QuantMethod.GPTQ,
        scheme=Scheme.GROUPED_INT,
        bits=8,
        weight_dtype="int8",
        g_idx=True,
        source="AutoGPTQ/GPTQModel QuantLinear: bits 8, group_size 128, g_idx stored",
    ),
    Quant.AWQ_INT4: QuantFormat(
        method=QuantMethod.AWQ,
        scheme=Scheme.GROUPED_INT,
        bits=4,
        weight_dtype="int4",
        qlora_base=True,
        source="AutoAWQ WQLinear_GEMM: w_bit 4, q_group_size 128, zero points, no g_idx",
    ),
    Quant.FP8: QuantFormat(
        method=QuantMethod.FP8,
        scheme=Scheme.FP8,
        bits=8,
        weight_dtype="float8_e4m3fn",
        source="transformers FineGrainedFP8 (DeepSeek-V3 style): e4m3 elements, 128x128 block scales",
    ),
}


def bnb_4bit_quants() -> frozenset[Quant]:
    """The ``quant`` values stored by bitsandbytes' 4-bit linears."""
    return frozenset(quant for quant, fmt in QUANT_FORMATS.items() if fmt.scheme is Scheme.BNB_4BIT)


def qlora_bases() -> tuple[Quant, ...]:
    """The ``quant`` values ``method: qlora`` accepts as its base, in table order."""
    return tuple(quant for quant, fmt in QUANT_FORMATS.items() if fmt.qlora_base)


def workload_quant(method: QuantMethod, bits: int, weight_dtype: str, *, double_quant: bool) -> Quant | None:
    """The workload name of a checkpoint's weights, when they are one of :data:`QUANT_FORMATS`."""
    for quant, fmt in QUANT_FORMATS.items():
        same = (fmt.method, fmt.bits, fmt.weight_dtype, fmt.double_quant) == (method, bits, weight_dtype, double_quant)
        if same:
            return quant
    return None
