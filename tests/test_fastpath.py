"""modsent.training.fastpath: the LoRA and frozen-Linear forwards compute what PEFT and autocast
compute, with the same parameters and saved adapters."""

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from torch import nn

from modsent.training import fastpath


def tiny_lora_bert(dropout=0.1, targets="all-linear"):
    config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    model = get_peft_model(transformers.BertModel(config, add_pooling_layer=False),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: make the branch count
            nn.init.normal_(param, std=0.2)
    return model


def batch():
    ids = torch.randint(5, 300, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    return ids, mask


def train_step(model, seed=7):
    """One training-mode forward (dropout on) and backward: the output and every gradient."""
    ids, mask = batch()
    model.train()
    torch.manual_seed(seed)
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    out.pow(2).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_fast_lora_equals_peft_in_fp32_with_dropout_and_gradients():
    model = tiny_lora_bert()
    out_peft, grads_peft = train_step(model)
    lora_layers = 2 * 6  # query, key, value, attention output, intermediate, output per layer
    assert fastpath.speed_up(model) == 2 * lora_layers  # each LoRA layer and its frozen base
    assert fastpath.speed_up(model) == 0  # idempotent
    out_fast, grads_fast = train_step(model)
    assert grads_fast.keys() == grads_peft.keys() and len(grads_fast) == 2 * lora_layers
    torch.testing.assert_close(out_fast, out_peft, rtol=1e-6, atol=1e-6)
    for name in grads_peft:
        torch.testing.assert_close(grads_fast[name], grads_peft[name], rtol=1e-5, atol=1e-7)
    # the same dropout masks: another seed gives another output
    assert (train_step(model, seed=8)[0] - out_fast).abs().max() > 1e-3
    fastpath.restore(model)
    assert "forward" not in vars(model.base_model.model.encoder.layer[0].attention.self.query)
    torch.testing.assert_close(train_step(model)[0], out_peft, rtol=0, atol=0)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_fast_lora_under_bf16_autocast_stays_within_bf16_rounding(device):
    model = tiny_lora_bert().to(device)
    ids, mask = (t.to(device) for t in batch())
    model.eval()
    with torch.autocast(device, dtype=torch.bfloat16), torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        fastpath.speed_up(model)
        fast = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert fast.dtype == torch.float32  # BERT's last LayerNorm runs in fp32 under autocast
    assert (fast - reference).abs().max() < 0.02 * reference.abs().max()
    # and the model trains under autocast: gradients reach every LoRA matrix in fp32
    model.train()
    with torch.autocast(device, dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask).last_hidden_state.float().pow(2).mean().backward()
    grads = [p.grad for name, p in model.named_parameters() if "lora_" in name]
    assert grads and all(g is not None and g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("device", DEVICES)
def test_frozen_linear_keeps_one_cast_copy_and_equals_autocast_bit_for_bit(device):
    torch.manual_seed(0)
    linear = nn.Linear(16, 8).requires_grad_(False).to(device)
    x = torch.randn(5, 16).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        reference = linear(x)
        fastpath.speed_up(linear)
        fast = linear(x)
        cached = linear.__dict__["_modsent_cast"][1][0]
        linear(x)
        assert linear.__dict__["_modsent_cast"][1][0] is cached  # cast once, not per call
    assert fast.dtype == reference.dtype == torch.bfloat16
    assert torch.equal(fast, reference)
    with torch.no_grad():  # a changed weight (a merge, a load) is cast again
        linear.weight.mul_(2)
    with torch.autocast(device, dtype=torch.bfloat16):
        assert torch.equal(linear(x), nn.functional.linear(x, linear.weight, linear.bias))
    assert torch.equal(linear(x), nn.functional.linear(x, linear.weight, linear.bias))  # no autocast: fp32
    # a trainable Linear is not cached: autocast's own (cached-for-leaves) cast applies
    linear.weight.requires_grad_(True)
    with torch.autocast(device, dtype=torch.bfloat16):
        linear(x).float().sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("case", ["merged", "disabled", "no dropout"])
def test_other_lora_states_go_through_peft_or_agree_with_it(case):
    model = tiny_lora_bert(dropout=0.0 if case == "no dropout" else 0.1)
    ids, mask = batch()
    model.eval()
    fastpath.speed_up(model)
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).last_hidden_state
        fastpath.restore(model)
        if case == "merged":
            model.merge_adapter()
        if case == "disabled":
            with model.disable_adapter():
                reference = model(input_ids=ids, attention_mask=mask).last_hidden_state
                fastpath.speed_up(model)
                torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state,
                                           reference, rtol=0, atol=0)
            assert (reference - fast).abs().max() > 1e-3  # the adapter's effect was in `fast`
            return
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state
        fastpath.speed_up(model)
        again = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, reference, rtol=1e-5, atol=1e-5)


def test_saved_adapter_is_unchanged(tmp_path):
    model = tiny_lora_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fastpath.speed_up(model)
    train_step(model)
    assert model.state_dict().keys() == before.keys()
    model.save_pretrained(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "adapter_config.json",
                                                          "adapter_model.safetensors"]
