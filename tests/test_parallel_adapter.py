"""The parallel (CLA) adapter: placement and forward math, identity at init, what trains,
adapter directories (round trip, refusal on another base), and weight-averaging merges.

Every check runs on the tiny random encoders of modsent.testing, in BERT (LaBSE) and XLM-R (mE5)
shape, held three ways: the bare transformers model, a PEFT LoRA model around it (as the
language's LA+SE model is held), and a SentenceTransformer (``st[0].auto_model``)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from modsent.modular import parallel_adapter as pa
from modsent.io import InputError
from modsent.testing import make_tiny_bert, make_tiny_xlmr, sample_texts
from modsent.training.seeding import private_cpu_stream

ARCHS = ("bert", "xlmr")
HOLDERS = ("plain", "peft", "st")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return sample_texts(300)


@pytest.fixture(scope="module")
def bases(tmp_path_factory, texts) -> dict:
    root = tmp_path_factory.mktemp("pa")
    return {
        "bert": make_tiny_bert(root / "bert", texts),
        "xlmr": make_tiny_xlmr(root / "xlmr", texts),
        "bert-seed1": make_tiny_bert(root / "bert-seed1", texts, seed=1),  # same shapes, other weights
        "bert-h48": make_tiny_bert(root / "bert-h48", texts, hidden=48),
    }


def load(holder: str, directory):
    """(model, embed): ``embed(texts)`` runs the model with autograd on (hidden states, or
    sentence embeddings for a SentenceTransformer)."""
    import transformers

    if holder == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(directory), device="cpu").eval()
        return st, lambda batch: st(st.preprocess(batch))["sentence_embedding"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    transformers.logging.set_verbosity_error()  # "unexpected MLM head weights" is expected
    model = transformers.AutoModel.from_pretrained(str(directory))
    transformers.logging.set_verbosity_warning()
    if holder == "peft":
        from peft import LoraConfig, get_peft_model

        with private_cpu_stream(0):  # random (non-zero) LoRA B: the LoRA is active, as a trained SE is
            model = get_peft_model(model, LoraConfig(
                r=4, lora_alpha=8, target_modules=["query", "key", "value", "dense"], init_lora_weights=False))
    model.eval()
    return model, lambda batch: model(**tokenizer(batch, padding=True, return_tensors="pt")).last_hidden_state


def randomise(model, seed: int, std: float = 0.1) -> None:
    """Non-zero adapter weights, as after training."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for adapter in pa.parallel_adapters(model).values():
            for param in adapter.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def embed_no_grad(embed, batch):
    with torch.no_grad():
        return embed(batch)


# ---- config ------------------------------------------------------------------------------------


def test_config_defaults_json_round_trip_and_errors():
    default = pa.ParallelAdapterConfig()
    # the paper's code: adapters' ParBnConfig() = reduction factor 2, scaling 4, ReLU, dropout 0
    assert (default.reduction_factor, default.scaling, default.dropout, default.layers) == (2.0, 4.0, 0.0, None)
    assert default.bottleneck(768) == 384 and default.bottleneck(32) == 16
    assert pa.ParallelAdapterConfig(bottleneck_size=64).bottleneck(768) == 64

    custom = pa.ParallelAdapterConfig(reduction_factor=4, scaling=2, dropout=0.1, layers=[3, 1])
    assert custom.layers == (1, 3)
    again = pa.ParallelAdapterConfig.from_dict(json.loads(json.dumps(custom.to_dict())))
    assert again == custom and again.to_dict() == custom.to_dict()
    assert pa.ParallelAdapterConfig.from_dict({}) == default

    with pytest.raises(InputError, match="unknown key.*bottleneck.*allowed: reduction_factor"):
        pa.ParallelAdapterConfig.from_dict({"bottleneck": 64})
    for bad in ({"reduction_factor": 0}, {"bottleneck_size": 0}, {"bottleneck_size": 1.5},
                {"scaling": float("nan")}, {"dropout": 1.0}, {"layers": []}, {"layers": [1, 1]},
                {"layers": [-1]}, {"layers": "all"}):
        with pytest.raises(InputError, match=next(iter(bad))):
            pa.ParallelAdapterConfig(**bad)


# ---- placement and forward math -----------------------------------------------------------------


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_adapters_change_nothing_and_removal_restores(bases, texts, arch, holder):
    model, embed = load(holder, bases[arch])
    batch = texts[:6]
    before = embed_no_grad(embed, batch)
    keys_before = list(model.state_dict())

    pa.add_parallel_adapters(model)
    adapters = pa.parallel_adapters(model)
    assert sorted(adapters) == [0, 1]
    for adapter in adapters.values():
        assert adapter.down.weight.shape == (16, 32)  # hidden 32 // reduction factor 2
        assert not adapter.up.weight.any() and not adapter.up.bias.any() and adapter.down.weight.any()
    assert torch.equal(embed_no_grad(embed, batch), before)  # bit-identical

    # the adapter is really on the forward path: a non-zero one changes the output (not by a
    # constant: LayerNorm would remove a shift shared by all hidden units)
    with torch.no_grad():
        adapters[1].up.bias.copy_(torch.linspace(-1, 1, 32))
    assert not torch.allclose(embed_no_grad(embed, batch), before)

    pa.remove_parallel_adapters(model)
    assert pa.parallel_adapters(model) == {}
    assert list(model.state_dict()) == keys_before
    assert all(not layer.output._forward_pre_hooks for layer in pa._encoder(model).encoder.layer)
    assert torch.equal(embed_no_grad(embed, batch), before)


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_each_layer_computes_layernorm_of_ffn_plus_scaled_adapter_plus_residual(bases, texts, arch, holder):
    model, embed = load(holder, bases[arch])
    config = pa.ParallelAdapterConfig(scaling=4.0)
    pa.add_parallel_adapters(model, config)
    randomise(model, seed=3)
    layers = pa._encoder(model).encoder.layer
    seen = {}  # layer index -> (FFN block input h = attention output, layer output)
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.attention.register_forward_hook(
            lambda module, args, output, i=i: seen.setdefault(i, [None, None]).__setitem__(0, output[0])))
        handles.append(layer.register_forward_hook(
            lambda module, args, output, i=i: seen[i].__setitem__(1, output[0] if isinstance(output, tuple) else output)))
    embed_no_grad(embed, texts[:4])
    for handle in handles:
        handle.remove()

    adapters = pa.parallel_adapters(model)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            h, actual = seen[i]
            out, adapter = layer.output, adapters[i]
            ffn = out.dense(layer.intermediate(h))  # the layer's own FFN (LoRA included under PEFT)
            parallel = config.scaling * F.linear(torch.relu(F.linear(h, adapter.down.weight, adapter.down.bias)),
                                                 adapter.up.weight, adapter.up.bias)
            norm = out.LayerNorm
            expected = F.layer_norm(ffn + parallel + h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
            without = F.layer_norm(ffn + h, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
            assert (actual - without).abs().max() > 1e-2  # the adapter's share is not negligible


def test_layer_selection_dropout_and_misuse(bases):
    model, _ = load("plain", bases["bert"])
    pa.add_parallel_adapters(model, pa.ParallelAdapterConfig(layers=[1], dropout=0.2))
    assert list(pa.parallel_adapters(model)) == [1]
    assert pa.parallel_adapters(model)[1].dropout.p == 0.2
    assert not pa.parallel_adapters(model)[1].training  # follows the model's eval mode
    with pytest.raises(ValueError, match="already has parallel adapters"):
        pa.add_parallel_adapters(model)
    pa.remove_parallel_adapters(model)
    with pytest.raises(InputError, match=r"layers \[5\] do not exist.*2 layers"):
        pa.add_parallel_adapters(model, pa.ParallelAdapterConfig(layers=[0, 5]))
    assert pa.parallel_adapters(model) == {}  # nothing inserted when a layer is missing
    with pytest.raises(ValueError, match="no parallel adapters"):
        pa.freeze_all_but_adapters(model)
    with pytest.raises(TypeError, match="BERT-like encoder"):
        pa.add_parallel_adapters(torch.nn.Linear(2, 2))


def test_a_deep_copy_has_its_own_adapters(bases, texts):
    model, embed = load("plain", bases["xlmr"])
    pa.add_parallel_adapters(model)
    before = embed_no_grad(embed, texts[:3])
    clone = copy.deepcopy(model)
    with torch.no_grad():
        pa.parallel_adapters(clone)[0].up.bias.copy_(torch.linspace(-1, 1, 32))
    assert torch.equal(embed_no_grad(embed, texts[:3]), before)
    batch = _tok(bases["xlmr"])(texts[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert not torch.allclose(clone(**batch).last_hidden_state, before)  # the clone's hook uses the clone's adapter
    pa.remove_parallel_adapters(clone)
    assert sorted(pa.parallel_adapters(model)) == [0, 1] and pa.parallel_adapters(clone) == {}
    with torch.no_grad():
        assert torch.equal(clone(**batch).last_hidden_state, before)


# ---- training --------------------------------------------------------------------------------------


@pytest.mark.parametrize("holder", ["peft", "st"])
@pytest.mark.parametrize("arch", ARCHS)
def test_only_adapter_weights_train(bases, texts, arch, holder):
    model, embed = load(holder, bases[arch])
    pa.add_parallel_adapters(model)
    pa.freeze_all_but_adapters(model)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * 4 and all(".parallel_adapter." in name for name in trainable)

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    target = torch.randn(embed_no_grad(embed, texts[:4]).shape, generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # two steps: the zero up-projection blocks the down-projection's gradient at first
        loss = (embed(texts[:4]) - target).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, p in model.named_parameters():
        if ".parallel_adapter." in name:
            assert not torch.equal(p, before[name]), f"{name} did not train"
        else:
            assert torch.equal(p, before[name]), f"{name} changed"
            assert p.grad is None


# ---- adapter directories ------------------------------------------------------------------------------


def test_the_base_identity_does_not_depend_on_how_the_model_is_held(bases):
    identities = [pa.base_model_identity(load(holder, bases["bert"])[0]) for holder in HOLDERS]
    assert identities[0] == identities[1] == identities[2]
    assert identities[0]["hidden_size"] == 32 and identities[0]["num_hidden_layers"] == 2

    model, _ = load("peft", bases["bert"])
    merged = model.merge_and_unload()  # LoRA folded into the weights: still the same base
    assert pa.base_model_identity(merged)["fingerprint"] == identities[0]["fingerprint"]
    assert pa.base_model_identity(merged.to(torch.bfloat16))["fingerprint"] == identities[0]["fingerprint"]
    other = pa.base_model_identity(load("plain", bases["bert-seed1"])[0])
    assert other["fingerprint"] != identities[0]["fingerprint"]


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_give_identical_embeddings(bases, texts, tmp_path, arch, holder):
    model, embed = load(holder, bases[arch])
    config = pa.ParallelAdapterConfig(reduction_factor=4, scaling=2.0)
    pa.add_parallel_adapters(model, config)
    randomise(model, seed=1)
    expected = embed_no_grad(embed, texts[:8])

    out = pa.save_parallel_adapters(model, tmp_path / "cla", metadata={"language": "de", "objective": "pp"})
    assert sorted(p.name for p in out.iterdir()) == sorted([pa.CONFIG_NAME, pa.WEIGHTS_NAME])
    record = json.loads((out / pa.CONFIG_NAME).read_text(encoding="utf-8"))
    assert record["config"] == config.to_dict() and record["metadata"] == {"language": "de", "objective": "pp"}
    assert record["base_model"] == pa.base_model_identity(model)
    assert load_file(str(out / pa.WEIGHTS_NAME))["layers.1.down.weight"].shape == (8, 32)

    fresh, fresh_embed = load(holder, bases[arch])
    assert pa.load_parallel_adapters(fresh, out) is fresh
    assert pa.parallel_adapters(fresh)[0].scaling == 2.0
    assert torch.equal(embed_no_grad(fresh_embed, texts[:8]), expected)


def test_loading_onto_another_base_is_refused(bases, texts, tmp_path):
    model, _ = load("plain", bases["bert"])
    pa.add_parallel_adapters(model)
    saved = pa.save_parallel_adapters(model, tmp_path / "cla-bert")

    for other, reason in (("bert-seed1", "fingerprint"), ("bert-h48", "hidden_size"), ("xlmr", "model_type")):
        target, embed = load("plain", bases[other])
        before = embed_no_grad(embed, texts[:3])
        with pytest.raises(InputError, match=rf"cla-bert: an adapter trained on another base model.*{reason}"):
            pa.load_parallel_adapters(target, saved)
        assert pa.parallel_adapters(target) == {}
        assert torch.equal(embed_no_grad(embed, texts[:3]), before)

    # the config claims the right base, but the tensors are of another shape: refused, rolled back
    pa.remove_parallel_adapters(model)
    pa.add_parallel_adapters(model, pa.ParallelAdapterConfig(bottleneck_size=4))
    small = pa.save_parallel_adapters(model, tmp_path / "cla-small")
    damaged = tmp_path / "cla-damaged"
    shutil.copytree(saved, damaged)
    shutil.copy(small / pa.WEIGHTS_NAME, damaged / pa.WEIGHTS_NAME)
    target, _ = load("plain", bases["bert"])
    with pytest.raises(InputError, match=r"cla-damaged: .*do not fit this model: layers\.0\.down\.bias: \[4\] in the file, \[16\]"):
        pa.load_parallel_adapters(target, damaged)
    assert pa.parallel_adapters(target) == {}
    with pytest.raises(InputError, match="not a parallel adapter directory"):
        pa.load_parallel_adapters(target, tmp_path / "nowhere")


# ---- merging -----------------------------------------------------------------------------------------


def test_merge_is_the_weighted_average(bases, texts, tmp_path):
    model, embed = load("plain", bases["bert"])
    dirs = {}
    for name, seed in (("pp", 1), ("pl", 2)):
        pa.add_parallel_adapters(model)
        randomise(model, seed)
        dirs[name] = pa.save_parallel_adapters(model, tmp_path / name, metadata={"objective": name})
        pa.remove_parallel_adapters(model)
    a, b = (load_file(str(dirs[name] / pa.WEIGHTS_NAME)) for name in ("pp", "pl"))

    first = pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [1, 0], tmp_path / "first")
    assert all(torch.equal(value, a[key]) for key, value in load_file(str(first / pa.WEIGHTS_NAME)).items())
    mean = pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [0.5, 0.5], tmp_path / "mean", metadata={"language": "de"})
    merged = load_file(str(mean / pa.WEIGHTS_NAME))
    assert merged.keys() == a.keys()
    for key in a:
        assert torch.equal(merged[key], ((a[key].double() + b[key].double()) / 2).float())
        torch.testing.assert_close(merged[key], (a[key] + b[key]) / 2, rtol=0, atol=1e-7)
    record = json.loads((mean / pa.CONFIG_NAME).read_text(encoding="utf-8"))
    assert record["metadata"]["language"] == "de"
    assert [(m["weight"], m["metadata"]["objective"]) for m in record["metadata"]["merged_from"]] == [(0.5, "pp"), (0.5, "pl")]

    # a merged directory is an ordinary adapter directory; (1, 0) behaves exactly as the first
    (with_first, embed_first), (with_pp, embed_pp) = load("plain", bases["bert"]), load("plain", bases["bert"])
    pa.load_parallel_adapters(with_first, first)
    pa.load_parallel_adapters(with_pp, dirs["pp"])
    assert torch.equal(embed_no_grad(embed_first, texts[:4]), embed_no_grad(embed_pp, texts[:4]))
    pa.load_parallel_adapters(load("plain", bases["bert"])[0], mean)

    pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [0.5, 0.5000005], tmp_path / "close-enough")
    with pytest.raises(InputError, match="sum to 1"):
        pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [0.5, 0.500002], tmp_path / "bad")
    with pytest.raises(InputError, match="sum to 1"):
        pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [0.6, 0.6], tmp_path / "bad")
    with pytest.raises(InputError, match="1 weights for 2 adapters"):
        pa.merge_parallel_adapters([dirs["pp"], dirs["pl"]], [1.0], tmp_path / "bad")

    pa.add_parallel_adapters(model, pa.ParallelAdapterConfig(scaling=2.0))
    rescaled = pa.save_parallel_adapters(model, tmp_path / "rescaled")
    with pytest.raises(InputError, match="rescaled: its configuration .* differs"):
        pa.merge_parallel_adapters([dirs["pp"], rescaled], [0.5, 0.5], tmp_path / "bad")
    other, _ = load("plain", bases["bert-seed1"])
    pa.add_parallel_adapters(other)
    foreign = pa.save_parallel_adapters(other, tmp_path / "foreign")
    with pytest.raises(InputError, match="foreign: trained on another base model.*fingerprint"):
        pa.merge_parallel_adapters([dirs["pp"], foreign], [0.5, 0.5], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def _tok(directory):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(directory))
