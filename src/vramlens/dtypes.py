"""Data types: storage width of every element format vramlens meets, and the
side tensors (block scales, zero points) that quantized formats carry.

Widths are kept in **bits** (an ``int``) so that sub-byte formats stay exact:
int4/nf4/fp4 are 4 bits = 0.5 byte per element, never ``4 // 8 == 0``. Byte
counts for a tensor are produced by :func:`bytes_for`, which rounds the packed
size up to whole bytes once per tensor.

Quantized formats store more than their packed elements; each overhead has its
own function below (NF4 block absmax and double quantization, GPTQ/AWQ group
scales and zero points, FP8 block scales, LLM.int8 row scales, MXFP4 shared
exponents), so estimators can show them as a separate term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from vramlens.errors import InputError

__all__ = [
    "DTYPES",
    "DType",
    "bytes_for",
    "canonical_dtype",
    "dtype_bits",
    "element_size",
    "fp8_block_scale_bytes",
    "gptq_awq_overhead_bytes",
    "int8_rowwise_scale_bytes",
    "mxfp4_scale_bytes",
    "nf4_scale_bytes",
    "nf4_state_bytes",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class DType:
    """One element format.

    Attributes:
        name: canonical name (torch spelling where torch has the type).
        bits: storage bits per element (packed; 4 for int4/nf4/fp4).
        aliases: other spellings accepted on input (safetensors' "BF16",
            configs' "bfloat16", users' "bf16"), matched case-insensitively.
        floating: whether the format is floating point.
    """

    name: str
    bits: int
    aliases: tuple[str, ...] = ()
    floating: bool = True

    @property
    def bytes(self) -> float:
        """Bytes per element (0.5 for 4-bit formats)."""
        return self.bits / 8


#: Every known element format. Widths are from the formats' definitions:
#: IEEE 754 (float64/32/16), Google brain float (bfloat16), OCP FP8 spec
#: (float8_e4m3fn, float8_e5m2, float8_e8m0fnu), OCP MX spec v1.0 (mxfp4 elements
#: are 4-bit e2m1), QLoRA paper §3 (nf4: 4-bit NormalFloat), bitsandbytes (fp4).
#: Safetensors' dtype names ("F32", "BF16", "F8_E4M3", "I8", ...) are aliases.
DTYPES: Final[tuple[DType, ...]] = (
    DType(name="float64", bits=64, aliases=("fp64", "f64", "double", "F64")),
    DType(name="float32", bits=32, aliases=("fp32", "f32", "float", "F32")),
    DType(name="float16", bits=16, aliases=("fp16", "f16", "half", "F16")),
    DType(name="bfloat16", bits=16, aliases=("bf16", "BF16")),
    DType(name="float8_e4m3fn", bits=8, aliases=("fp8", "float8", "e4m3", "fp8_e4m3", "F8_E4M3", "float8_e4m3fnuz")),
    DType(name="float8_e5m2", bits=8, aliases=("e5m2", "fp8_e5m2", "F8_E5M2", "float8_e5m2fnuz")),
    DType(name="float8_e8m0fnu", bits=8, aliases=("e8m0", "F8_E8M0")),
    DType(name="int64", bits=64, aliases=("i64", "long", "I64"), floating=False),
    DType(name="uint64", bits=64, aliases=("u64", "U64"), floating=False),
    DType(name="int32", bits=32, aliases=("i32", "int", "I32"), floating=False),
    DType(name="uint32", bits=32, aliases=("u32", "U32"), floating=False),
    DType(name="int16", bits=16, aliases=("i16", "short", "I16"), floating=False),
    DType(name="uint16", bits=16, aliases=("u16", "U16"), floating=False),
    DType(name="int8", bits=8, aliases=("i8", "I8"), floating=False),
    DType(name="uint8", bits=8, aliases=("u8", "U8"), floating=False),
    DType(name="bool", bits=8, aliases=("BOOL",), floating=False),
    DType(name="int4", bits=4, aliases=("i4", "uint4", "u4"), floating=False),
    DType(name="nf4", bits=4),
    DType(name="fp4", bits=4, aliases=("float4", "e2m1", "F4", "float4_e2m1fn_x2")),
    DType(name="mxfp4", bits=4),
    DType(name="int3", bits=3, floating=False),
    DType(name="int2", bits=2, floating=False),
)

_BY_NAME: Final[dict[str, DType]] = {
    spelling.lower(): dtype for dtype in DTYPES for spelling in (dtype.name, *dtype.aliases)
}


def canonical_dtype(name: str, *, field: str = "dtype") -> DType:
    """Look up a dtype by any accepted spelling ("bf16", "BF16", "torch.bfloat16").

    Raises :class:`InputError` naming ``field`` and listing the accepted names.
    """
    if not isinstance(name, str):
        raise InputError(f"{field}: expected a dtype name, got {type(name).__name__}")
    key = name.strip().lower().removeprefix("torch.")
    dtype = _BY_NAME.get(key)
    if dtype is None:
        accepted = ", ".join(d.name for d in DTYPES)
        raise InputError(
            f"{field}: unknown dtype {name!r}; expected one of {accepted} (or aliases such as bf16, fp16, fp8)"
        )
    return dtype


def dtype_bits(name: str) -> int:
    """Storage bits per element of a dtype given by any accepted spelling."""
    return canonical_dtype(name).bits


def element_size(name: str) -> float:
    """Bytes per element (float: 0.5 for 4-bit formats)."""
    return canonical_dtype(name).bytes


def bytes_for(numel: int, dtype: str) -> int:
    """Bytes to store ``numel`` elements of ``dtype``, packed, rounded up to a whole byte.

    Only the elements: quantization side tensors are separate functions below.
    """
    if numel < 0:
        raise InputError(f"numel: must not be negative, got {numel}")
    return (numel * canonical_dtype(dtype).bits + 7) // 8


def nf4_scale_bytes(numel: int, *, block_size: int = 64, double_quant: bool = False, dq_block_size: int = 256) -> int:
    """Bytes of the block scales that bitsandbytes NF4/FP4 stores beside the 4-bit weights.

    Units: bytes. Assumptions: one absmax per ``block_size`` consecutive elements
    (bitsandbytes' default 64 for 4-bit). Without double quantization each absmax
    is fp32 (4 B): ``ceil(n/64) * 4`` = 0.5 bit per parameter. With double
    quantization the absmaxes are themselves quantized to 8 bits in blocks of
    ``dq_block_size`` (256) with one fp32 scale per block: ``ceil(n/64) * 1 +
    ceil(ceil(n/64)/256) * 4`` = 8/64 + 32/(64*256) = 0.127 bit per parameter.
    Per-tensor constants (the 16-entry NF4 code book, the nested quantizer's
    256-entry map and offset, ~1 KiB per tensor) are not included.
    Source: Dettmers et al., "QLoRA" (arXiv 2305.14314), §3 "Double Quantization".
    """
    blocks = math.ceil(numel / block_size)
    if not double_quant:
        return blocks * 4
    return blocks * 1 + math.ceil(blocks / dq_block_size) * 4


#: fp32 elements of the per-tensor constants of one bitsandbytes 4-bit ``QuantState`` on the
#: GPU: the NF4 code book every layer gets from ``get_4bit_type``, and with double quantization
#: the nested state's copy of the 256-entry dynamic map and the 0-dim absmax offset
#: (bitsandbytes 0.49 ``functional.quantize_4bit``; counted to the byte by vramlens.simulator.quant).
NF4_STATE_CONSTANTS = {"code": 16, "nested_code": 256, "offset": 1}


def nf4_state_bytes(*, double_quant: bool = False) -> int:
    """Bytes of the per-tensor constants of one NF4/FP4 weight (beside :func:`nf4_scale_bytes`):
    ``16 x 4 = 64`` B, or ``(16 + 256 + 1) x 4 = 1,092`` B with double quantization."""
    names = ("code", "nested_code", "offset") if double_quant else ("code",)
    return 4 * sum(NF4_STATE_CONSTANTS[name] for name in names)


def gptq_awq_overhead_bytes(
    out_features: int, in_features: int, *, bits: int, group_size: int, g_idx: bool = True
) -> int:
    """Bytes of the scales, zero points (and GPTQ's ``g_idx``) of one group-quantized linear weight.

    Units: bytes. Assumptions (AutoGPTQ/GPTQModel and AutoAWQ checkpoint layout):
    one fp16 scale and one ``bits``-bit zero point per (group of ``group_size``
    input features) x (output feature); zero points are packed into int32 words;
    GPTQ also stores ``g_idx``, one int32 per input feature (``g_idx=False`` for
    AWQ). ``group_size=-1`` means one group spanning all input features.
    Source: the ``scales``/``qzeros``/``g_idx`` tensors of GPTQ and AWQ
    checkpoints (e.g. TheBloke/*-GPTQ, *-AWQ): scales ``[in/g, out]`` fp16,
    qzeros ``[in/g, out*bits/32]`` int32, g_idx ``[in]`` int32.
    """
    groups = 1 if group_size == -1 else math.ceil(in_features / group_size)
    scales = groups * out_features * 2
    zeros = groups * math.ceil(out_features * bits / 32) * 4
    index = in_features * 4 if g_idx else 0
    return scales + zeros + index


def fp8_block_scale_bytes(out_features: int, in_features: int, *, block: tuple[int, int] | None = (128, 128)) -> int:
    """Bytes of the fp32 scales of one FP8 weight.

    Units: bytes. ``block=(128, 128)`` is DeepSeek-V3's block-wise scheme: one
    fp32 ``weight_scale_inv`` per 128x128 tile (``weight_block_size`` in its
    ``quantization_config``). ``block=None`` is per-tensor scaling (one fp32).
    Source: DeepSeek-V3 technical report (arXiv 2412.19437) §3.3.2 and its
    checkpoint's ``*.weight_scale_inv`` tensors.
    """
    if block is None:
        return 4
    rows, cols = block
    return math.ceil(out_features / rows) * math.ceil(in_features / cols) * 4


def int8_rowwise_scale_bytes(out_features: int) -> int:
    """Bytes of the per-row fp32 scales (``SCB``) of a bitsandbytes LLM.int8 weight.

    Units: bytes: one fp32 absmax per output row. Source: Dettmers et al.,
    "LLM.int8()" (arXiv 2208.07339) §3 (vector-wise quantization), and the
    ``weight.SCB`` tensor bitsandbytes saves beside each Int8 weight.
    """
    return out_features * 4


def mxfp4_scale_bytes(numel: int, *, block_size: int = 32) -> int:
    """Bytes of the shared E8M0 exponents of an MXFP4 tensor: one byte per 32 elements.

    Source: OCP Microscaling Formats (MX) specification v1.0, §5 (block size 32,
    8-bit E8M0 scale).
    """
    return math.ceil(numel / block_size)
