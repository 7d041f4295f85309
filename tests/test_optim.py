"""modsent.training.optim: AdamW's parameter groups and the fused implementation on CUDA."""

from types import SimpleNamespace

import pytest
import torch

from modsent.training.optim import adamw, fused_options


def test_adamw_decays_matrices_only_and_stays_unfused_on_the_cpu():
    linear, norm = torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)
    params = [linear.weight, linear.bias, norm.weight, norm.bias]
    optimizer = adamw(params, 1e-3, 0.01)
    decay, no_decay = optimizer.param_groups
    assert [p.shape for p in decay["params"]] == [linear.weight.shape] and decay["weight_decay"] == 0.01
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    assert not optimizer.defaults.get("fused")  # CPU runs keep the default (foreach) arithmetic


def test_fused_only_when_every_parameter_is_a_floating_cuda_tensor():
    def fake(cuda, floating=True):
        return SimpleNamespace(is_cuda=cuda, is_floating_point=lambda: floating)

    assert fused_options([fake(True), fake(True)]) == {"fused": True}
    assert fused_options([fake(True), fake(False)]) == {}
    assert fused_options([fake(True, floating=False)]) == {}
    assert fused_options([]) == {}
    assert fused_options(iter([fake(True)])) == {"fused": True}  # any iterable


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
