"""TRL's fused LM head: per-token log-probabilities without the ``[tokens, vocab]`` logits.

TRL's SFTTrainer and DPOTrainer (1.16) patch the model's forward with ``add_fused_lm_head``
(``trl/trainer/utils.py``) and compute the loss from ``ChunkedLogProbFunction``
(``trl/kernels/chunked_logprob.py``). Per micro-batch, with ``N`` scored positions (the
``batch x (seq - 1)`` shifted ones: the head drops each row's last position), ``h`` the hidden
size, ``a`` the compute dtype's bytes, ``s`` the final hidden state's bytes (the weights' dtype:
fp32 under autocast on fp32 weights), ``w`` the head weight's bytes:

* the head's input is copied (``hidden_states[mask]`` on CUDA, a reshape of the shifted slice
  elsewhere: ``N x h x s``) and saved for backward, with the head's weight or not;
* forward: one ``[min(N, 4096), 32768]`` tile in the compute dtype (``mm_buf``: allocated at the
  full 32768 columns even for a smaller vocabulary), the input chunk cast to ``a`` when ``s != a``,
  each 32768-row weight chunk cast to ``a`` when ``w != a``, seven fp32 running statistics per
  position; the Triton kernels fold the tile in registers;
* kept for backward: ``log_z`` and the entropy (8 B per position), the masked log-probs and
  entropy the trainer reads (8 B) and two boolean masks (2 B);
* backward: the tile and the casts again, the fp32 input gradient ``N x h x 4``, the fp32 head
  gradient ``V x h x 4`` when the head trains, and at the return their casts to ``s`` and ``w``
  (when not fp32), while the tile is still alive. The gradient GEMMs accumulate in fp32 through
  ``torch.addmm(..., out_dtype=torch.float32)`` (CUDA, torch >= 2.8), no extra copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.logits import LogitsMemory
from vramlens.estimator.lora_head import HEAD_NAMES
from vramlens.estimator.loss_pattern import LossScript, Step
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import LossImpl

__all__ = [
    "TOKEN_TILE",
    "VOCAB_TILE",
    "FusedHead",
    "fused_head",
    "fused_head_memory",
    "fused_head_script",
    "head_input_per_token",
]

#: Positions per tile (``TOKEN_CHUNK_SIZE``, trl/kernels/chunked_logprob.py, TRL 1.16).
TOKEN_TILE = 4096
#: Vocabulary columns per tile (``_CHUNKED_LOGPROB_CHUNK_SIZE``, trl/trainer/utils.py, TRL 1.16).
VOCAB_TILE = 32768
#: fp32 running statistics per position in the forward (max, sum, x-sum, square sum, logit sum,
#: max before target, target logit).
_STATS = 7 * 4
#: Bytes per position alive between forward and backward: saved log_z and entropy, masked
#: log-probs and entropy, is_top1 and the label mask.
_KEPT = 4 + 4 + 4 + 4 + 1 + 1


@dataclass(frozen=True, kw_only=True, slots=True)
class FusedHead:
    """One micro-batch through TRL's fused head (bytes per element as in the module docstring)."""

    positions: int
    vocab: int
    hidden: int
    compute_bytes: int
    stream_bytes: int
    """The final hidden state's (and the saved input copy's) bytes per element."""
    weight_bytes: int
    head_trains: bool

    @property
    def tile(self) -> int:
        return min(self.positions, TOKEN_TILE) * VOCAB_TILE * self.compute_bytes

    @property
    def casts(self) -> int:
        """The input chunk and the weight chunk cast to the compute dtype (when they are not in it)."""
        a, h = self.compute_bytes, self.hidden
        chunk = min(self.positions, TOKEN_TILE) * h * a if self.stream_bytes != a else 0
        weight = min(self.vocab, VOCAB_TILE) * h * a if self.weight_bytes != a else 0
        return chunk + weight

    @property
    def saved_input(self) -> int:
        """The head's input copy, saved for backward."""
        return self.positions * self.hidden * self.stream_bytes

    @property
    def grads(self) -> tuple[int, int]:
        """The fp32 input and head gradients, and their casts at the return."""
        n, h, v = self.positions, self.hidden, self.vocab
        fp32 = n * h * 4 + (v * h * 4 if self.head_trains else 0)
        cast = (n * h * self.stream_bytes if self.stream_bytes != 4 else 0) + (
            v * h * self.weight_bytes if self.head_trains and self.weight_bytes != 4 else 0
        )
        return fp32, cast


def fused_head_memory(head: FusedHead) -> LogitsMemory:
    """Bytes at the head's forward, between forward and backward, and at its backward, beside
    the saved activations (the saved input copy is one of them: :attr:`FusedHead.saved_input`).
    The final norm's output (``N x h x s``) is alive while the head runs."""
    n = head.positions
    kept = n * _KEPT
    fp32_grads, grad_casts = head.grads
    norm_out = head.saved_input
    return LogitsMemory(
        forward_end=norm_out + head.tile + head.casts + n * _STATS,
        kept=kept,
        backward_start=kept + head.tile + head.casts + fp32_grads + grad_casts,
        outputs=0,
        formula=f"TRL fused LM head: [min(N, {TOKEN_TILE}), {VOCAB_TILE}] tile x {head.compute_bytes} B "
        f"= {head.tile} B, N={n} positions; backward fp32 gradients {fp32_grads} B",
    )


def fused_head_script(head: FusedHead) -> LossScript:
    """The same requests in allocation order (for the caching-allocator replay)."""
    n = head.positions
    fp32_grads, grad_casts = head.grads
    forward: list[Step] = [("+", "norm_out", head.saved_input), ("+", "stats", n * _STATS)]
    forward += [("+", "tile", head.tile), ("+", "casts", head.casts), ("-", "casts", 0), ("-", "tile", 0)]
    forward += [("+", "kept", n * _KEPT), ("-", "stats", 0), ("-", "norm_out", 0)]
    backward: list[Step] = [("+", "dfp32", fp32_grads), ("+", "tile", head.tile), ("+", "casts", head.casts)]
    backward += [("+", "dlogits", grad_casts), ("-", "casts", 0), ("-", "tile", 0), ("-", "dfp32", 0)]
    return LossScript(forward=tuple(forward), backward=(*backward, ("-", "kept", 0)))


def _stream_bytes(ctx: TrainingContext) -> int:
    """Bytes per element of the final hidden state and the head weight: the weights' dtype (fp32
    weights under autocast keep an fp32 residual stream; a frozen base is in the compute dtype)."""
    return ctx.param_bytes if ctx.full else max(int(ctx.frozen_bytes), ctx.compute_bytes)


def fused_head(ctx: TrainingContext) -> FusedHead | None:
    """The fused head of a ``loss: chunked-logprob`` step (None for any other loss)."""
    if ctx.loss is not LossImpl.CHUNKED_LOGPROB:
        return None
    stream = _stream_bytes(ctx)
    return FusedHead(
        positions=max(ctx.tokens - ctx.workload.batch, 1),
        vocab=ctx.spec.vocab_size // ctx.workload.parallel.tp,
        hidden=ctx.spec.hidden_size,
        compute_bytes=ctx.compute_bytes,
        stream_bytes=stream,
        weight_bytes=stream,
        head_trains=ctx.full or bool(HEAD_NAMES & set(ctx.workload.lora.modules_to_save)),
    )


def head_input_per_token(ctx: TrainingContext) -> int:
    """Bytes per token the LM head keeps of its input for backward: the compute-dtype input of a
    trained ``nn.Linear`` head (none when it is frozen), or TRL's fused head's input copy in the
    stream dtype, saved whether the head trains or not."""
    if ctx.loss is LossImpl.CHUNKED_LOGPROB:
        return _stream_bytes(ctx) * ctx.spec.hidden_size
    return ctx.compute_bytes * ctx.spec.hidden_size if ctx.full else 0
