"""modsent.training.kernels: the LoRA layer with its dropout drawn inside two Triton kernels
computes what PEFT's layer computes with that dropout mask, and draws masks as nn.Dropout does.

Off a GPU the kernels run in Triton's interpreter on the CPU (./run test installs Triton for it),
where their products are computed in fp32; with a GPU, the same cases run compiled on CUDA."""

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from torch import nn

pytest.importorskip("triton")

from modsent.training import fastpath, kernels  # noqa: E402

# the CPU's kernels in the interpreter (conftest chooses it where there is no GPU), else CUDA's
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not kernels.interpreting(),
                                reason="no GPU, and Triton's interpreter was not chosen before Triton was imported")


@pytest.fixture
def device(request):
    return request.param


def relative_error(got, want):
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / want.abs().max())


CASES = [  # rows, input width, output width, rank, p, dtype, does x need a gradient
    ((2, 50), 96, 80, 8, 0.1, torch.float32, True),
    ((130,), 768, 64, 8, 0.3, torch.float32, True),  # a width of three full tiles, rows past a block
    ((70,), 300, 40, 4, 0.1, torch.float32, False),  # a partial tile, rank 4, no input gradient
    ((4, 16), 256, 32, 8, 0.1, torch.bfloat16, True),
]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("rows, k, n, r, p, dtype, x_grad", CASES)
def test_lora_linear_equals_the_layer_with_its_mask(device, rows, k, n, r, p, dtype, x_grad):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*rows, k, generator=generator).to(device, dtype).requires_grad_(x_grad)
    weight = (torch.randn(n, k, generator=generator) / k ** 0.5).to(device, dtype)
    bias = torch.randn(n, generator=generator).to(device, dtype)
    lora_a = (torch.randn(r, k, generator=generator) / k ** 0.5).to(device).requires_grad_(True)
    lora_b = torch.randn(n, r, generator=generator).to(device).requires_grad_(True)
    out = kernels.lora_linear(x, lora_a, lora_b, weight, bias, 2.0, p, seed=1234)
    assert out.shape == (*rows, n) and out.dtype == dtype
    grad = torch.randn(out.shape, generator=generator).to(device, dtype)
    inputs = (x, lora_a, lora_b) if x_grad else (lora_a, lora_b)
    got = torch.autograd.grad(out, inputs, grad)
    assert got[-2].dtype == got[-1].dtype == torch.float32  # the adapter's own dtype

    # the reference in float64 from the same inputs, with the mask the kernels drew
    keep = kernels.dropout_mask((x.numel() // k, k), p, 1234, device)
    ref_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_x = ref_inputs[0] if x_grad else x.double()
    ref = kernels.reference(ref_x, ref_inputs[-2], ref_inputs[-1], weight.double(), bias.double(), 2.0, p, keep)
    want = torch.autograd.grad(ref, ref_inputs, grad.double())
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert relative_error(out, ref) < tolerance
    for got_grad, want_grad in zip(got, want):
        assert relative_error(got_grad, want_grad) < tolerance
    if x_grad:  # the branch's share of the input's gradient alone (the base's product is exact on both sides)
        base = (grad.double() @ weight.double()).view(got[0].shape)
        branch, want_branch = got[0].double() - base, want[0] - base
        assert relative_error(branch, want_branch) < (1e-5 if dtype == torch.float32 else 3e-2)
        dropped = ~keep.view(x.shape)
        assert branch.abs().max() > 0.1 and float(branch[dropped].abs().max()) < 1e-2 * float(branch.abs().max())


GROUP_CASES = [  # rows, input width, output widths, rank, p, dtype, does x need a gradient, outputs used
    ((2, 50), 96, (80, 80, 48), 8, 0.1, torch.float32, True, (0, 1, 2)),
    ((130,), 768, (64, 32, 64), 8, 0.3, torch.float32, True, (0, 2)),  # the key's output unused: no gradient
    ((70,), 300, (40, 40), 4, 0.1, torch.float32, False, (0, 1)),  # two layers, a partial tile, no input gradient
    ((4, 16), 256, (32, 32, 32), 8, 0.1, torch.bfloat16, True, (0, 1, 2)),
]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("rows, k, widths, r, p, dtype, x_grad, used", GROUP_CASES)
def test_lora_linears_equal_each_layer_with_its_mask(device, rows, k, widths, r, p, dtype, x_grad, used):
    """Up to three layers reading one input (an attention's query, key and value) through one
    kernel each way compute what each layer computes with the mask of its own seed."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*rows, k, generator=generator).to(device, dtype).requires_grad_(x_grad)
    layers = []
    for index, n in enumerate(widths):
        weight = (torch.randn(n, k, generator=generator) / k ** 0.5).to(device, dtype)
        bias = torch.randn(n, generator=generator).to(device, dtype) if index != 1 else None
        lora_a = (torch.randn(r, k, generator=generator) / k ** 0.5).to(device).requires_grad_(True)
        lora_b = torch.randn(n, r, generator=generator).to(device).requires_grad_(True)
        layers.append((lora_a, lora_b, weight, bias, 2.0 - 0.5 * index))
    seeds = [1234 + 7 * index for index in range(len(layers))]
    outs = kernels.lora_linears(x, layers, p, seeds=seeds)
    assert [out.shape for out in outs] == [(*rows, n) for n in widths] and {out.dtype for out in outs} == {dtype}
    grads = [torch.randn(outs[j].shape, generator=generator).to(device, dtype) for j in used]
    inputs = ([x] if x_grad else []) + [t for lora_a, lora_b, *_ in layers for t in (lora_a, lora_b)]
    got = torch.autograd.grad([outs[j] for j in used], inputs, grads, allow_unused=True)

    # the reference in float64, each layer with the mask its seed draws
    ref_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_x = ref_inputs[0] if x_grad else x.double()
    adapters = ref_inputs[1:] if x_grad else ref_inputs
    refs = []
    for j, (_, _, weight, bias, scaling) in enumerate(layers):
        keep = kernels.dropout_mask((x.numel() // k, k), p, seeds[j], device)
        refs.append(kernels.reference(ref_x, adapters[2 * j], adapters[2 * j + 1], weight.double(),
                                      None if bias is None else bias.double(), scaling, p, keep))
    want = torch.autograd.grad([refs[j] for j in used], ref_inputs, [g.double() for g in grads], allow_unused=True)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for out, ref in zip(outs, refs):
        assert relative_error(out, ref) < tolerance
    for index, (got_grad, want_grad) in enumerate(zip(got, want)):
        if want_grad is None:  # an unused layer's adapter: no gradient, as the layer alone
            assert got_grad is None, index
            continue
        assert got_grad.dtype == inputs[index].dtype
        assert relative_error(got_grad, want_grad) < tolerance, index
    if x_grad:  # the branches' share of the input's gradient (the base products are exact on both sides)
        base = sum(grads[i].double() @ layers[j][2].double() for i, j in enumerate(used)).view(got[0].shape)
        assert relative_error(got[0].double() - base, want[0] - base) < (1e-5 if dtype == torch.float32 else 3e-2)


def test_lora_linears_check_their_layers():
    x = torch.randn(4, 8)
    layer = (torch.randn(2, 8), torch.randn(6, 2), torch.randn(6, 8), None, 1.0)
    with pytest.raises(ValueError, match="1 to 3"):
        kernels.lora_linears(x, [layer] * 4, 0.1)
    with pytest.raises(ValueError, match="one rank"):
        kernels.lora_linears(x, [layer, (torch.randn(4, 8), torch.randn(6, 4), *layer[2:])], 0.1)
    with pytest.raises(ValueError, match="frozen"):
        kernels.lora_linears(x, [layer, (*layer[:2], torch.randn(6, 8, requires_grad=True), None, 1.0)], 0.1)
    with pytest.raises(ValueError, match="2 seeds for 1"):
        kernels.lora_linears(x, [layer], 0.1, seeds=[1, 2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the interpreter covers several row blocks a program at 130 rows")
def test_lora_linear_at_the_las_size_on_a_gpu():
    """128 x 256 tokens of width 768 in bf16, as the LA's step: the backward's programs each take
    several row blocks on a GPU (on the CPU the interpreter's four programs do at 130 rows)."""
    device, k, r = "cuda", 768, 8
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 256, k, generator=generator).to(device, torch.bfloat16).requires_grad_(True)
    weight = (torch.randn(k, k, generator=generator) / k ** 0.5).to(device, torch.bfloat16)
    lora_a = (torch.randn(r, k, generator=generator) / k ** 0.5).to(device).requires_grad_(True)
    lora_b = torch.randn(k, r, generator=generator).to(device).requires_grad_(True)
    out = kernels.lora_linear(x, lora_a, lora_b, weight, None, 2.0, 0.1, seed=3)
    grad = torch.randn(out.shape, generator=generator).to(device, torch.bfloat16)
    got = torch.autograd.grad(out, (x, lora_a, lora_b), grad)
    keep = kernels.dropout_mask((128 * 256, k), 0.1, 3, device)
    refs = [t.detach().double().requires_grad_(True) for t in (x, lora_a, lora_b)]
    ref = kernels.reference(*refs, weight.double(), None, 2.0, 0.1, keep)
    want = torch.autograd.grad(ref, refs, grad.double())
    assert relative_error(out, ref) < 2e-2
    for got_grad, want_grad in zip(got, want):
        assert relative_error(got_grad, want_grad) < 2e-2
    branch, want_branch = (g.double() - (grad.double() @ weight.double()) for g in (got[0], want[0]))
    assert relative_error(branch, want_branch) < 3e-2


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_masks_draw_as_dropout_does(device):
    shape, p = (256, 1024), 0.1
    keep = kernels.dropout_mask(shape, p, 42, device)
    dropped = float((~keep).float().mean())
    expected = round(p * 65536) / 65536
    sigma = (expected * (1 - expected) / keep.numel()) ** 0.5
    assert abs(dropped - expected) < 5 * sigma
    assert torch.equal(keep, kernels.dropout_mask(shape, p, 42, device))  # a seed draws one mask
    other = kernels.dropout_mask(shape, p, 43, device)
    # another seed, an independent mask (sigma of the share below: 0.00075)
    assert abs(float((keep != other).float().mean()) - 2 * p * (1 - p)) < 0.005
    # each Philox call serves 8 neighbouring columns: their draws are independent of each other
    # (both dropped: p^2 = 0.01, sigma 0.0002 over these 262,144 pairs)
    drops = (~keep).float()
    for step in (1, 2, 3, 4, 7, 8, 16):
        both = float((drops[:, step:] * drops[:, :-step]).mean())
        assert abs(both - p * p) < 0.0012, step
    assert float((drops[1:] * drops[:-1]).mean()) == pytest.approx(p * p, abs=0.0012)  # and rows
    assert torch.equal(kernels.dropout_mask(shape, 0.0, 42, device), torch.ones(shape, dtype=torch.bool))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_masks_and_results_do_not_depend_on_the_tiles(device, monkeypatch):
    shape = (100, 300)
    keep = kernels.dropout_mask(shape, 0.1, 7, device)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator).to(device).requires_grad_(True)
    weight, lora_a, lora_b = (torch.randn(s, generator=generator).to(device) for s in ((20, 300), (4, 300), (20, 4)))
    lora_a.requires_grad_(True)

    def run():
        out = kernels.lora_linear(x, lora_a, lora_b, weight, None, 1.0, 0.1, seed=7)
        return (out, *torch.autograd.grad(out, (x, lora_a), torch.ones_like(out)))

    def norm():
        out = kernels.dropout_add_norm(x, x.detach() * 2, None, None, 1e-5, 0.1, x.dtype, seed=7)
        return (out, *torch.autograd.grad(out, x, torch.ones_like(out)))

    before, norm_before = run(), norm()
    # other rows, other groups of columns (the masks' joined layout), other programs per tile
    monkeypatch.setitem(kernels.TILES, "mask", (16, 4, 4))
    monkeypatch.setitem(kernels.TILES, "down", (16, 16, 4))
    monkeypatch.setitem(kernels.TILES, "up", (16, 2, 4, 1))
    monkeypatch.setitem(kernels.TILES, "norm", (1, 4))
    assert torch.equal(kernels.dropout_mask(shape, 0.1, 7, device), keep)
    for got, want in zip(run() + norm(), before + norm_before):  # up to the order of float sums
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.detach().abs().max()))


NORM_CASES = [  # rows, width, p, hidden's, residual's and the output's dtypes, eps
    ((2, 5), 96, 0.1, torch.float32, torch.float32, torch.float32, 1e-12),
    ((7,), 768, 0.3, torch.bfloat16, torch.bfloat16, torch.bfloat16, 1e-12),  # the bf16 stream
    ((3, 3), 768, 0.1, torch.bfloat16, torch.float32, torch.float32, 1e-5),  # autocast's fp32 stream
    ((6,), 40, 0.0, torch.float32, torch.float32, torch.float32, 0.5),  # no dropout, a narrow row, an eps that counts
]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("rows, d, p, hidden_dtype, residual_dtype, out_dtype, eps", NORM_CASES)
def test_dropout_add_norm_equals_the_three_steps_with_its_mask(device, rows, d, p, hidden_dtype, residual_dtype,
                                                                 out_dtype, eps):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(*rows, d, generator=generator).to(device, hidden_dtype).requires_grad_(True)
    residual = torch.randn(*rows, d, generator=generator).to(device, residual_dtype).requires_grad_(True)
    weight = (1 + 0.2 * torch.randn(d, generator=generator)).to(device, out_dtype)
    bias = (0.2 * torch.randn(d, generator=generator)).to(device, out_dtype)
    out = kernels.dropout_add_norm(hidden, residual, weight, bias, eps, p, out_dtype, seed=11)
    assert out.shape == hidden.shape and out.dtype == out_dtype
    grad = torch.randn(out.shape, generator=generator).to(device, out_dtype)
    got = torch.autograd.grad(out, (hidden, residual), grad)
    assert got[0].dtype == hidden_dtype and got[1].dtype == residual_dtype

    keep = kernels.dropout_mask((hidden.numel() // d, d), p, 11, device)
    refs = [t.detach().clone().requires_grad_(True) for t in (hidden, residual)]
    ref = kernels.norm_reference(*refs, weight, bias, eps, p, out_dtype, keep)
    want = torch.autograd.grad(ref, refs, grad)
    # the interpreter rounds to bf16 by truncation, a GPU to nearest: one bf16 step apart at most
    tolerance = 1e-5 if hidden_dtype == residual_dtype == torch.float32 else 3e-2
    assert relative_error(out, ref) < tolerance
    for got_grad, want_grad in zip(got, want):
        assert relative_error(got_grad, want_grad) < tolerance
    if p:  # dropped elements get no gradient, kept ones the residual's, scaled
        dropped = ~keep.view(hidden.shape)
        assert float(got[0][dropped].abs().max()) == 0 and float(got[0][~dropped].abs().max()) > 0.1
    # only the residual needs a gradient (the other is not computed)
    only = torch.autograd.grad(kernels.dropout_add_norm(hidden.detach(), residual, weight, bias, eps, p, out_dtype,
                                                        seed=11), residual, grad)[0]
    torch.testing.assert_close(only, got[1], rtol=0, atol=0)


CE_CASES = [  # rows, vocabulary, dtype, the kernels' columns a pass, the logits' rows part of wider rows, targets
    ((37,), 1000, torch.float32, 256, False, torch.int64),  # four passes over a row, the last one partial
    ((3, 5), 300, torch.float32, 2048, False, torch.int64),  # one partial pass; rows of a 3-d batch
    ((40,), 777, torch.bfloat16, 128, False, torch.int64),  # the LA's logits under autocast
    ((9,), 500, torch.float32, 128, True, torch.int32),  # a row's stride is not its length; int32 targets
    ((6,), 300, torch.float16, 128, False, torch.int64),  # MEXMA's with precision: fp16
]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("rows, v, dtype, columns, sliced, target_dtype", CE_CASES)
def test_cross_entropy_equals_eagers_in_float64(device, rows, v, dtype, columns, sliced, target_dtype, monkeypatch):
    monkeypatch.setitem(kernels.TILES, "ce", (columns, 4))
    generator = torch.Generator().manual_seed(0)
    # logits far from 0 (a log-sum-exp computed without its maximum would overflow fp32's exp)
    wide = torch.randn(*rows, v + (37 if sliced else 0), generator=generator) * 4 + 90
    logits = wide.to(device, dtype)[..., :v].detach().requires_grad_(True)  # sliced: each row inside a wider one
    assert logits.is_contiguous() != sliced
    targets = torch.randint(0, v, rows, generator=generator)
    targets.view(-1)[1] = -100  # ignored: no loss, no gradient
    targets = targets.to(device, target_dtype)
    loss = kernels.cross_entropy(logits, targets)
    assert loss.shape == rows and loss.dtype == torch.float32
    grad = torch.rand(rows, generator=generator).to(device)
    (got,) = torch.autograd.grad(loss, logits, grad)
    assert got.dtype == dtype and got.shape == logits.shape

    reference = logits.detach().double().requires_grad_(True)
    want_loss = nn.functional.cross_entropy(reference.reshape(-1, v), targets.reshape(-1).long(),
                                            reduction="none").view(rows)
    (want,) = torch.autograd.grad(want_loss, reference, grad.double())
    loss, want_loss = loss.detach(), want_loss.detach()
    assert float((loss.double() - want_loss).abs().max()) < 1e-5 * float(want_loss.abs().max())
    assert float(loss.view(-1)[1]) == 0 and float(got.reshape(-1, v)[1].abs().max()) == 0
    # the interpreter rounds to bf16 by truncation, a GPU to nearest
    assert relative_error(got, want) < {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    # a mean's gradient comes as one value expanded over the rows (stride 0): the same as given whole
    (mean_grad,) = torch.autograd.grad(kernels.cross_entropy(logits, targets).mean(), logits)
    (whole,) = torch.autograd.grad(kernels.cross_entropy(logits, targets), logits,
                                   torch.full(rows, 1 / targets.numel(), device=device))
    torch.testing.assert_close(mean_grad, whole, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_cross_entropy_marks_a_bad_row_and_checks_its_inputs(device):
    """A target outside the vocabulary makes its row's loss and gradient NaN (eager raises on the
    CPU, and asserts on a GPU, where a check would wait for the device); a NaN logit makes its
    row NaN, as eager's; the other rows are untouched."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_(True)
    targets = torch.tensor([3, 50, -1, 2**40, -2**40, 7]).to(device)  # far outside: no read there either
    poisoned = logits.detach().clone()
    poisoned[5, 9] = float("nan")
    for x in (logits, poisoned.requires_grad_(True)):
        loss = kernels.cross_entropy(x, targets)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        bad = [1, 2, 3, 4] if x is logits else [1, 2, 3, 4, 5]
        assert torch.isnan(loss[bad]).all() and torch.isnan(grad[bad]).all()
        want = nn.functional.cross_entropy(logits.detach()[:1], targets[:1], reduction="none")
        torch.testing.assert_close(loss[:1], want)
    with pytest.raises(ValueError, match="one target per row"):
        kernels.cross_entropy(logits, targets[:3])
    with pytest.raises(ValueError, match="integer targets"):
        kernels.cross_entropy(logits, targets.float())


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_mlm_cross_entropy_reduces_as_eager_does(device):
    """fastpath.mlm_cross_entropy with a marked head: the kernel's rows summed, or averaged over the
    rows that count (eager's mean leaves ignored rows out); other reductions are refused."""
    head = nn.Linear(4, 30).to(device)
    fastpath.fuse_cross_entropy(head)
    logits = torch.randn(7, 30, generator=torch.Generator().manual_seed(0)).to(device)
    targets = torch.tensor([1, -100, 29, 0, -100, 5, 7]).to(device)
    for reduction in ("mean", "sum"):
        torch.testing.assert_close(fastpath.mlm_cross_entropy(head, logits, targets, reduction),
                                   nn.functional.cross_entropy(logits, targets, reduction=reduction))
    with pytest.raises(ValueError, match="reduction 'none'"):
        fastpath.mlm_cross_entropy(head, logits, targets, "none")


def tiny_bert_for_mlm():
    """A tiny BERT MLM with LoRA on query, key and value and every dropout on, the embeddings (tied
    to the decoder) and the head trained, as the LA's model."""
    from modsent.losses import mlm_parts

    config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=96)
    torch.manual_seed(0)
    model = get_peft_model(transformers.BertForMaskedLM(config),
                           LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["query", "key", "value"]))
    model.get_input_embeddings().weight.requires_grad_(True)
    for param in mlm_parts(model)[1].parameters():
        param.requires_grad_(True)
    return model.train()


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_an_mlm_step_with_the_cross_entropy_kernel_equals_eagers(device, reduction, monkeypatch):
    """fuse_cross_entropy: the MLM loss (masked positions only) through the kernel, the same loss
    and gradients as eager's, dropout's draws unchanged (the same seed draws the same masks); off
    again, eager's F.cross_entropy runs."""
    from modsent.losses import MaskedLanguageModelingLoss, mlm_parts

    model = tiny_bert_for_mlm().to(device)
    fastpath.speed_up(model)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (3, 12), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.3, ids, torch.full_like(ids, -100))
    calls = []
    original = kernels.cross_entropy
    monkeypatch.setattr(kernels, "cross_entropy", lambda *a, **k: calls.append(1) or original(*a, **k))

    def run():
        torch.manual_seed(7)
        loss = MaskedLanguageModelingLoss(reduction)(model, ids.to(device), labels)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    ref_loss, ref_grads = run()
    assert not calls
    head = mlm_parts(model)[1]
    assert fastpath.fuse_cross_entropy(head) == 1 and fastpath.fuse_cross_entropy(head) == 0
    loss, grads = run()
    assert len(calls) == 1
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    assert grads.keys() == ref_grads.keys() and any("lora_A" in name for name in grads)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5,
                                   atol=1e-5 * float(ref_grads[name].abs().max()))
    with torch.no_grad():  # the held-out loss: the kernel's forward alone
        model.eval()
        held_out = MaskedLanguageModelingLoss(reduction)(model, ids.to(device), labels)
        fastpath.fuse_cross_entropy(head, on=False)
        torch.testing.assert_close(held_out, MaskedLanguageModelingLoss(reduction)(model, ids.to(device), labels))
    assert len(calls) == 2
    assert fastpath.fuse_cross_entropy(head, on=False) == 0
    # use_triton_kernels marks the head it is given, and only that
    assert fastpath.use_triton_kernels(model, mlm_head=head)[2] == 1 and fastpath.use_triton_kernels(model)[2] == 0


def tiny_lora_bert(lora_dropout=0.1, hidden_dropout=0.0, targets=("query", "key", "value")):
    """A BERT with LoRA on query, key and value (as the LA's; or on ``targets``) whose only
    randomness is LoRA's dropout, or the attention and feed-forward outputs' (not the embeddings')."""
    config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=96, hidden_dropout_prob=hidden_dropout,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = get_peft_model(transformers.BertModel(config, add_pooling_layer=False),
                           LoraConfig(r=8, lora_alpha=16, lora_dropout=lora_dropout, target_modules=list(targets)))
    model.base_model.model.embeddings.dropout.p = 0.0
    for name, param in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: make the branch count
            nn.init.normal_(param, std=0.2)
    model.get_input_embeddings().weight.requires_grad_(True)  # as the LA: the input needs a gradient
    return model.train()


class MaskedDropout(nn.Module):
    """nn.Dropout with the masks the kernels drew, in the order they drew them."""

    def __init__(self, draws: list, p: float):
        super().__init__()
        self.draws, self.p = draws, p

    def forward(self, x):
        shape, seed = self.draws.pop(0)
        assert shape == x.shape
        keep = kernels.dropout_mask((x.numel() // x.shape[-1], x.shape[-1]), self.p, seed, x.device)
        return x * keep.view(x.shape) * kernels._threshold(self.p)[1]


def recorded_draws(monkeypatch, function: str) -> list:
    """(input shape, seed) of each call of ``kernels.<function>`` from now on, in order: each call
    gets the next of fixed seeds, for the reference run to draw its masks again."""
    draws, original = [], getattr(kernels, function)

    def recorded(first, *args, seed=None):
        seed = len(draws) + 100
        draws.append((first.shape, seed))
        return original(first, *args, seed=seed)

    def recorded_layers(x, layers, p, seeds=None):  # lora_linears: a draw per layer, in the layers' order
        seeds = [len(draws) + 100 + index for index in range(len(layers))]
        draws.extend((x.shape, seed) for seed in seeds)
        return original(x, layers, p, seeds=seeds)

    monkeypatch.setattr(kernels, function, recorded_layers if function == "lora_linears" else recorded)
    return draws


def step(model, ids):
    out = model(input_ids=ids).last_hidden_state
    # a fixed random direction (the squares of a LayerNorm's output would sum to a near constant)
    direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device)
    (out * direction).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("shared_input", [False, True])
def test_a_model_with_fused_lora_dropout_trains_as_peft_with_those_masks(device, shared_input, monkeypatch):
    model = tiny_lora_bert().to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    assert fastpath.fuse_lora_dropout(model, shared_input=shared_input) == 2 * 3
    assert fastpath.fuse_lora_dropout(model, shared_input=shared_input) == 0
    draws = recorded_draws(monkeypatch, "lora_linears" if shared_input else "lora_linear")
    other = recorded_draws(monkeypatch, "lora_linear" if shared_input else "lora_linears")
    out, grads = step(model, ids)
    assert len(draws) == 2 * 3 and not other  # every LoRA layer went through the kernels: one call an attention

    # PEFT's own layers, each dropout drawing the mask its kernel drew
    fastpath.restore(model)
    for module in model.modules():
        if hasattr(module, "lora_dropout"):
            module.lora_dropout["default"] = MaskedDropout(draws, 0.1)
    ref_out, ref_grads = step(model, ids)
    assert not draws
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and any("embeddings" in name for name in grads)
    for name in ref_grads:
        assert grads[name].abs().max() > 1e-3, name
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5 * float(ref_grads[name].abs().max()))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_model_with_triton_residual_norms_trains_as_its_modules_with_those_masks(device, monkeypatch):
    model = tiny_lora_bert(lora_dropout=0.0, hidden_dropout=0.1).to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    assert fastpath.fuse_residual_norms(model, device, "k", kernel="triton") == 2 * 2
    original = kernels.dropout_add_norm
    draws = recorded_draws(monkeypatch, "dropout_add_norm")
    out, grads = step(model, ids)
    assert len(draws) == 2 * 2  # each layer's attention output and feed-forward output

    assert fastpath.fuse_residual_norms(model, device, "k", on=False) == 4
    for module in model.modules():
        if type(module).__name__ in ("BertSelfOutput", "BertOutput"):
            module.dropout = MaskedDropout(draws, 0.1)
    ref_out, ref_grads = step(model, ids)
    assert not draws
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert ref_grads[name].abs().max() > 1e-3, name
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5 * float(ref_grads[name].abs().max()))

    # evaluation without gradients, or a norm that trains: the modules' own ops, and the same outputs
    calls = []
    monkeypatch.setattr(kernels, "dropout_add_norm", lambda *args: calls.append(1) or original(*args))
    fastpath.fuse_residual_norms(model, device, "k", kernel="triton")
    for module in model.modules():
        if isinstance(getattr(module, "dropout", None), MaskedDropout):
            module.dropout = nn.Dropout(0.1)
    model.eval()
    with torch.no_grad():
        fused_eval = model(input_ids=ids).last_hidden_state
    fastpath.fuse_residual_norms(model, device, "k", on=False)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).last_hidden_state, fused_eval, rtol=0, atol=0)
    model.train()
    fastpath.fuse_residual_norms(model, device, "k", kernel="triton")
    model.base_model.model.encoder.layer[0].output.LayerNorm.weight.requires_grad_(True)
    step(model, ids)
    assert len(calls) == 3  # the other three norms
    with pytest.raises(ValueError, match="kernel"):
        fastpath.fuse_residual_norms(model, device, "k", kernel="cuda")
    with pytest.raises(ValueError, match="compiled kind needs the device and the config key"):
        fastpath.fuse_residual_norms(model)
    assert fastpath.fuse_residual_norms(model, on=False) == 4
    assert fastpath.fuse_residual_norms(model, kernel="triton") == 4  # the Triton kind needs neither


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_both_kernels_under_bf16_autocast_with_the_bf16_stream_train_as_the_modules(device, monkeypatch):
    """The LA's GPU setting: bf16 autocast, the bf16 residual stream, both fusions, against the
    modules (PEFT's LoRA, the outputs' dropout, add and norm) drawing the kernels' masks."""
    model = tiny_lora_bert(lora_dropout=0.1, hidden_dropout=0.1).to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    fastpath.bf16_residual_stream(model)
    fastpath.fuse_lora_dropout(model)
    fastpath.fuse_residual_norms(model, device, "k", kernel="triton")
    lora_draws = recorded_draws(monkeypatch, "lora_linears")  # query, key and value: one call
    norm_draws = recorded_draws(monkeypatch, "dropout_add_norm")
    with torch.autocast(device, dtype=torch.bfloat16):
        out, grads = step(model, ids)
    assert out.dtype == torch.bfloat16 and len(lora_draws) == 6 and len(norm_draws) == 4

    fastpath.fuse_lora_dropout(model, False)
    fastpath.fuse_residual_norms(model, device, "k", on=False)
    for module in model.modules():
        if hasattr(module, "lora_dropout"):
            module.lora_dropout["default"] = MaskedDropout(lora_draws, 0.1)
        if type(module).__name__ in ("BertSelfOutput", "BertOutput"):
            module.dropout = MaskedDropout(norm_draws, 0.1)
    with torch.autocast(device, dtype=torch.bfloat16):
        ref_out, ref_grads = step(model, ids)
    assert not lora_draws and not norm_draws
    assert relative_error(out, ref_out) < 3e-2
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert relative_error(grads[name], ref_grads[name]) < 5e-2, name


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_fused_lora_dropout_stays_out_of_evaluation_and_can_be_undone(device, monkeypatch):
    model = tiny_lora_bert().to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    model.eval()
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
    fastpath.fuse_lora_dropout(model)
    calls = []
    original = kernels.lora_linears
    monkeypatch.setattr(kernels, "lora_linears", lambda x, layers, p: calls.extend([1] * len(layers))
                        or original(x, layers, p))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).last_hidden_state, before, rtol=0, atol=0)
    model.train()
    with torch.inference_mode():  # training mode in inference mode: the fast forward
        model(input_ids=ids)
    assert not calls
    with torch.no_grad():  # training mode without gradients (a reentrant checkpoint's first forward): the kernels
        model(input_ids=ids)
    assert len(calls) == 6
    step(model, ids)
    assert len(calls) == 12
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU without the interpreter: the fast forward
        step(model, ids)
        assert len(calls) == 12
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fastpath.fuse_lora_dropout(model, False) == 6
    step(model, ids)
    assert len(calls) == 12
    fastpath.fuse_lora_dropout(model)
    fastpath.restore(model)  # restore takes the marks with the fast forward
    assert not any("_modsent_lora_kernel" in vars(module) or "_modsent_lora_group" in vars(module)
                   for module in model.modules())


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_shared_input_groups_the_lora_layers_of_an_attention_and_runs_alone_what_differs(device, monkeypatch):
    """LoRA on query and value only: one call of lora_linears for the two; a sibling with another
    dropout probability: each layer alone (the kernels draw one threshold for a group)."""
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    model = tiny_lora_bert(targets=["query", "value"]).to(device)
    fastpath.speed_up(model)
    assert fastpath.fuse_lora_dropout(model) == 2 * 2
    groups = recorded_draws(monkeypatch, "lora_linears")
    alone = recorded_draws(monkeypatch, "lora_linear")
    step(model, ids)
    assert len(groups) == 2 * 2 and not alone

    layer = model.base_model.model.encoder.layer[0].attention.self.value
    layer.lora_dropout["default"].p = 0.2
    groups.clear()
    out, grads = step(model, ids)
    assert len(groups) == 2 and len(alone) == 2  # the second layer's pair as one call, the first's alone
    assert sum("lora_A" in name for name in grads) == 4
    assert all(grad.abs().max() > 0 for name, grad in grads.items() if "lora_A" in name)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_grouped_outputs_do_not_outlive_their_call(device, monkeypatch):
    """Outputs wait for their siblings only inside the attention's forward, and only for a call on
    the same input, unchanged: outside it (or after it raised) each layer runs alone, another or a
    changed input computes afresh, and fuse_lora_dropout(False) and restore remove the hooks."""
    model = tiny_lora_bert().to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    fastpath.fuse_lora_dropout(model)
    fastpath.fuse_lora_dropout(model)  # again: no second pair of hooks
    attention = model.base_model.model.encoder.layer[0].attention.self
    assert len(attention._forward_hooks) == 1 and len(attention._forward_pre_hooks) == 1
    group = attention.query.__dict__["_modsent_lora_group"][0]
    calls = recorded_draws(monkeypatch, "lora_linears")
    alone = recorded_draws(monkeypatch, "lora_linear")
    step(model, ids)
    assert len(calls) == 2 * 3 and not alone and group.pending is None and not group.open

    x = torch.randn(3, 9, 64, device=device, requires_grad=True)
    out = attention.key(x)  # outside the attention's forward: alone, nothing waits
    assert len(calls) == 6 and len(alone) == 1 and group.pending is None
    layer, (_, seed) = attention.key, alone[0]
    keep = kernels.dropout_mask((27, 64), 0.1, seed, device)
    want = kernels.reference(x, layer.lora_A["default"].weight, layer.lora_B["default"].weight,
                             layer.base_layer.weight, layer.base_layer.bias, layer.scaling["default"], 0.1, keep)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

    seen = []

    def probe(self, hidden_states, *args, **kwargs):  # the attention's projections, called inside its forward
        self.query(hidden_states)  # the group's three outputs: one call
        seen.append(len(calls))
        with torch.no_grad():
            hidden_states.add_(0.0)  # changed in place: the key's waiting output is stale
        self.key(hidden_states)
        seen.append(len(calls))
        self.value(hidden_states)  # taken from the key's call
        seen.append(len(calls))
        self.query(torch.randn_like(hidden_states))  # another input: afresh
        seen.append(len(calls))
        raise RuntimeError("stopped inside the attention")

    original = type(attention).forward
    monkeypatch.setattr(type(attention), "forward", probe)
    with pytest.raises(RuntimeError, match="stopped inside"):
        attention(x.detach().clone())
    monkeypatch.setattr(type(attention), "forward", original)
    assert seen == [9, 12, 12, 15] and len(alone) == 1
    assert not group.open and group.pending is None  # the hook after the forward ran though it raised
    attention.value(x)
    assert len(alone) == 2

    assert fastpath.fuse_lora_dropout(model, False) == 6
    assert not attention._forward_hooks and not attention._forward_pre_hooks
    fastpath.fuse_lora_dropout(model)
    assert len(attention._forward_hooks) == 1 and "_modsent_lora_group" in vars(attention.value)
    fastpath.restore(model)
    assert not attention._forward_hooks and not attention._forward_pre_hooks


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_wrapped_attention_is_grouped_once(device, monkeypatch):
    """PEFT wrapping the attention itself (a PeftModel forwards attribute lookups to the model it
    wraps): the group and its hooks are the attention's alone, however often the kernels are
    turned on, and its forward runs the three layers as one call."""

    class Projections(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(32, 32) for _ in range(3))

        def forward(self, x):
            return self.query(x) + self.key(x) + self.value(x)

    torch.manual_seed(0)
    model = get_peft_model(Projections(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                     target_modules=["query", "key", "value"])).to(device).train()
    fastpath.speed_up(model)
    for _ in range(3):
        fastpath.fuse_lora_dropout(model)
    attention = model.base_model.model
    hooks = {name: len(module._forward_hooks) + len(module._forward_pre_hooks)
             for name, module in (("peft", model), ("lora", model.base_model), ("attention", attention))}
    assert hooks == {"peft": 0, "lora": 0, "attention": 2}
    calls = recorded_draws(monkeypatch, "lora_linears")
    model(torch.randn(5, 32, device=device, requires_grad=True)).sum().backward()
    assert len(calls) == 3
    fastpath.restore(model)
    assert not attention._forward_hooks and not attention._forward_pre_hooks


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_an_adapter_on_some_of_the_projections_runs_with_the_kernels(device, monkeypatch):
    """A second adapter on the query only, made active: the key and value run without LoRA and
    the query alone through its kernel, as PEFT runs them (no group of adapters a layer lacks)."""
    model = tiny_lora_bert().to(device)
    model.add_adapter("q_only", LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["query"]))
    model.set_adapter("q_only")
    for name, param in model.named_parameters():
        if "lora_B.q_only" in name:
            nn.init.normal_(param, std=0.2)
    model.to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    fastpath.speed_up(model)
    fastpath.fuse_lora_dropout(model)
    alone = recorded_draws(monkeypatch, "lora_linear")
    groups = recorded_draws(monkeypatch, "lora_linears")
    out, grads = step(model, ids)
    assert len(alone) == 2 and not groups  # the query of each layer
    fastpath.restore(model)
    for module in model.modules():
        if hasattr(module, "lora_dropout") and "q_only" in module.lora_dropout:
            module.lora_dropout["q_only"] = MaskedDropout(alone, 0.1)
    ref_out, ref_grads = step(model, ids)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and sum("lora_A.q_only" in name for name in grads) == 2
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4,
                                   atol=1e-5 * float(ref_grads[name].abs().max()))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_reentrant_checkpointing_recomputes_the_kernels_masks(device, monkeypatch):
    """Reentrant activation checkpointing runs each layer's forward without gradients and again
    with them in the backward: both draw the same masks (the kernels take the first forward too),
    so the gradients are those of the step without checkpointing."""
    direction = torch.randn(3, 9, 64, generator=torch.Generator().manual_seed(2)).to(device)
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    calls = []
    for function in ("lora_linears", "dropout_add_norm"):
        original = getattr(kernels, function)
        monkeypatch.setattr(kernels, function,
                            lambda *a, _f=original, _n=function, **k: calls.append(_n) or _f(*a, **k))

    def run(checkpointing):
        model = tiny_lora_bert(hidden_dropout=0.1).to(device)
        fastpath.speed_up(model)
        fastpath.use_triton_kernels(model)
        if checkpointing:
            model.base_model.model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": True})
        calls.clear()
        torch.manual_seed(123)
        out = model(input_ids=ids).last_hidden_state
        (out * direction).sum().backward()
        return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, list(calls)

    out, grads, plain = run(False)
    ref_out, ref_grads, checkpointed = run(True)
    assert plain.count("lora_linears") == 2 and plain.count("dropout_add_norm") == 4
    assert checkpointed == plain + plain  # every kernel ran again in the backward
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    assert grads.keys() == ref_grads.keys() and sum("lora_A" in name for name in grads) == 6
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_compiled_model_with_the_kernels_traces_once(device):
    """Inside a compiled trace the layers run the fast forward: one graph, no recompilation for
    new inputs, no graph break (the grouping's hooks and checks leave nothing to guard on)."""
    model = tiny_lora_bert(hidden_dropout=0.1).to(device)
    fastpath.speed_up(model)
    fastpath.use_triton_kernels(model)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(model.base_model.model, backend=backend, fullgraph=True)
    try:
        for seed in range(3):
            ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(seed)).to(device)
            compiled(input_ids=ids).last_hidden_state.sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1


def test_frozen_base_and_probabilities_are_checked():
    x = torch.randn(4, 8)
    weight = torch.randn(6, 8, requires_grad=True)
    with pytest.raises(ValueError, match="frozen"):
        kernels.lora_linear(x, torch.randn(2, 8), torch.randn(6, 2), weight, None, 1.0, 0.1)
    with pytest.raises(ValueError, match="0 <= p < 1"):
        kernels._threshold(1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernels run compiled in the other tests")
def test_kernels_compile_for_a_hopper_gpu_without_spilling(tmp_path):
    """Off a GPU the interpreter runs the kernels as Python: Triton's compiler and ptxas check here
    that they also compile for an H100/H200, and that the default tiles spill no register and
    leave room for two programs a multiprocessor (<= 128 registers a thread at 256 threads)."""
    import json
    import os
    import subprocess
    import sys

    script = "import json; from modsent.training import kernels; print(json.dumps(kernels.hopper_report()))"
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert set(report) == {"down", "up", "down_qkv", "up_qkv", "mask", "norm_forward", "norm_backward", "ce_forward",
                           "ce_backward"}
    for name, figures in report.items():
        assert figures["spill_bytes"] == 0, (name, figures)
        assert 0 < figures["registers"] <= 128, (name, figures)
