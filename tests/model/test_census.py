"""Census: every model_type the installed transformers maps to a causal LM or an
image-text-to-text model, built from its default config (issue 19).

For each type, transformers builds the model on the meta device and counts
``model.parameters()``; vramlens must give the same count to the parameter, or refuse the
config with a one-line error. Types that transformers itself cannot build from their
defaults are listed and skipped. Zero silent mismatches; the tally is printed.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.errors import VramlensError
from vramlens.model.families import parse_config

pytestmark = [requires_hf, pytest.mark.hf, pytest.mark.slow]


def _types() -> list[str]:
    from transformers.models.auto import modeling_auto

    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    multimodal = modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    return sorted(set(causal) | set(multimodal))


def _transformers_count(model_type: str, data: dict[str, Any]) -> int:
    """transformers' own count: the multimodal class for a config with a vision part, else the causal LM."""
    import torch
    import transformers
    from transformers.models.auto import modeling_auto

    multimodal = model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and (
        "vision_config" in data or model_type not in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    auto = transformers.AutoModelForImageTextToText if multimodal else transformers.AutoModelForCausalLM
    config = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _census_row(model_type: str) -> tuple[str, str]:
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            data = transformers.AutoConfig.for_model(model_type).to_dict()
            data["model_type"] = model_type
            data = json.loads(json.dumps(data, default=str))  # what a config.json holds
            expected = _transformers_count(model_type, data)
        except Exception as error:  # transformers' own failure on its defaults: listed, skipped
            return "skipped", f"transformers cannot build its default config ({type(error).__name__})"
        try:
            spec = parse_config(data, source=f"default {model_type}")
        except VramlensError as error:
            message = str(error)
            assert "\n" not in message and message, model_type
            return "refused", message
    if spec.num_parameters != expected:
        return "MISMATCH", f"vramlens {spec.num_parameters:,} != transformers {expected:,}"
    return "exact", "native" if spec.generic is None else "generic"


def test_every_causal_and_image_text_type_is_exact_or_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {model_type: _census_row(model_type) for model_type in _types()}
    tally = Counter(status for status, _ in rows.values())
    how = Counter(detail for status, detail in rows.values() if status == "exact")
    with capsys.disabled():
        print(f"\ncensus of {len(rows)} model types: {dict(tally)} (exact: {dict(how)})")
        for model_type, (status, detail) in sorted(rows.items()):
            if status != "exact":
                print(f"  {status:8} {model_type}: {detail}")
    mismatches = {t: d for t, (s, d) in rows.items() if s == "MISMATCH"}
    assert not mismatches, mismatches
    assert tally["exact"] >= 0.8 * len(rows), dict(tally)
