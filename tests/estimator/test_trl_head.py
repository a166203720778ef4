"""TRL's fused LM head (loss chunked-logprob) in the estimator: what the profile picks, the
one-line refusals, and the tile's size against TRL's own constants when TRL is installed
(the tracked runs are in test_trainer_trl.py)."""

from __future__ import annotations

import pytest

from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.estimator.trl_head import TOKEN_TILE, VOCAB_TILE, FusedHead, fused_head_memory
from vramlens.model.resolve import model_from_config

_TINY = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 4096,
}  # fmt: skip


def _workload(**extra: object) -> dict[str, object]:
    return {"model": model_from_config(dict(_TINY)), "framework": "trl", "precision": "mixed-bf16",
            "batch": 4, "seq": 128, **extra}  # fmt: skip


def test_the_trl_profile_uses_the_fused_head() -> None:
    report = estimate(_workload())
    assert any("loss auto: chunked-logprob (trl default)" in note for note in report.assumptions)
    assert any("TRL fused LM head" in term.formula for term in report.terms)


def test_an_adapter_on_the_head_is_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"^lora.targets: TRL's fused LM head") as info:
        estimate(_workload(method="lora", lora={"rank": 8, "targets": ["q_proj", "lm_head"]}))
    assert "\n" not in str(info.value)


def test_the_tile_spans_32768_columns_whatever_the_vocabulary() -> None:
    """mm_buf is [min(N, 4096), chunk_size] (trl/kernels/chunked_logprob.py), not [N, V]."""
    small = FusedHead(positions=508, vocab=2000, hidden=256, compute_bytes=2, stream_bytes=2, weight_bytes=2,
                      head_trains=False)  # fmt: skip
    big = FusedHead(positions=65536, vocab=128256, hidden=4096, compute_bytes=2, stream_bytes=2, weight_bytes=2,
                    head_trains=False)  # fmt: skip
    assert small.tile == 508 * 32768 * 2
    assert big.tile == 4096 * 32768 * 2
    assert fused_head_memory(big).forward_end < big.positions * big.vocab * 2  # never the whole logits


def test_the_constants_are_trls() -> None:
    kernel = pytest.importorskip("trl.kernels.chunked_logprob")
    utils = pytest.importorskip("trl.trainer.utils")
    assert (TOKEN_TILE, VOCAB_TILE) == (kernel.TOKEN_CHUNK_SIZE, utils._CHUNKED_LOGPROB_CHUNK_SIZE)
