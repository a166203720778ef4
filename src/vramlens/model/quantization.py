"""Weight quantization declared by a checkpoint's ``quantization_config``.

Understood ``quant_method`` values and the keys read (as written by the
libraries that produce these checkpoints):

* ``gptq`` (AutoGPTQ / GPTQModel / optimum): ``bits`` (2, 3, 4, 8),
  ``group_size`` (-1 = per column), ``desc_act``, ``sym``.
* ``awq`` (AutoAWQ): ``bits`` or ``w_bit`` (4), ``group_size`` or
  ``q_group_size``, ``zero_point``, ``version``.
* ``bitsandbytes``: ``load_in_4bit`` / ``load_in_8bit`` (also ``_load_in_*``),
  ``bnb_4bit_quant_type`` (nf4, fp4), ``bnb_4bit_use_double_quant``,
  ``bnb_4bit_compute_dtype``, ``llm_int8_skip_modules``.
* ``fp8`` (DeepSeek-V3 style, also ``fbgemm_fp8``): ``fmt``,
  ``weight_block_size`` ([128, 128] = block-wise scales), ``activation_scheme``,
  ``modules_to_not_convert``.
* ``compressed-tensors`` (llm-compressor): the weight scheme of the first
  ``config_groups`` entry: ``num_bits``, ``type`` (int/float), ``strategy``,
  ``group_size``, ``block_structure``; ``ignore``.
* ``mxfp4`` (gpt-oss): 4-bit e2m1 with a shared exponent per 32 elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens.errors import ConfigError
from vramlens.model.quant_formats import QuantMethod, workload_quant

__all__ = ["QuantMethod", "QuantizationSpec", "parse_quantization_config"]


@dataclass(frozen=True, kw_only=True, slots=True)
class QuantizationSpec:
    """How the linear weights of a checkpoint are stored."""

    method: QuantMethod
    """Quantization family."""
    bits: int
    """Bits per weight element (4, 8, ...)."""
    weight_dtype: str
    """Element format of quantized weights (int4, nf4, fp4, int8, float8_e4m3fn, mxfp4)."""
    group_size: int | None = None
    """Input features per scale group (GPTQ/AWQ 128; -1 = one group per column); None if not grouped."""
    block_size: tuple[int, int] | None = None
    """FP8 block-scale tile, e.g. (128, 128); None for per-tensor/per-channel scales."""
    double_quant: bool = False
    """bitsandbytes nested quantization of the NF4 block scales."""
    act_order: bool = False
    """GPTQ ``desc_act`` (activation-order; g_idx used)."""
    zero_point: bool = True
    """Asymmetric quantization with stored zero points."""
    compute_dtype: str | None = None
    """Dtype the weights are dequantized to for matmuls (bnb 4-bit)."""
    skip_modules: tuple[str, ...] = ()
    """Module names kept unquantized (``modules_to_not_convert``, ``llm_int8_skip_modules``, ``ignore``)."""

    @property
    def workload_name(self) -> str:
        """The workload ``quant`` value of these weights when they are one of
        :data:`~vramlens.model.quant_formats.QUANT_FORMATS` (nf4, nf4-dq, gptq-int4, fp8, ...); else
        a name in the same style for a format only checkpoints have (fp4, gptq-int3, int4)."""
        known = workload_quant(self.method, self.bits, self.weight_dtype, double_quant=self.double_quant)
        if known is not None:
            return known.value
        if self.method is QuantMethod.BNB_4BIT:
            base = self.weight_dtype
            return f"{base}-dq" if self.double_quant and base == "nf4" else base
        if self.method is QuantMethod.BNB_8BIT:
            return "int8"
        if self.method in (QuantMethod.GPTQ, QuantMethod.AWQ):
            return f"{self.method.value}-int{self.bits}"
        if self.method is QuantMethod.COMPRESSED_TENSORS:
            return "fp8" if self.weight_dtype.startswith("float8") else f"int{self.bits}"
        return self.method.value


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def _int(cfg: dict[str, Any], where: str, *keys: str, default: int | None, allowed: tuple[int, ...] = ()) -> int | None:
    value = _get(cfg, *keys, default=default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{keys[0]}: expected an integer, got {value!r}")
    if allowed and value not in allowed:
        raise ConfigError(
            f"{where}.{keys[0]}: {value} is not supported; expected one of {', '.join(map(str, allowed))}"
        )
    return value


def _bool(cfg: dict[str, Any], where: str, *keys: str, default: bool) -> bool:
    value = _get(cfg, *keys, default=default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{keys[0]}: expected true or false, got {value!r}")
    return value


def _names(cfg: dict[str, Any], where: str, *keys: str) -> tuple[str, ...]:
    value = _get(cfg, *keys, default=[])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{keys[0]}: expected a list of module names, got {value!r}")
    return tuple(value)


def _gptq(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    bits = _int(cfg, where, "bits", default=4, allowed=(2, 3, 4, 8))
    assert bits is not None
    return QuantizationSpec(
        method=QuantMethod.GPTQ,
        bits=bits,
        weight_dtype=f"int{bits}",
        group_size=_int(cfg, where, "group_size", default=128),
        act_order=_bool(cfg, where, "desc_act", default=False),
        zero_point=not _bool(cfg, where, "sym", default=True),
        skip_modules=_names(cfg, where, "modules_to_not_convert"),
    )


def _awq(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    bits = _int(cfg, where, "bits", "w_bit", default=4, allowed=(4,))
    assert bits is not None
    return QuantizationSpec(
        method=QuantMethod.AWQ,
        bits=bits,
        weight_dtype="int4",
        group_size=_int(cfg, where, "group_size", "q_group_size", default=128),
        zero_point=_bool(cfg, where, "zero_point", default=True),
        skip_modules=_names(cfg, where, "modules_to_not_convert"),
    )


def _bitsandbytes(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    four = _bool(cfg, where, "load_in_4bit", "_load_in_4bit", default=False)
    eight = _bool(cfg, where, "load_in_8bit", "_load_in_8bit", default=False)
    skip = _names(cfg, where, "llm_int8_skip_modules")
    if four == eight:
        raise ConfigError(f"{where}: bitsandbytes needs exactly one of load_in_4bit / load_in_8bit set to true")
    if eight:
        return QuantizationSpec(method=QuantMethod.BNB_8BIT, bits=8, weight_dtype="int8", skip_modules=skip)
    kind = _get(cfg, "bnb_4bit_quant_type", default="fp4")
    if kind not in ("nf4", "fp4"):
        raise ConfigError(f"{where}.bnb_4bit_quant_type: expected 'nf4' or 'fp4', got {kind!r}")
    compute = _get(cfg, "bnb_4bit_compute_dtype", default=None)
    return QuantizationSpec(
        method=QuantMethod.BNB_4BIT,
        bits=4,
        weight_dtype=kind,
        group_size=64,
        double_quant=_bool(cfg, where, "bnb_4bit_use_double_quant", default=False),
        compute_dtype=str(compute).removeprefix("torch.") if compute is not None else None,
        skip_modules=skip,
    )


def _block(cfg: dict[str, Any], where: str, key: str) -> tuple[int, int] | None:
    value = cfg.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"{where}.{key}: expected two positive integers such as [128, 128], got {value!r}")
    return (value[0], value[1])


def _fp8(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    fmt = _get(cfg, "fmt", default="e4m3")
    if fmt not in ("e4m3", "e5m2"):
        raise ConfigError(f"{where}.fmt: expected 'e4m3' or 'e5m2', got {fmt!r}")
    return QuantizationSpec(
        method=QuantMethod.FP8,
        bits=8,
        weight_dtype="float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2",
        block_size=_block(cfg, where, "weight_block_size"),
        zero_point=False,
        skip_modules=_names(cfg, where, "modules_to_not_convert"),
    )


def _compressed_tensors(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    groups = cfg.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}.config_groups: expected a non-empty object of quantization schemes")
    scheme = next(iter(groups.values()))
    weights = scheme.get("weights") if isinstance(scheme, dict) else None
    if not isinstance(weights, dict):
        raise ConfigError(f"{where}.config_groups: the first scheme has no 'weights' object")
    bits = _int(weights, f"{where}.config_groups.weights", "num_bits", default=None, allowed=(4, 8))
    if bits is None:
        raise ConfigError(f"{where}.config_groups.weights.num_bits: missing; expected 4 or 8")
    kind = weights.get("type", "int")
    if kind not in ("int", "float"):
        raise ConfigError(f"{where}.config_groups.weights.type: expected 'int' or 'float', got {kind!r}")
    dtype = ("float8_e4m3fn" if bits == 8 else "fp4") if kind == "float" else f"int{bits}"
    return QuantizationSpec(
        method=QuantMethod.COMPRESSED_TENSORS,
        bits=bits,
        weight_dtype=dtype,
        group_size=_int(weights, f"{where}.config_groups.weights", "group_size", default=None),
        block_size=_block(weights, f"{where}.config_groups.weights", "block_structure"),
        zero_point=not bool(weights.get("symmetric", True)),
        skip_modules=_names(cfg, where, "ignore"),
    )


def _mxfp4(cfg: dict[str, Any], where: str) -> QuantizationSpec:
    return QuantizationSpec(
        method=QuantMethod.MXFP4,
        bits=4,
        weight_dtype="mxfp4",
        group_size=32,
        zero_point=False,
        skip_modules=_names(cfg, where, "modules_to_not_convert"),
    )


_PARSERS = {
    "gptq": _gptq,
    "awq": _awq,
    "bitsandbytes": _bitsandbytes,
    "fp8": _fp8,
    "fbgemm_fp8": _fp8,
    "compressed-tensors": _compressed_tensors,
    "mxfp4": _mxfp4,
}


def parse_quantization_config(value: Any, *, where: str = "quantization_config") -> QuantizationSpec:
    """Parse a ``quantization_config`` object into a :class:`QuantizationSpec`.

    Raises :class:`ConfigError` naming the key for unknown methods and bad values.
    """
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected an object, got {type(value).__name__}")
    method = value.get("quant_method")
    if method is None and ("load_in_4bit" in value or "load_in_8bit" in value):
        method = "bitsandbytes"
    parser = _PARSERS.get(method) if isinstance(method, str) else None
    if parser is None:
        raise ConfigError(f"{where}.quant_method: unsupported {method!r}; expected one of {', '.join(_PARSERS)}")
    return parser(value, where)
