"""The activation-function table (``estimate/act_fns.py``) against the installed transformers.

For every row, the function from ``transformers.activations.ACT2FN`` runs on CPU: the storages
autograd saves (``saved_tensors_hooks``) give ``saved_inner`` and ``saves_output``, a tracked
no-grad forward gives ``forward_peak``. Autograd's saved tensors and the outputs of these
elementwise ops are the same on CUDA.
"""

from __future__ import annotations

import pytest

from conftest import requires_hf
from vramlens.estimator.act_fns import ACTIVATION_FNS, ActivationFn, activation_fn

pytestmark = [requires_hf, pytest.mark.hf]

_N = 1 << 14


def _measure(name: str, dtype: str) -> ActivationFn:
    import torch
    from transformers.activations import ACT2FN

    import vramlens

    act = ACT2FN[name]
    size = torch.finfo(getattr(torch, dtype)).bits // 8 * _N
    leaf = torch.randn(_N, dtype=getattr(torch, dtype), requires_grad=True)
    x = leaf * 1  # a non-leaf input, like a linear layer's output
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = act(x)
    out_ptr = out.untyped_storage().data_ptr()
    inner = sum(nbytes for ptr, nbytes in saved.items() if ptr != out_ptr)
    plain = torch.randn(_N, dtype=getattr(torch, dtype))
    with torch.no_grad(), vramlens.track(inputs=plain) as tracker:
        del_me = act(plain)
        del del_me
    peak = tracker.timeline().peak_bytes
    return ActivationFn(
        saved_inner=inner // size, saves_output=out_ptr in saved, forward_peak=peak // size, source="measured"
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", sorted(ACTIVATION_FNS))
def test_activation_row_matches_transformers(name: str, dtype: str) -> None:
    got = _measure(name, dtype)
    row = ACTIVATION_FNS[name]
    assert (got.saved_inner, got.saves_output, got.forward_peak) == (
        row.saved_inner,
        row.saves_output,
        row.forward_peak,
    )


def test_unknown_activation_is_modelled_as_one_kernel() -> None:
    assert activation_fn("no-such-activation") == ACTIVATION_FNS["silu"]
