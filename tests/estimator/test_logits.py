"""Logits and loss memory (``vramlens.estimator.logits``) against hand calculations.

Every expected number is written out below from the module docstring's description of
what each loss implementation allocates, per token, with ``V`` the vocabulary on this
rank and ``a`` the logits dtype bytes:

* full (transformers ``ForCausalLMLoss``): head output ``a*V``, ``logits.float()`` copy
  ``4V`` (none when the logits are already fp32), ``log_softmax`` output ``4V`` kept for
  backward; backward starts with the ``4V`` gradient of the log-probabilities and the
  ``4V`` gradient of the logits beside the kept ``4V``;
* compiled (Inductor): ``a*V`` logits plus one fp32 log-sum-exp (4 B) per token; backward
  starts with the logits and their gradient in the logits dtype (``2a*V``);
* chunked (torchtune ``CEWithChunkedOutputLoss``): ``a*V`` logits, ``4V`` kept
  log-probabilities, the fp32 up-cast and its gradient one chunk at a time (``8V/c``);
* vocabulary-parallel (torch ``loss_parallel``): ``(a+12)V`` forward, ``16V`` backward;
* fused linear (Liger): ``8h`` of fp32 logits+gradient per token plus the ``a*h`` input gradient.

The workload is 1000 tokens, a 32000-word vocabulary and hidden size 4096 throughout.
"""

from __future__ import annotations

import pytest

from vramlens.estimator.logits import LogitsMemory, logits_memory
from vramlens.workload.options import LossImpl

T, V, H = 1000, 32_000, 4096


def _memory(
    loss: LossImpl = LossImpl.FULL,
    *,
    a: int = 2,
    keeps: bool = False,
    chunks: int = 8,
    kept_bytes: int | None = None,
    loss_parallel: bool = False,
    compiled: bool = False,
) -> LogitsMemory:
    return logits_memory(
        loss,
        tokens=T,
        vocab=V,
        hidden=H,
        logits_bytes=a,
        keeps_logits=keeps,
        chunks=chunks,
        kept_bytes=kept_bytes,
        loss_parallel=loss_parallel,
        compiled=compiled,
    )


def _fields(memory: LogitsMemory) -> tuple[int, int, int, int]:
    return memory.forward_end, memory.kept, memory.backward_start, memory.outputs


# ---- full logits (eager cross-entropy) ------------------------------------------------------


def test_full_bf16_logits_without_kept_outputs() -> None:
    # Forward at the loss: bf16 head output 2V + fp32 copy 4V + log_softmax output 4V = 10V per token.
    forward = 1000 * (2 + 4 + 4) * 32_000  # 320,000,000 B
    # Between passes only log_softmax's 4V output is kept (the .float() backward needs no input).
    kept = 1000 * 4 * 32_000  # 128,000,000 B
    # Backward start: grad of log-probs 4V + grad of the fp32 logits 4V + the kept 4V = 12V.
    backward = 1000 * 12 * 32_000  # 384,000,000 B
    assert _fields(_memory()) == (forward, kept, backward, 0)
    assert forward == 320_000_000 and backward == 384_000_000


def test_soft_capped_logits_keep_the_tanh_output() -> None:
    # Gemma 2: logits = tanh(logits / cap) * cap. The division's input and output are freed in turn;
    # tanh keeps its bf16 output (2V) for backward beside the capped logits, from the loss to the
    # start of backward.
    plain = _memory()
    capped = logits_memory(
        LossImpl.FULL, tokens=T, vocab=V, hidden=H, logits_bytes=2, keeps_logits=False, chunks=8, softcap=True
    )
    tanh = 1000 * 2 * 32_000  # 64,000,000 B
    assert capped.forward_end == plain.forward_end + tanh
    assert capped.kept == plain.kept + tanh
    assert capped.backward_start == plain.backward_start + tanh
    assert capped.outputs == plain.outputs


def test_full_bf16_logits_kept_in_the_model_output() -> None:
    # transformers returns outputs.logits (bf16, 2V per token), alive through the whole backward.
    kept_output = 2 * 32_000
    memory = _memory(keeps=True)
    assert memory.forward_end == 1000 * 10 * 32_000  # the kept logits are the head output itself
    assert memory.kept == 1000 * (4 * 32_000 + kept_output)  # 192,000,000 B
    assert memory.backward_start == 1000 * (12 * 32_000 + kept_output)  # 14V = 448,000,000 B
    assert memory.outputs == 1000 * kept_output  # 64,000,000 B


def test_full_bf16_logits_with_accelerate_fp32_outputs() -> None:
    # accelerate's convert_outputs_to_fp32 keeps a 4V fp32 copy in outputs.logits (kept_bytes=4).
    memory = _memory(keeps=True, kept_bytes=4)
    assert memory.kept == 1000 * (4 + 4) * 32_000  # log-probs 4V + fp32 output 4V = 256,000,000 B
    assert memory.backward_start == 1000 * (12 + 4) * 32_000  # 512,000,000 B
    assert memory.outputs == 1000 * 4 * 32_000  # 128,000,000 B
    assert "(12+4)V" in memory.formula


def test_full_fp32_logits_have_no_upcast_copy() -> None:
    # fp32 logits: logits.float() returns the same tensor, so 4V + 0 + 4V = 8V at the loss.
    memory = _memory(a=4)
    assert memory.forward_end == 1000 * (4 + 0 + 4) * 32_000  # 256,000,000 B
    # Backward still forms two 4V gradients beside the kept 4V log-probabilities.
    assert memory.backward_start == 1000 * 12 * 32_000
    assert memory.kept == 1000 * 4 * 32_000


# ---- compiled cross-entropy -------------------------------------------------------------------


def test_compiled_loss_keeps_the_logits_and_one_lse_per_token() -> None:
    # Forward: bf16 logits 2V plus one fp32 log-sum-exp (4 B) per token.
    forward = 1000 * (2 * 32_000 + 4)  # 64,004,000 B
    # Kept: the logits (the fused backward recomputes the softmax from them).
    kept = 1000 * 2 * 32_000  # 64,000,000 B
    # Backward start: logits 2V + their gradient 2V written in the logits dtype.
    backward = 1000 * 2 * 2 * 32_000  # 128,000,000 B
    assert _fields(_memory(compiled=True)) == (forward, kept, backward, 0)


def test_compiled_loss_with_the_same_logits_kept_in_the_output() -> None:
    # outputs.logits in the logits dtype is the very tensor the loss keeps: nothing is added.
    memory = _memory(keeps=True, compiled=True)
    assert (memory.kept, memory.backward_start, memory.outputs) == (
        1000 * 2 * 32_000,
        1000 * 4 * 32_000,
        1000 * 2 * 32_000,
    )


# ---- chunked, vocabulary-parallel, fused linear ---------------------------------------------


def test_chunked_loss_with_eight_chunks() -> None:
    # At the last chunk: bf16 logits 2V + kept log-probs 4V + that chunk's fp32 up-cast 4V/8 = 6.5V.
    forward = 1000 * (2 * 32_000 + 4 * 32_000 + 4 * 32_000 // 8)  # 208,000,000 B
    kept = 1000 * 4 * 32_000  # 128,000,000 B
    # Backward start: the kept 4V plus one chunk's two fp32 gradients 8V/8.
    backward = 1000 * (4 * 32_000 + 8 * 32_000 // 8)  # 160,000,000 B
    assert _fields(_memory(LossImpl.CHUNKED)) == (forward, kept, backward, 0)


def test_chunked_loss_counts_kept_fp32_outputs() -> None:
    memory = _memory(LossImpl.CHUNKED, keeps=True, kept_bytes=4)
    assert memory.kept == 1000 * (4 + 4) * 32_000
    assert memory.backward_start == 1000 * (4 * 32_000 + 32_000 + 4 * 32_000)
    assert memory.outputs == 1000 * 4 * 32_000


@pytest.mark.parametrize(("chunks", "per_token"), [(1, 10 * 32_000), (8, 2 * 32_000 + 4 * 32_000 + 4 * 32_000 // 8)])
def test_chunked_loss_forward_holds_one_up_cast_chunk(chunks: int, per_token: int) -> None:
    # At the last chunk: bf16 logits 2V + log-probs of all chunks 4V (this chunk's included)
    # + this chunk's fp32 up-cast 4V/c, freed once its log_softmax is written. One chunk is
    # F.cross_entropy(logits.float()) on everything, i.e. the full loss: 10V per token.
    assert _memory(LossImpl.CHUNKED, chunks=chunks).forward_end == 1000 * per_token


def test_vocab_parallel_loss() -> None:
    # Forward: bf16 logits 2V + fp32 input 4V + shifted logits 4V + their exp 4V = (2+12)V.
    forward = 1000 * (2 + 12) * 32_000  # 448,000,000 B
    # Backward: zeroed gradient, exp, their sum and the product, 4V each = 16V.
    backward = 1000 * 16 * 32_000  # 512,000,000 B
    assert _fields(_memory(loss_parallel=True)) == (forward, 1000 * 4 * 32_000, backward, 0)


def test_fused_linear_loss_never_materializes_the_logits() -> None:
    # Liger's chunk has tokens*h/V tokens of 8V bytes (fp32 logits + gradient): 8h per token,
    # plus the bf16 input gradient 2h computed during the forward.
    forward = 1000 * (8 * 4096 + 2 * 4096)  # 40,960,000 B
    grad_input = 1000 * 2 * 4096  # 8,192,000 B
    assert _fields(_memory(LossImpl.FUSED_LINEAR)) == (forward, grad_input, grad_input, 0)
    # Nothing of size V exists even when the model would keep its logits.
    assert _memory(LossImpl.FUSED_LINEAR, keeps=True).outputs == 0


# ---- orderings ---------------------------------------------------------------------------------


def test_large_vocab_ordering_fused_linear_chunked_full() -> None:
    # Per token: fused 10h = 40,960 B < chunked 6.5V = 208,000 B < full 10V = 320,000 B.
    fused = _memory(LossImpl.FUSED_LINEAR).forward_end
    chunked = _memory(LossImpl.CHUNKED).forward_end
    full = _memory().forward_end
    assert fused < chunked < full
    assert (fused, chunked, full) == (40_960_000, 208_000_000, 320_000_000)


def test_compiled_is_smaller_than_eager() -> None:
    eager, compiled = _memory(), _memory(compiled=True)
    assert compiled.forward_end < eager.forward_end  # 2V+4 B vs 10V per token
    assert compiled.backward_start < eager.backward_start  # 4V vs 12V per token


def test_dispatch_precedence() -> None:
    # An explicit chunked / fused-linear loss wins over loss_parallel and compile.
    assert _memory(LossImpl.CHUNKED, loss_parallel=True, compiled=True).forward_end == 208_000_000
    assert _memory(LossImpl.FUSED_LINEAR, loss_parallel=True).forward_end == 40_960_000


@pytest.mark.parametrize("path", ["compiled", "vocab-parallel"])
def test_kept_fp32_outputs_add_to_what_the_loss_keeps(path: str) -> None:
    compiled = path == "compiled"
    memory = _memory(keeps=True, kept_bytes=4, compiled=compiled, loss_parallel=not compiled)
    # The fp32 copy accelerate returns (4V) is a new tensor beside what the loss keeps:
    # compiled keeps the bf16 logits (2V), vocab-parallel its 4V log-probabilities.
    loss_keeps = 2 * 32_000 if compiled else 4 * 32_000
    backward = 2 * 2 * 32_000 if compiled else 16 * 32_000
    assert memory.kept == 1000 * (loss_keeps + 4 * 32_000)
    assert memory.backward_start == 1000 * (backward + 4 * 32_000)
