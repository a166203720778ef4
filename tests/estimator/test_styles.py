"""Every native family has its saved-tensor style; nothing falls back to another family's."""

from __future__ import annotations

import pytest

from vramlens.model import supported_model_types
from vramlens.resolve.styles import HF_STYLES, hf_style


def test_every_native_family_has_a_style() -> None:
    missing = set(supported_model_types()) - set(HF_STYLES)
    assert not missing, f"native families without a saved-tensor style: {sorted(missing)}"


def test_an_unknown_type_has_no_style_to_borrow() -> None:
    with pytest.raises(KeyError):
        hf_style("my_custom_llama")
