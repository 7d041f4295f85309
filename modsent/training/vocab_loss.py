"""The cross-entropy of a vocabulary projection, chunk by chunk: its logits never kept.

An MLM loss projects its masked positions' states onto the vocabulary and takes the
cross-entropy of the logits. Autograd keeps what that needs for the backward: eager's
``F.cross_entropy(logits.float(), ...)`` the fp32 log-softmax of every logit, Triton's kernel
(:func:`modsent.training.kernels.cross_entropy`) the logits themselves. With a large vocabulary
that is most of a step's memory: MEXMA projects 40% of both sides' tokens onto XLM-R's 250,002
words, about 6,450 positions at 64 pairs of 128 tokens, 1.6G logits: 6.5 GB of fp32 log-softmax
kept (3.2 GB of bf16 logits with the kernel), and eager's transients on top (the fp32 copy, the
dense gradient). At the paper's 150 pairs of up to 200 tokens per GPU that is 6G logits.

:func:`linear_cross_entropy` computes the same per-row losses and gradients ``chunk_rows`` rows at
a time and keeps only each row's log-sum-exp (4 bytes a row). The backward computes each chunk's
logits again (one more product of the projection: a third more of its FLOPs), their gradient
``g · (softmax - onehot)`` in the projection's dtype, as eager rounds it, and from it the states',
the weight's and the bias's gradients; the weight's and the bias's are summed over the chunks in
fp32. At most one chunk's logits exist at a time, with its fp32 copy in eager (none with the
kernel, which writes the gradient over the logits).

Under autocast the projection runs in autocast's dtype, as ``F.linear`` would (the states, the
weight and the bias cast to it), and the gradients go back in each input's own dtype; without
autocast, in the inputs' dtype (one for all three, as ``F.linear`` requires). Nothing in it makes
the host wait for the GPU; a target outside the vocabulary gives its row a NaN loss and gradient,
as the kernel does, rather than a check that would.

Why not a library's. Liger's fused linear cross-entropy computes the gradient in the forward,
where an fp16 step's loss scale is not yet known: the unit gradients of rare words then underflow
fp16, where eager's, multiplied by the scale, do not (recomputing in the backward scales as
eager does, for a third more of the projection's FLOPs). Apple's Cut Cross-Entropy recomputes too,
but with its own Triton matrix products that by default skip the gradient's blocks below a
threshold (not eager's gradient), and off CUDA through ``torch.compile``. This one keeps cuBLAS's
products and modsent's cross-entropy kernel, has an eager path the suite checks on the CPU, and is
exact to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def compute_dtype(states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.dtype:
    """The dtype ``F.linear(states, weight, bias)`` computes in: autocast's where it is on for the
    states' device and casts them (it leaves fp64 alone), else their own, which must be one."""
    device = states.device.type
    dtypes = {t.dtype for t in (states, weight, bias) if t is not None}
    if torch.is_autocast_enabled(device) and torch.float64 not in dtypes:
        return torch.get_autocast_dtype(device)
    if len(dtypes) > 1:
        raise ValueError(f"linear_cross_entropy: states of {states.dtype}, a weight of {weight.dtype} and a bias of "
                         f"{None if bias is None else bias.dtype}; expected one dtype (or autocast)")
    return weight.dtype


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The loss's dtype for logits of ``dtype``: fp32, or fp64 for fp64 logits."""
    return torch.promote_types(dtype, torch.float32)


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.to(weight.dtype), weight, bias)


def _chunk_losses(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, kernel: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses, log-sum-exps) of one chunk's logits, fp32: 0 where the target is ``ignore_index``,
    NaN where it is outside the vocabulary."""
    if kernel:
        from modsent.training import kernels

        return kernels.cross_entropy_rows(logits, targets, ignore_index)
    full = logits.to(_wide(logits.dtype))
    lse = torch.logsumexp(full, dim=-1)
    inside = (targets >= 0) & (targets < full.shape[1])
    picked = full.gather(1, targets.clamp(0, full.shape[1] - 1).unsqueeze(1)).squeeze(1)
    loss = torch.where(inside, lse - picked, float("nan"))
    return torch.where(targets == ignore_index, 0.0, loss), lse


def _chunk_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
                ignore_index: int, kernel: bool) -> torch.Tensor:
    """``g[row] · (softmax(logits[row]) - onehot(target))`` in the logits' dtype (0 for ignored
    rows); with the kernel written over ``logits``."""
    if kernel:
        from modsent.training import kernels

        return kernels.cross_entropy_rows_grad(logits, targets, lse, g, ignore_index, logits)
    dtype, vocab = logits.dtype, logits.shape[1]
    grad = logits.to(_wide(dtype)).sub_(lse.unsqueeze(1)).exp_()  # (in place where the logits are that wide)
    del logits
    kept = targets != ignore_index
    inside = (targets >= 0) & (targets < vocab)
    # - onehot(target) without indexing by a host-side list of rows (no wait for the GPU)
    grad.scatter_add_(1, targets.clamp(0, vocab - 1).unsqueeze(1), -inside.to(grad.dtype).unsqueeze(1))
    scale = torch.where(inside, g.to(grad.dtype), torch.where(kept, float("nan"), 0.0))
    return grad.mul_(scale.unsqueeze(1)).to(dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, states, weight, bias, targets, chunk_rows, ignore_index, dtype, kernel):
        x2 = states.reshape(-1, states.shape[-1])
        t = targets.reshape(-1).long().contiguous()  # gather and scatter index with int64
        with torch.autocast(states.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            losses, lse = [], []
            for start in range(0, len(x2), chunk_rows):
                loss, top = _chunk_losses(_project(x2[start:start + chunk_rows], w, b),
                                          t[start:start + chunk_rows], ignore_index, kernel)
                losses.append(loss)
                lse.append(top)
        lse = torch.cat(lse) if lse else x2.new_empty(0, dtype=_wide(dtype))
        ctx.save_for_backward(x2, weight, bias, t, lse)
        ctx.chunk_rows, ctx.ignore_index, ctx.dtype, ctx.kernel = chunk_rows, ignore_index, dtype, kernel
        ctx.states_shape = states.shape
        return (torch.cat(losses) if losses else lse.clone()).view(targets.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x2, weight, bias, t, lse = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        rows, dtype = ctx.chunk_rows, ctx.dtype
        g = grad.reshape(-1)  # a sum's or a mean's gradient is one value expanded: stride 0
        grad_x = torch.empty_like(x2) if need_x else None
        wide = _wide(dtype)  # the sums over chunks
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=wide, device=bias.device) if need_b else None
        with torch.autocast(x2.device.type, enabled=False):  # the forward's dtype, whatever the caller's autocast
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            for start in range(0, len(x2), rows):
                x = x2[start:start + rows].to(dtype)
                d = _chunk_grad(_project(x, w, b), t[start:start + rows], lse[start:start + rows],
                                g[start:start + rows], ctx.ignore_index, ctx.kernel)
                if need_x:
                    grad_x[start:start + rows] = d @ w
                if need_w and d.dtype == wide:
                    grad_w.addmm_(d.T, x)  # in place: no weight-sized temporary
                elif need_w:
                    grad_w.add_(d.T @ x)  # a chunk's sum rounded to the projection's dtype once, as eager's
                if need_b:
                    grad_b += d.sum(0, dtype=wide)
        return (None if grad_x is None else grad_x.view(ctx.states_shape),
                None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None, None)


def is_chunk_rows(value) -> bool:
    """Whether ``value`` is a chunk size :func:`linear_cross_entropy` takes: a positive int (a bool
    is none). The config check (``loss_chunk_rows``) and the loss's constructor ask it too."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def linear_cross_entropy(states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_rows: int, ignore_index: int = -100,
                         kernel: bool = False) -> torch.Tensor:
    """Each row's ``F.cross_entropy(F.linear(states, weight, bias).float(), targets,
    reduction="none")`` (fp32, one per row of ``states``), computed ``chunk_rows`` rows at a time:
    no logits kept for the backward, which computes each chunk's again (see the module's text).
    ``kernel``: each chunk's cross-entropy through :mod:`modsent.training.kernels`' kernels (the
    caller checks that they run on the states' device: :func:`modsent.training.kernels.supported`);
    else in PyTorch, chunk by chunk. The same losses and gradients as the unchunked loss up to float
    rounding (the weight's and bias's gradients summed over chunks in fp32); a target outside the
    vocabulary gives its row NaN (no check that waits for the GPU), where eager raises."""
    if not is_chunk_rows(chunk_rows):
        raise ValueError(f"linear_cross_entropy: chunk_rows must be a positive integer, got {chunk_rows!r}")
    if states.dim() < 1 or targets.shape != states.shape[:-1]:
        raise ValueError(f"linear_cross_entropy: targets of shape {tuple(targets.shape)} for states of shape "
                         f"{tuple(states.shape)}; expected one target per row of states")
    if (weight.dim() != 2 or weight.shape[1] != states.shape[-1]
            or (bias is not None and bias.shape != weight.shape[:1])):
        raise ValueError(f"linear_cross_entropy: a weight of shape {tuple(weight.shape)} and a bias of shape "
                         f"{None if bias is None else tuple(bias.shape)} for states of width {states.shape[-1]}; "
                         "expected (vocabulary, width) and (vocabulary,)")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"linear_cross_entropy: targets of {targets.dtype}; expected integer targets")
    return _LinearCrossEntropy.apply(states, weight, bias, targets, chunk_rows, int(ignore_index),
                                     compute_dtype(states, weight, bias), bool(kernel))
