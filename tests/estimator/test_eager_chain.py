"""Eager attention's score chain (``estimator/eager_attention.py: eager_score_chain``) against the
installed transformers.

transformers' own ``eager_attention_forward`` (Llama's; Gemma 2's, which soft-caps the scores) runs
on CPU under ``vramlens.track``, without grad and with it; the score-sized tensors it makes and
frees, in order, are the chain's steps (the returned probabilities stay alive, as the decoder layer
holds them; with grad autograd also keeps the tanh's and the softmax's outputs). The whole-step
allocator replay writes the chain without grad for a recomputed layer's first forward
(``tests/simulator/test_agreement.py``: Gemma 2 with LoRA and full recompute at 8192 tokens) and with
grad in a LoRA layer's forward (``estimator/layer_script.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from conftest import requires_hf
from vramlens.estimator.eager_attention import eager_score_chain
from vramlens.model import load_model
from vramlens.resolve.styles import hf_style

pytestmark = [requires_hf, pytest.mark.hf]

_B, _HEADS, _KV, _SEQ, _DIM = 1, 4, 2, 64, 16


def _tracked(family: str, dtype_name: str, *, grad: bool) -> list[tuple[str, int]]:
    """(sign, bytes) of every score-sized event of one eager attention call."""
    import torch

    import vramlens

    if family == "gemma2":
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

        extra: dict[str, Any] = {"softcap": 50.0}
    else:
        from transformers.models.llama.modeling_llama import eager_attention_forward

        extra = {}

    class Module:
        num_key_value_groups = _HEADS // _KV
        head_dim = _DIM
        training = False

    dtype = getattr(torch, dtype_name)
    q = torch.randn(_B, _HEADS, _SEQ, _DIM, dtype=dtype, requires_grad=grad)
    k, v = (torch.randn(_B, _KV, _SEQ, _DIM, dtype=dtype, requires_grad=grad) for _ in range(2))
    mask = torch.zeros(_B, 1, _SEQ, _SEQ, dtype=dtype)
    with torch.set_grad_enabled(grad), vramlens.track(inputs=[q, k, v, mask]) as tracker:
        kept = eager_attention_forward(Module(), q, k, v, mask, scaling=0.25, dropout=0.0, **extra)
    del kept
    scores = _B * _HEADS * _SEQ * _SEQ
    events = tracker.timeline().nbytes.tolist()
    return [("+" if n > 0 else "-", abs(n)) for n in events if abs(n) in (2 * scores, 4 * scores)]


def _chain(model: str, compute_bytes: int, *, grad: bool) -> list[tuple[str, int]]:
    spec = load_model(model)
    steps = eager_score_chain(
        spec,
        hf_style(spec.model_type),
        compute_bytes=compute_bytes,
        autocast=False,
        seq=_SEQ,
        tokens=_B * _SEQ,
        grad=grad,
    )
    scale = _HEADS / spec.num_heads  # the tracked call runs _HEADS heads
    made: dict[str, int] = {}
    found = []
    for op, name, nbytes in steps:
        if op == "+":
            made[name] = int(nbytes * scale)
        found.append((op, made[name]))
    return found


@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
@pytest.mark.parametrize(("family", "model"), [("gemma2", "gemma-2-2b"), ("llama", "llama-3.2-1b")])
@pytest.mark.parametrize(("dtype", "compute_bytes"), [("bfloat16", 2), ("float32", 4)])
def test_score_chain_is_transformers_eager_attention(
    family: str, model: str, dtype: str, compute_bytes: int, grad: bool
) -> None:
    chain = _chain(model, compute_bytes, grad=grad)
    assert chain == _tracked(family, dtype, grad=grad)
    assert chain.count(("+", compute_bytes * _B * _HEADS * _SEQ * _SEQ)) >= 3  # the chain is written out


def test_sinks_have_no_chain_written() -> None:
    """gpt-oss's sink column changes the chain (``eager_transients``' sinks branch); none is written."""
    spec = load_model("llama-3.2-1b")
    sinks = replace(spec, attention=replace(spec.attn, sinks=True))
    assert eager_score_chain(sinks, hf_style("llama"), compute_bytes=2, autocast=False, seq=64, tokens=64) == ()
