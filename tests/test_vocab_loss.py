"""modsent.training.vocab_loss: the cross-entropy of a vocabulary projection computed chunk by
chunk (no logits kept; the backward projects each chunk again) equals F.linear + F.cross_entropy,
losses and every gradient, in float64 to rounding and under bf16/fp16 autocast as close to a float64
reference as eager's own; it keeps no logits for the backward; with Triton's cross-entropy kernel
per chunk (the interpreter off a GPU) it computes the same."""

import pytest
import torch
import torch.nn.functional as F

from modsent.losses import CrossUnmaskingLoss
from modsent.training import fastpath, kernels
from modsent.training.vocab_loss import linear_cross_entropy

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: in Triton's interpreter


def problem(rows=37, width=16, vocab=101, dtype=torch.float64, seed=0, ignored=(3, 20)):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width ** 0.5).requires_grad_()
    bias = torch.randn(vocab, generator=generator, dtype=dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    targets[list(ignored)] = -100
    return states, weight, bias, targets


def grads(loss, inputs):
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("chunk_rows", [1, 5, 36, 37, 100])
def test_equals_the_unchunked_loss_and_its_gradients_in_float64(chunk_rows):
    """Per-row losses (0 at ignored rows) and the states', weight's and bias's gradients under
    a different weight per row, for chunks of one row, a partial last chunk, one chunk and more
    rows a chunk than there are (int32 targets)."""
    states, weight, bias, targets = problem()
    got = linear_cross_entropy(states, weight, bias, targets.int(), chunk_rows)
    want = F.cross_entropy(F.linear(states, weight, bias), targets, reduction="none")
    assert got.shape == want.shape == targets.shape and got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12) and got[3] == 0 and got[20] == 0
    per_row = torch.linspace(0.5, 2.0, len(targets), dtype=torch.float64)
    for a, b in zip(grads((got * per_row).sum(), (states, weight, bias)),
                    grads((want * per_row).sum(), (states, weight, bias))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda s, w, b: linear_cross_entropy(s, w, b, targets, chunk_rows),
                                    (states, weight, bias))


def test_keeps_no_logits_for_the_backward():
    """What autograd keeps: the inputs and a log-sum-exp per row, where the unchunked loss keeps
    a rows x vocabulary tensor (its log-softmax)."""
    states, weight, bias, targets = problem(rows=64, vocab=500, dtype=torch.float32)
    inputs = {t.data_ptr() for t in (states, weight, bias, targets)}

    def kept(loss_fn):
        extra = []

        def pack(t):
            if t.data_ptr() not in inputs:
                extra.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn().sum().backward()
        return extra

    chunked = kept(lambda: linear_cross_entropy(states, weight, bias, targets, 16))
    eager = kept(lambda: F.cross_entropy(F.linear(states, weight, bias).float(), targets, reduction="none"))
    assert sum(chunked) <= 2 * 64 and max(eager) >= 64 * 500  # the log-sum-exps (and targets as int64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk_rows", [1, 16, 50])
def test_under_autocast_it_is_as_close_to_float64_as_eager(dtype, chunk_rows):
    """Under CPU autocast the projection runs in autocast's dtype as F.linear's does (with one
    chunk the states' gradient is eager's bit for bit). Against float64, every gradient is about as
    close as eager's, also with 50 chunks of one row, where the weight's and bias's sums over the
    chunks, if rounded to bf16/fp16 at each chunk instead of kept in fp32, would drift further."""
    states, weight, bias, targets = problem(rows=50, width=32, vocab=200, dtype=torch.float32, ignored=(0,))
    with torch.autocast("cpu", dtype=dtype):
        got = linear_cross_entropy(states, weight, bias, targets, chunk_rows)
        eager = F.cross_entropy(F.linear(states, weight, bias).float(), targets, reduction="none")
    wide = [t.detach().double().requires_grad_() for t in (states, weight, bias)]
    exact = F.cross_entropy(F.linear(*wide), targets, reduction="none")
    assert torch.allclose(got.double(), exact, atol=0.05) and torch.allclose(got, eager, atol=1e-3)
    ours = grads(3 * got.sum(), (states, weight, bias))
    theirs = grads(3 * eager.sum(), (states, weight, bias))
    reference = grads(3 * exact.sum(), wide)
    for name, a, b, ref in zip(("states", "weight", "bias"), ours, theirs, reference):
        ours_error, eager_error = (a.double() - ref).abs().max(), (b.double() - ref).abs().max()
        assert ours_error <= 1.5 * eager_error + 1e-4, (name, ours_error, eager_error)
    if chunk_rows >= 50:
        assert torch.equal(ours[0], theirs[0])


def test_no_bias_and_a_frozen_weight():
    """Without a bias, and with the weight frozen (only the states' and the bias's gradients)."""
    states, weight, bias, targets = problem()
    got = linear_cross_entropy(states, weight, None, targets, 8)
    want = F.cross_entropy(F.linear(states, weight), targets, reduction="none")
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads(got.sum(), (states, weight)), grads(want.sum(), (states, weight))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    frozen = weight.detach()
    got = linear_cross_entropy(states, frozen, bias, targets, 8)
    want = F.cross_entropy(F.linear(states, frozen, bias), targets, reduction="none")
    per_row = torch.linspace(0.5, 2.0, len(targets), dtype=torch.float64)
    for a, b in zip(grads((got * per_row).sum(), (states, bias)), grads((want * per_row).sum(), (states, bias))):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_states_of_any_leading_shape_and_no_rows():
    states, weight, bias, targets = problem(rows=12, ignored=(3,))
    got = linear_cross_entropy(states.view(3, 4, -1), weight, bias, targets.view(3, 4), 5)
    assert got.shape == (3, 4)
    assert torch.allclose(got.view(-1), F.cross_entropy(F.linear(states, weight, bias), targets, reduction="none"))
    empty = linear_cross_entropy(states[:0], weight, bias, targets[:0], 5)
    assert empty.shape == (0,)
    g_states, g_weight, g_bias = grads(empty.sum(), (states, weight, bias))
    assert not g_states.any() and not g_weight.any() and not g_bias.any()


def test_bad_arguments_are_refused():
    states, weight, bias, targets = problem(rows=8, ignored=(3,))
    for rows in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="chunk_rows must be a positive integer"):
            linear_cross_entropy(states, weight, bias, targets, rows)
    with pytest.raises(ValueError, match="one target per row"):
        linear_cross_entropy(states, weight, bias, targets[:5], 4)
    with pytest.raises(ValueError, match="expected \\(vocabulary, width\\)"):
        linear_cross_entropy(states, weight[:, :5], bias, targets, 4)
    with pytest.raises(ValueError, match="integer targets"):
        linear_cross_entropy(states, weight, bias, targets.float(), 4)
    with pytest.raises(ValueError, match="expected one dtype"):
        linear_cross_entropy(states.float(), weight, bias, targets, 4)


def test_a_target_outside_the_vocabulary_makes_its_row_nan_and_no_other():
    """As the kernel does (eager raises): no check that would make the host wait for the GPU. The
    row's gradient is NaN too (and so the weight's: it sums every row's)."""
    states, weight, bias, targets = problem(rows=8, ignored=(3,))
    for bad in (101, -5):
        wrong = targets.clone()
        wrong[2] = bad
        losses = linear_cross_entropy(states, weight, bias, wrong, 3)
        assert losses[2].isnan() and not losses[torch.arange(8) != 2].isnan().any()
        (g_states,) = grads(losses.sum(), (states,))
        assert g_states[2].isnan().all() and not g_states[torch.arange(8) != 2].isnan().any()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_unmasking_loss_in_chunks_equals_it_whole(reduction):
    """CrossUnmaskingLoss(chunk_rows=...) given the projection: the loss and its gradients of the
    whole loss, and it refuses to guess the projection."""
    states, weight, bias, _ = problem(rows=30, dtype=torch.float32)
    labels = torch.full((3, 10), -100)
    labels[0, 2], labels[1, 5], labels[1, 9], labels[2, 0] = 4, 7, 100, 0
    hidden = states.view(3, 10, -1)

    def logits(x):
        return F.linear(x, weight, bias)

    whole = CrossUnmaskingLoss(reduction)(logits, hidden, labels)
    chunked = CrossUnmaskingLoss(reduction, chunk_rows=3)(logits, hidden, labels, projection=(weight, bias))
    assert torch.allclose(whole, chunked, rtol=1e-6)
    for a, b in zip(grads(whole, (states, weight, bias)), grads(chunked, (states, weight, bias))):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="needs the projection"):
        CrossUnmaskingLoss(reduction, chunk_rows=3)(logits, hidden, labels)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="chunk_rows must be a positive integer or None"):
            CrossUnmaskingLoss(reduction, chunk_rows=bad)


@pytest.mark.skipif(not kernels.runs_on(KERNEL_DEVICE),
                    reason="no GPU with Triton, and Triton's interpreter was not chosen before Triton was imported")
def test_each_chunk_through_tritons_kernel_computes_the_same(monkeypatch):
    """With the head marked for Triton's cross-entropy (fastpath.fuse_cross_entropy), each chunk's
    loss and gradient go through the kernel (the gradient written over the chunk's logits) and give
    the eager chunks' losses and gradients, ignored rows included (on a GPU compiled, else in
    Triton's interpreter)."""
    states, weight, bias, targets = (t.detach().to(KERNEL_DEVICE).requires_grad_(t.is_floating_point())
                                     for t in problem(rows=40, width=16, vocab=300, dtype=torch.float32))
    head = torch.nn.Module()
    calls = []
    for name in ("cross_entropy_rows", "cross_entropy_rows_grad"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    eager = fastpath.projection_cross_entropy(head, states, weight, bias, targets, "sum", 16)
    assert not calls
    fastpath.fuse_cross_entropy(head)
    triton = fastpath.projection_cross_entropy(head, states, weight, bias, targets, "sum", 16)
    assert torch.allclose(eager, triton, rtol=1e-5)
    for a, b in zip(grads(eager, (states, weight, bias)), grads(triton, (states, weight, bias))):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    assert calls == ["cross_entropy_rows"] * 3 + ["cross_entropy_rows_grad"] * 3
    mean = fastpath.projection_cross_entropy(head, states, weight, bias, targets, "mean", 7)
    assert torch.allclose(mean, eager / (targets != -100).sum(), rtol=1e-5)
    # a different gradient per row (each chunk its own rows' share), under bf16 autocast: the bf16
    # logits overwritten by their gradient; the kernel's chunks against the eager chunks and float64
    per_row = torch.linspace(0.5, 2.0, len(targets), device=KERNEL_DEVICE)
    with torch.autocast(KERNEL_DEVICE, dtype=torch.bfloat16):
        kernel = linear_cross_entropy(states, weight, bias, targets, 16, kernel=True)
        plain = linear_cross_entropy(states, weight, bias, targets, 16)
    assert torch.allclose(kernel, plain, rtol=1e-3, atol=1e-3)
    wide = [t.detach().double().requires_grad_() for t in (states, weight, bias)]
    exact = (F.cross_entropy(F.linear(*wide), targets, reduction="none") * per_row.double()).sum()
    for a, b, ref in zip(grads((kernel * per_row).sum(), (states, weight, bias)),
                         grads((plain * per_row).sum(), (states, weight, bias)), grads(exact, wide)):
        # (the interpreter rounds to bf16 by truncation, a GPU to nearest: up to twice eager's error)
        assert (a.double() - ref).abs().max() <= 3 * (b.double() - ref).abs().max() + 1e-3
        assert torch.allclose(a, b, rtol=0.05, atol=0.02)


def test_the_benchmark_runs_and_finds_no_logits_kept_in_chunks():
    """benchmarks/vocab_loss.py at a tiny size (each variant in a process of its own): a line per
    variant, the whole loss keeping its fp32 log-softmax (64 x 2,000 x 4 bytes) and the chunks a
    log-sum-exp per row."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "vocab_loss.py"
    out = subprocess.run([sys.executable, str(script), "--positions", "64", "--vocab", "2000", "--width", "32",
                          "--chunk-rows", "16"], check=True, capture_output=True, text=True).stdout
    kept = {m[1]: float(m[2]) * (1024 if m[3] == "GiB" else 1)
            for m in re.finditer(r"^(whole|chunks of 16) .* kept +([\d.]+) (MiB|GiB)", out, re.M)}
    assert set(kept) == {"whole", "chunks of 16"}, out
    assert abs(kept["whole"] - 64 * 2000 * 4 / 2**20) < 0.1 and kept["chunks of 16"] < 0.01, out
