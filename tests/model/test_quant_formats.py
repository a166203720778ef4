"""The quantization vocabulary (issue 23 item 2): one table of named weight formats, and every
consumer derived from it."""

from __future__ import annotations

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.weight_format import format_for_quant
from vramlens.model.quant_formats import QUANT_FORMATS, Quant, Scheme, bnb_4bit_quants, qlora_bases
from vramlens.model.quantization import QuantizationSpec, parse_quantization_config
from vramlens.resolve.kbit import BNB_4BIT_QUANTS
from vramlens.workload import options


def test_the_workload_quant_values_are_none_and_the_tables_keys() -> None:
    assert options.Quant is Quant
    assert {quant.value for quant in Quant} == {"none", *(quant.value for quant in QUANT_FORMATS)}


@pytest.mark.parametrize("quant", list(QUANT_FORMATS))
def test_the_estimators_default_storage_is_the_tables(quant: Quant) -> None:
    declared, stored = QUANT_FORMATS[quant], format_for_quant(quant)
    assert stored is not None
    assert (stored.name, stored.scheme, stored.bits, stored.g_idx, stored.double_quant) == (
        quant.value,
        declared.scheme,
        declared.bits,
        declared.g_idx,
        declared.double_quant,
    )


@pytest.mark.parametrize("quant", list(QUANT_FORMATS))
def test_a_checkpoint_in_a_declared_format_maps_back_to_its_workload_name(quant: Quant) -> None:
    fmt = QUANT_FORMATS[quant]
    spec = QuantizationSpec(
        method=fmt.method, bits=fmt.bits, weight_dtype=fmt.weight_dtype, double_quant=fmt.double_quant
    )
    assert spec.workload_name == quant.value


def test_checkpoint_configs_map_to_workload_names_or_a_name_of_their_own() -> None:
    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    assert parse_quantization_config({**bnb, "bnb_4bit_use_double_quant": True}).workload_name == "nf4-dq"
    assert (
        parse_quantization_config({"quant_method": "gptq", "bits": 4, "group_size": 128}).workload_name == "gptq-int4"
    )
    assert (
        parse_quantization_config({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}).workload_name
        == "fp8"
    )
    # Formats only checkpoints have keep a name in the same style, which no workload accepts.
    assert parse_quantization_config({**bnb, "bnb_4bit_quant_type": "fp4"}).workload_name == "fp4"
    assert (
        parse_quantization_config({"quant_method": "gptq", "bits": 3, "group_size": 128}).workload_name == "gptq-int3"
    )


def test_bnb_4bit_bases_and_qlora_bases_come_from_the_table() -> None:
    assert BNB_4BIT_QUANTS == bnb_4bit_quants() == {Quant.NF4, Quant.NF4_DQ}
    assert all(QUANT_FORMATS[quant].scheme is Scheme.BNB_4BIT for quant in BNB_4BIT_QUANTS)
    assert qlora_bases() == (Quant.NF4, Quant.NF4_DQ, Quant.GPTQ_INT4, Quant.AWQ_INT4)


@pytest.mark.parametrize("quant", [quant for quant in QUANT_FORMATS if not QUANT_FORMATS[quant].qlora_base])
def test_qlora_refuses_an_8_bit_base_naming_the_accepted_ones(quant: Quant) -> None:
    with pytest.raises(InputError, match=r"^quant: qlora .*\(use nf4, nf4-dq, gptq-int4, awq-int4\)$"):
        estimate({"model": "llama-3.2-1b", "method": "qlora", "quant": quant.value, "seq": 512})
