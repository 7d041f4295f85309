"""modsent.training.fastpath: the LoRA and frozen-Linear forwards compute what PEFT and autocast
compute, with the same parameters and saved adapters."""

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from torch import nn

from modsent.training import fastpath
from tiny_modules import inductor_draws_as_eager, needs_cpu_compiler


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
    # a fixed random direction: the squares of a LayerNorm's output sum to a near constant, whose
    # gradients would be rounding noise
    direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device)
    (out * direction).sum().backward()
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
        assert grads_peft[name].abs().max() > 1e-3, name
        torch.testing.assert_close(grads_fast[name], grads_peft[name], rtol=1e-5, atol=1e-6)
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
    from safetensors.torch import load_file

    reference = tiny_lora_bert()
    reference.save_pretrained(str(tmp_path / "peft"))
    model = tiny_lora_bert()
    fastpath.speed_up(model)
    train_step(model)  # forward and backward, no optimizer step: nothing may change
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_step(model)
    assert model.state_dict().keys() == reference.state_dict().keys()
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    model.save_pretrained(str(tmp_path / "fast"))
    assert sorted(p.name for p in (tmp_path / "fast").iterdir()) == ["README.md", "adapter_config.json",
                                                                     "adapter_model.safetensors"]
    saved, expected = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("fast", "peft"))
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)


@pytest.mark.parametrize("merge", ["merge_adapter", "merge_and_unload"])
def test_a_merge_after_autocast_forwards_uses_the_merged_weights(merge):
    """PEFT merges through .data, which keeps a tensor's version: the sped-up merge drops the
    cached casts, so the merged model computes base + LoRA, not the stale base."""
    ids, mask = batch()
    reference = tiny_lora_bert().eval()
    model = tiny_lora_bert().eval()
    fastpath.speed_up(model)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # the casts are cached now
        with reference.disable_adapter():
            base_only = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = getattr(reference, merge)()
        expected = (expected if merge == "merge_and_unload" else reference)(input_ids=ids, attention_mask=mask)
        merged = getattr(model, merge)()
        merged = (merged if merge == "merge_and_unload" else model)(input_ids=ids, attention_mask=mask)
    assert (expected.last_hidden_state - base_only).abs().max() > 0.1  # the adapter matters
    torch.testing.assert_close(merged.last_hidden_state, expected.last_hidden_state, rtol=0, atol=0)


def test_dropout_applies_under_autocast_in_training_only():
    model = tiny_lora_bert(targets=["query", "value"])
    fastpath.speed_up(model)
    ids, mask = batch()
    lora_dropouts = {id(d) for name, module in model.named_modules() if name.endswith("lora_dropout")
                     for d in module.values()}
    assert lora_dropouts
    for module in model.modules():  # the body's own dropout off: what remains is LoRA's
        if isinstance(module, nn.Dropout) and id(module) not in lora_dropouts:
            module.p = 0.0
    outputs = []
    for training, seed in [(True, 3), (True, 3), (True, 4), (False, 3)]:
        model.train(training)
        torch.manual_seed(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            outputs.append(model(input_ids=ids, attention_mask=mask).last_hidden_state)
    assert torch.equal(outputs[0], outputs[1])  # the same seed, the same masks
    assert not torch.equal(outputs[0], outputs[2]) and not torch.equal(outputs[0], outputs[3])


def test_lora_bias_and_inference_mode_fall_back_to_what_peft_computes():
    config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    model = get_peft_model(transformers.BertModel(config, add_pooling_layer=False),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["query"], lora_bias=True))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(param, std=0.5)
    ids, mask = batch()
    model.eval()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).last_hidden_state
        fastpath.speed_up(model)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, reference,
                                   rtol=0, atol=0)
    # casts made in inference mode are not kept: training afterwards still works
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)
        model.train()
        model(input_ids=ids, attention_mask=mask).last_hidden_state.float().sum().backward()
    assert all(p.grad is not None for name, p in model.named_parameters() if "lora_" in name)


def test_a_sped_up_model_compiles_into_one_graph_and_computes_what_autocast_computes():
    """Under torch.compile the frozen layers leave their casts to the compiler (the cache's
    bookkeeping would split the graph at every layer): one graph, no break, and the outputs of
    the eager fast path within bf16 rounding."""
    import torch._dynamo as dynamo

    model = tiny_lora_bert(dropout=0.0)
    fastpath.speed_up(model)
    model.eval()
    ids, mask = batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        dynamo.reset()
        explained = dynamo.explain(model)(input_ids=ids, attention_mask=mask)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
        compiled = torch.compile(model, backend="aot_eager")(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(compiled.float(), eager, rtol=2e-2, atol=2e-2)
    dynamo.reset()


def test_every_methods_compile_is_refused_without_a_compiler_before_it_reads_anything(tmp_path, monkeypatch):
    """Every training method of modsent (the recipes, the full-parameter methods) and the full
    baselines offer ``compile`` as a runtime setting; asked to compile where no compiler exists,
    each stops with an InputError naming its key before it reads an input (none exists here: a
    read would fail otherwise)."""
    import re

    from torch._inductor import cpp_builder

    from modsent import methods
    from modsent.config import fill_defaults
    from modsent.methods.launch import training_settings
    from modsent.io import InputError
    from modsent.methods import baselines as bl
    from modsent.schema import ROLE_KEY, RUNTIME

    def no_compiler():
        raise RuntimeError("no C++ compiler found (looked for g++)")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    registry = methods.load()
    names = sorted(registry)
    assert {"mST5-xnli", "DuEAM-weak", "MEXMA", "InteMATs", "InteMATs-ST"} <= set(names)
    for name in names:
        setting = registry[name].schema()["properties"].get("compile")
        assert setting is not None and setting["default"] is False and setting[ROLE_KEY] == RUNTIME, name
    missing = tmp_path / "missing"
    inputs = {"base": missing / "base", "pairs": {lang: missing / f"{lang}.parquet" for lang in ("en", "de")},
              "translations": {"de": missing / "de.tsv"}, "st": missing / "st", "dt": missing / "dt",
              "wmd": [missing / "wmd.parquet"]}
    for name in names:
        with pytest.raises(InputError, match=rf"^methods\.{re.escape(name)}\.compile: true, but torch.compile on the "
                                             r"CPU needs a C\+\+ compiler"):
            settings = training_settings(fill_defaults({"compile": True}, registry[name].schema()))  # the workflow's
            registry[name].train(inputs, tmp_path / name, settings, device="cpu", progress=False)
    with pytest.raises(InputError, match=r"^baselines\.compile: true, but .*set baselines\.compile: false"):
        bl.run_full_training("Full_en", missing / "base", inputs["pairs"], bl.FullTrainingConfig(compile=True),
                             device="cpu", progress=False)
    assert not missing.exists()


def test_attention_for_varying_shapes_leaves_cudnn_out_while_it_runs_and_gives_it_back():
    """PyTorch's cuDNN attention builds a plan per batch shape (about a second each on an H200):
    the stages whose shapes vary run SDPA without it, encoding passes too, and restore the
    process's setting afterwards, also when the work fails."""
    import numpy as np

    from modsent.training.loop import encode_in_batches

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with fastpath.attention_for_varying_shapes():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        with fastpath.attention_for_varying_shapes():  # nested: the outer block's setting stays
            pass
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(RuntimeError, match="boom"):
        with fastpath.attention_for_varying_shapes():
            raise RuntimeError("boom")
    assert torch.backends.cuda.cudnn_sdp_enabled()

    seen = []

    def forward(texts):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return torch.tensor([[float(len(t)), 1.0] for t in texts])

    sentences = ["a", "ccc", "bb", "dddd", "e"]
    vectors = encode_in_batches(sentences, 2, lambda texts: texts, forward, normalize=False)
    np.testing.assert_array_equal(vectors[:, 0], [len(s) for s in sentences])
    assert seen == [False] * 3 and torch.backends.cuda.cudnn_sdp_enabled()


def test_attention_for_varying_shapes_overlapping_on_two_threads_gives_the_setting_back():
    """The setting is process-wide: A enters, B enters, A leaves (B still runs: still off), B
    leaves (back on). Saving and restoring per block would leave it off for good."""
    import threading

    entered, a_left, b_may_leave = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def b():
        with fastpath.attention_for_varying_shapes():
            entered.set()
            assert a_left.wait(timeout=10)
            seen["B, after A left"] = torch.backends.cuda.cudnn_sdp_enabled()
            assert b_may_leave.wait(timeout=10)

    assert torch.backends.cuda.cudnn_sdp_enabled()
    thread = threading.Thread(target=b)
    with fastpath.attention_for_varying_shapes():
        thread.start()
        assert entered.wait(timeout=10)
    a_left.set()
    b_may_leave.set()
    thread.join(timeout=10)
    assert seen == {"B, after A left": False}
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)  # a process that had it off keeps it off
    try:
        with fastpath.attention_for_varying_shapes():
            pass
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_a_bf16_residual_stream_returns_bf16_layernorms_under_bf16_autocast_only_and_stays_close():
    """language_adapter.residual_stream: bf16. Under bf16 autocast every LayerNorm returns bf16
    (autocast's returns fp32), the loss and LoRA's gradients stay within bf16 rounding of
    autocast's; without bf16 autocast the model computes exactly what it computed, and undoing
    it restores autocast's own forward."""
    model = tiny_lora_bert(dropout=0.0)
    model.eval()  # no dropout draws: the runs differ by their arithmetic alone
    ids, mask = batch()
    target = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(2))  # a loss LayerNorm cannot flatten
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    dtypes = []
    hooks = [m.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype)) for m in norms]

    def run(autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            loss = (out.float() * target).mean()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for n, p in model.named_parameters() if "lora_" in n])
        model.zero_grad(set_to_none=True)
        return out.detach().float(), loss.detach(), grads

    plain_out, plain_loss, plain_grads = run(False)
    auto_out, auto_loss, auto_grads = run(True)
    assert set(dtypes) == {torch.float32}
    dtypes.clear()

    assert fastpath.bf16_residual_stream(model) == len(norms) == 5  # embeddings + 2 per layer
    assert fastpath.bf16_residual_stream(model) == 0  # already so: nothing changed
    low_out, low_loss, low_grads = run(True)
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) == len(norms)
    assert torch.allclose(low_loss, auto_loss, rtol=1e-2)
    assert (low_out - auto_out).norm() / auto_out.norm() < 2e-2  # 0.5% here: bf16 rounding
    assert torch.nn.functional.cosine_similarity(low_grads, auto_grads, dim=0) > 0.999
    assert not torch.equal(low_out, auto_out)  # it did change the numerics
    dtypes.clear()
    same_out, same_loss, same_grads = run(False)  # fp32: nothing changes
    assert set(dtypes) == {torch.float32}
    assert torch.equal(same_out, plain_out) and torch.equal(same_loss, plain_loss)
    assert torch.equal(same_grads, plain_grads)

    assert fastpath.bf16_residual_stream(model, on=False) == 5
    assert fastpath.bf16_residual_stream(model, on=False) == 0
    dtypes.clear()
    back_out, back_loss, back_grads = run(True)
    assert set(dtypes) == {torch.float32}
    assert torch.equal(back_out, auto_out) and torch.equal(back_grads, auto_grads)
    for hook in hooks:
        hook.remove()


def test_attention_outside_the_graph_breaks_it_at_each_attention_and_trains_the_same():
    """fastpath.attention_outside_graph: eager runs are the "sdpa" model's, bit for bit; compiled,
    the encoder breaks its graph at each layer's attention call (which runs eagerly) and computes
    the same outputs and gradients; undone, the model is "sdpa" again and traces into one graph."""
    import torch._dynamo as dynamo

    model = tiny_lora_bert(dropout=0.0)
    fastpath.speed_up(model)
    out_sdpa, grads_sdpa = train_step(model)
    assert fastpath.attention_outside_graph(model) and not fastpath.attention_outside_graph(model)
    assert model.config._attn_implementation == "modsent_sdpa_outside_graph"
    # the stages' host-side mask treats it as "sdpa": no mask without padding, the 4D mask with it
    from modsent.tokenizing import encoder_attention_mask

    ones, padded = torch.ones(2, 5, dtype=torch.long), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert encoder_attention_mask(model.config, ones, ones) is None
    assert encoder_attention_mask(model.config, padded, padded).shape == (2, 1, 1, 5)
    out_eager, grads_eager = train_step(model)
    torch.testing.assert_close(out_eager, out_sdpa, rtol=0, atol=0)
    for name, grad in grads_sdpa.items():
        torch.testing.assert_close(grads_eager[name], grad, rtol=0, atol=0)

    ids, mask = batch()
    dynamo.reset()
    try:
        explained = dynamo.explain(model)(input_ids=ids, attention_mask=mask)
        # each layer's attention call breaks the graph (and so each module frame around it): no other break
        reasons = [reason.reason for reason in explained.break_reasons]
        assert explained.graph_break_count >= model.config.num_hidden_layers, reasons
        assert all("torch.compiler.disable" in reason for reason in reasons), reasons
        compiled = torch.compile(model, backend="aot_eager")
        out_compiled, grads_compiled = train_step(compiled)
        torch.testing.assert_close(out_compiled, out_sdpa, rtol=1e-5, atol=1e-5)
        grads_compiled = {name.removeprefix("_orig_mod."): grad for name, grad in grads_compiled.items()}
        assert grads_compiled.keys() == grads_sdpa.keys()
        for name, grad in grads_sdpa.items():
            torch.testing.assert_close(grads_compiled[name], grad, rtol=1e-4, atol=1e-5)
        assert fastpath.attention_outside_graph(model, False) and model.config._attn_implementation == "sdpa"
        dynamo.reset()
        assert dynamo.explain(model)(input_ids=ids, attention_mask=mask).graph_break_count == 0
    finally:
        dynamo.reset()


def weighted_step(model, device="cpu", seed=7, autocast=False):
    """A training-mode step whose loss LayerNorm cannot flatten (a fixed random weighting of the
    output): the output and every gradient."""
    ids, mask = (t.to(device) for t in batch())
    model.train()
    torch.manual_seed(seed)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    (out.float() * weight).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def assert_close_grads(grads, reference, share):
    assert grads.keys() == reference.keys() and grads
    for name, grad in reference.items():
        assert (grads[name] - grad).abs().max() <= share * grad.abs().max(), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("targets", ["all-linear", ["dense"]])
def test_fused_projections_compute_query_key_and_value_in_one_product(device, targets, monkeypatch):
    """fastpath.fuse_projections: one product of the input by the three frozen weights side by side
    per attention (LoRA base layers or plain frozen Linears), the same outputs and gradients as
    three products; a merge, a trained projection or inference mode computes alone; undone, three."""
    model = tiny_lora_bert(targets=targets).to(device)
    fastpath.speed_up(model)
    out_fp32, grads_fp32 = weighted_step(model, device)
    out_bf16, grads_bf16 = weighted_step(model, device, autocast=True)
    assert fastpath.fuse_projections(model) == 2 and fastpath.fuse_projections(model) == 0
    widths = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: widths.append(w.shape[0]) or linear(x, w, b))
    out, grads = weighted_step(model, device)
    assert widths.count(96) == 2  # one product of width 3 x 32 per layer
    torch.testing.assert_close(out, out_fp32, rtol=1e-5, atol=1e-5)
    assert_close_grads(grads, grads_fp32, 1e-5)
    widths.clear()
    out, grads = weighted_step(model, device, autocast=True)
    assert widths.count(96) == 2
    assert (out.float() - out_bf16.float()).abs().max() <= 0.02 * out_bf16.float().abs().max()
    assert_close_grads(grads, grads_bf16, 0.05)
    widths.clear()
    with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16):  # computes alone
        model(input_ids=batch()[0].to(device))
    assert 96 not in widths
    monkeypatch.undo()

    attention = model.base_model.model.encoder.layer[0].attention.self
    if targets == "all-linear":  # a merged adapter: the merged weights, in the product of three
        attention.query.merge()
        merged, _ = weighted_step(model, device)
        fastpath.fuse_projections(model, on=False)
        torch.testing.assert_close(weighted_step(model, device)[0], merged, rtol=1e-5, atol=1e-5)
        attention.query.unmerge()
        fastpath.fuse_projections(model)
    key = attention.key.base_layer if targets == "all-linear" else attention.key
    key.weight.requires_grad_(True)  # a trained projection: each of the three alone, its gradient reached
    out, grads = weighted_step(model, device)
    torch.testing.assert_close(out, out_fp32, rtol=1e-5, atol=1e-5)
    assert grads[next(n for n, p in model.named_parameters() if p is key.weight)].abs().sum() > 0
    key.weight.requires_grad_(False)
    assert fastpath.fuse_projections(model, on=False) == 2
    assert all("_modsent_group" not in vars(m) for m in model.modules())


@needs_cpu_compiler
def test_fused_residual_norms_compile_dropout_add_and_layernorm_and_compute_what_the_modules_do():
    """fastpath.fuse_residual_norms: each attention output and feed-forward output runs its
    dropout, residual add and LayerNorm as one compiled function; with eager's dropout draws
    (fallback_random) the outputs and gradients equal the modules' (fp32) or stay within bf16
    rounding (autocast, the bf16 stream), in the dtypes the modules return; undone, the modules'."""
    torch._dynamo.reset()  # the compiled function's graphs of other tests
    model = tiny_lora_bert()
    fastpath.speed_up(model)
    layer = model.base_model.model.encoder.layer[0].attention  # its output: dense 32 -> 32
    x, residual = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    for stream in (False, True):
        fastpath.bf16_residual_stream(model, stream)
        reference = {mode: weighted_step(model, autocast=mode) for mode in (False, True)}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dtype = layer.output(x, residual).dtype
        assert fastpath.fuse_residual_norms(model, "cpu", "key") == 4  # 2 layers x (attention, feed-forward)
        assert fastpath.fuse_residual_norms(model, "cpu", "key") == 0
        assert layer.output.forward.__func__ is fastpath._fused_output_forward
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer.output(x, residual).dtype == dtype == (torch.bfloat16 if stream else torch.float32)
        with inductor_draws_as_eager():
            for autocast, (out_ref, grads_ref) in reference.items():
                out, grads = weighted_step(model, autocast=autocast)
                assert out.dtype == out_ref.dtype
                if autocast:
                    assert (out.float() - out_ref.float()).abs().max() <= 0.02 * out_ref.float().abs().max()
                    assert_close_grads(grads, grads_ref, 0.05)
                else:
                    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
                    assert_close_grads(grads, grads_ref, 1e-5)
        assert fastpath.fuse_residual_norms(model, "cpu", "key", on=False) == 4
        assert "forward" not in vars(layer.output)
    # the dropout is on in training and off in evaluation, as the module's
    fastpath.bf16_residual_stream(model, False)
    fastpath.fuse_residual_norms(model, "cpu", "key")
    layer.output.train()
    assert not torch.equal(layer.output(x, residual), layer.output(x, residual))
    layer.output.eval()
    expected = layer.output.LayerNorm(layer.output.dense(x) + residual)
    torch.testing.assert_close(layer.output(x, residual), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # without gradients: the module's own ops, nothing compiled
        torch._dynamo.utils.counters.clear()
        torch.testing.assert_close(layer.output(x, residual), expected, rtol=0, atol=0)
        assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]
