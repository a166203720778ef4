""" "Did you mean" for an HF id that is not in the catalog: the same family and size first (it used to
suggest qwen2.5-72b-instruct for Qwen/Qwen2.5-7B-Instruct), then the family's nearest sizes."""

from __future__ import annotations

import pytest

from vramlens.errors import ModelNotFoundError
from vramlens.model.catalog import suggest_names
from vramlens.model.resolve import load_model


@pytest.mark.parametrize(
    ("reference", "first"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Qwen/Qwen2.5-72B", "qwen2.5-72b-instruct"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("google/gemma-2-9b", "gemma-2-9b-it"),
        ("Qwen/Qwen3-8B-Base", "qwen3-8b"),
        ("llama-3.1-9b", "llama-3.1-8b"),
    ],
)
def test_same_family_and_size_come_first(reference: str, first: str) -> None:
    assert suggest_names(reference)[0] == first


def test_the_family_s_other_sizes_follow_nearest_first() -> None:
    assert suggest_names("Qwen/Qwen2.5-7B-Instruct") == ["qwen2.5-7b", "qwen2.5-14b", "qwen2.5-3b"]


def test_the_error_message_suggests_them() -> None:
    with pytest.raises(ModelNotFoundError, match=r"Did you mean qwen2\.5-7b, qwen2\.5-14b, qwen2\.5-3b\?$"):
        load_model("Qwen/Qwen2.5-7B-Instruct")
