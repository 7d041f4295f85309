"""modsent.training.optim: AdamW's parameter groups, fused on CUDA and foreach on the CPU."""

from types import SimpleNamespace

import pytest
import torch

from modsent.training.optim import adamw, step_options


def test_adamw_decays_matrices_only_and_runs_foreach_on_the_cpu():
    linear, norm = torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)
    params = [linear.weight, linear.bias, norm.weight, norm.bias]
    optimizer = adamw(params, 1e-3, 0.01)
    decay, no_decay = optimizer.param_groups
    assert [p.shape for p in decay["params"]] == [linear.weight.shape] and decay["weight_decay"] == 0.01
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    assert not optimizer.defaults.get("fused") and optimizer.defaults["foreach"] is True


def test_fused_on_cuda_and_foreach_on_the_cpu_only_when_every_parameter_is_a_float_there():
    def fake(cuda, floating=True, device=None):
        device = SimpleNamespace(type=device or ("cuda" if cuda else "cpu"))
        return SimpleNamespace(is_cuda=cuda, is_floating_point=lambda: floating, device=device)

    assert step_options([fake(True), fake(True)]) == {"fused": True}
    assert step_options([fake(True), fake(False)]) == {}  # mixed devices: PyTorch's default
    assert step_options([fake(True, floating=False)]) == {}
    assert step_options([]) == {}
    assert step_options(iter([fake(True)])) == {"fused": True}  # any iterable
    assert step_options([fake(False), fake(False)]) == {"foreach": True}
    assert step_options([fake(False), fake(False, floating=False)]) == {}
    assert step_options([fake(False, device="mps")]) == {}


def test_foreach_adamw_on_the_cpu_is_bit_identical_to_one_tensor_at_a_time():
    """The CPU's foreach update runs the same operations as PyTorch's CPU default over lists of
    tensors: four steps of adamw (two groups, decay on the matrices) against the same steps
    with foreach=False end at exactly the same parameters and moments."""
    shapes = [(300, 64), (64, 64), (64,), (7, 3, 5), (1,)]
    ends = []
    for foreach in (True, False):
        generator = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]
        optimizer = adamw(params, 1e-2, 0.01)
        if not foreach:  # the reference: one tensor at a time
            for group in optimizer.param_groups:
                group["foreach"] = False
        assert [group["foreach"] for group in optimizer.param_groups] == [foreach] * 2
        for _ in range(4):
            for param in params:
                param.grad = torch.randn(param.shape, generator=generator)
            optimizer.step()
        ends.append([param.detach().clone() for param in params]
                    + [optimizer.state[p][key].clone() for p in params for key in ("exp_avg", "exp_avg_sq")])
    assert not torch.equal(ends[0][0], torch.randn(shapes[0], generator=torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, b) for a, b in zip(*ends))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_fused_adamw_takes_the_same_steps_as_the_default(device):
    """The fused kernel is an implementation of the same update: three steps of both from the
    same start, with weight decay, end at the same parameters (to float32 rounding)."""
    torch.manual_seed(0)
    start = torch.randn(64, 32)
    grads = [torch.randn(64, 32) for _ in range(3)]
    ends = []
    for fused in (False, True):
        param = torch.nn.Parameter(start.clone().to(device))
        optimizer = torch.optim.AdamW([param], lr=1e-2, weight_decay=0.01, fused=fused)
        for grad in grads:
            param.grad = grad.to(device)
            optimizer.step()
        ends.append(param.detach().cpu())
    assert not torch.equal(ends[0], start)
    torch.testing.assert_close(ends[1], ends[0], rtol=1e-5, atol=1e-6)
