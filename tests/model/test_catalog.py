"""The bundled catalog: real configs, unique names, counts that agree with what publishers state."""

from __future__ import annotations

import re

import pytest

from vramlens.model.catalog import CatalogEntry, catalog_entries, find_entry

ENTRIES = catalog_entries()


def test_at_least_forty_checkpoints() -> None:
    assert len(ENTRIES) >= 40


def test_names_aliases_and_ids_are_unambiguous() -> None:
    owners: dict[str, str] = {}
    for entry in ENTRIES:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", entry.name), entry.name
        for key in {entry.name.lower(), entry.hf_id.lower(), *(a.lower() for a in entry.aliases)}:
            assert owners.setdefault(key, entry.name) == entry.name, f"{key} names {owners[key]} and {entry.name}"


def test_each_file_is_named_after_its_entry() -> None:
    """find_entry reads a catalog name from its own file: the file must be named after it."""
    from vramlens._files import package_data

    files = sorted(
        item.name for item in package_data("vramlens.model.catalog").iterdir() if item.name.endswith(".json")
    )
    assert files == sorted(f"{entry.name}.json" for entry in ENTRIES)


def test_a_catalog_name_is_found_without_reading_the_whole_catalog() -> None:
    from vramlens.model import catalog

    catalog._index.cache_clear()
    catalog.catalog_entries.cache_clear()
    try:
        assert find_entry(" Llama-3.1-8B ") is catalog._read_entry("llama-3.1-8b.json")
        assert catalog._index.cache_info().currsize == 0  # the other files were not read
        assert find_entry("meta-llama/Llama-3.1-8B") is find_entry("llama-3.1-8b")  # an HF id: the whole index
        assert find_entry("../catalog/llama-3.1-8b") is None
    finally:
        catalog._index.cache_clear()
        catalog.catalog_entries.cache_clear()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_has_sources_and_a_verbatim_looking_config(entry: CatalogEntry) -> None:
    assert entry.config_source and entry.published_parameters_source
    assert entry.config.get("model_type"), "a config.json always names its model_type"
    assert "architectures" in entry.config or entry.config["model_type"] in {"gpt2"}
    assert entry.published_parameters_basis in {"unique", "stored_tied_head_twice"}
    assert find_entry(entry.name) is entry and find_entry(entry.hf_id) is entry


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_computed_count_is_within_half_a_percent_of_the_published_count(entry: CatalogEntry) -> None:
    spec = entry.spec()
    computed = spec.num_parameters
    if entry.published_parameters_basis == "stored_tied_head_twice":
        assert spec.tie_word_embeddings
        computed += spec.vocab_size * spec.hidden_size
    published = entry.published_count
    assert abs(computed - published) <= 0.005 * published, (computed, entry.published_parameters)


def test_catalog_covers_the_families_people_ask_for() -> None:
    names = {e.name for e in ENTRIES}
    for required in ("llama-2-7b", "llama-3-8b", "llama-3.1-8b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.3-70b",
                     "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-0.5b", "qwen2.5-32b", "qwen3-0.6b",
                     "qwen3-32b", "qwen3-30b-a3b", "gemma-2-2b", "gemma-2-9b-it", "gemma-3-1b-it", "phi-3-mini", "phi-4",
                     "deepseek-v3", "gpt2", "olmo-2-1b", "olmo-2-7b-instruct"):  # fmt: skip
        assert required in names, required
    model_types = {e.spec().model_type for e in ENTRIES}
    assert {
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
        "phi", "phi3", "gpt2", "gpt_neox", "olmo2", "starcoder2", "deepseek_v3",
    } <= model_types  # fmt: skip
