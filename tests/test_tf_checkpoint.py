"""modsent.encoders.tf_checkpoint (``modsent convert-tf``): a T5/mT5 checkpoint held only as
pickles and Keras HDF5 weights (google/mt5-xxl) becomes a safetensors directory of its encoder.

The HDF5 files here are written the way Keras's ``save_weights`` writes a subclassed model's
weights (``<layer>/<variable name>``, with the top-level ``layer_names`` and each layer's
``weight_names`` attributes), under the variable scopes of transformers' TF T5 classes: the
shared vocabulary in its own scope, ``block_._N`` / ``layer_._M`` list indices, Dense kernels as
[in, out], the relative attention bias as an ``embeddings`` table."""

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from modsent import cli
from modsent.encoders import tf_checkpoint as tc
from modsent.encoders import transformer as tf
from modsent.io import InputError
from modsent.testing import _sentencepiece, sample_texts
from test_mst5 import make_tiny_mt5

PREFIX = "tf_mt5_for_conditional_generation"


def keras_name(key: str) -> tuple[str, str, bool]:
    """(top-level layer, Keras variable name, transposed) of a PyTorch key of MT5ForConditionalGeneration."""
    if key == "shared.weight":
        return "shared", "shared/weight:0", False
    parts = key.split(".")
    scope, out = parts[0], []
    i = 0
    while i < len(parts):
        if parts[i] in ("block", "layer") and i + 1 < len(parts) and parts[i + 1].isdigit():
            out.append(f"{parts[i]}_._{parts[i + 1]}")
            i += 2
            continue
        out.append(parts[i])
        i += 1
    transpose = out[-1] == "weight" and out[-2] in ("q", "k", "v", "o", "wi_0", "wi_1", "wo", "lm_head")
    if transpose:
        out[-1] = "kernel"
    elif out[-2] == "relative_attention_bias":
        out[-1] = "embeddings"
    return scope, f"{PREFIX}/" + "/".join(out) + ":0", transpose


def write_keras_h5(state: dict[str, torch.Tensor], path, *, skip=(), shared_in_users=False) -> None:
    """``state`` (a whole MT5ForConditionalGeneration's) as Keras HDF5 weights at ``path``; with
    ``shared_in_users`` the vocabulary is listed again under the encoder and the decoder, as
    Keras lists a layer's weights under every layer that uses it."""
    layers: dict[str, list[tuple[str, np.ndarray]]] = {}
    for key, value in state.items():
        if key in skip or key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            continue
        layer, name, transpose = keras_name(key)
        array = value.detach().numpy()
        layers.setdefault(layer, []).append((name, array.T if transpose else array))
        if key == "shared.weight" and shared_in_users:
            for user in ("encoder", "decoder"):
                layers.setdefault(user, []).append(("shared/shared/embeddings:0", array))
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [n.encode() for n in layers]
        f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.4.0"
        for layer in sorted(layers):
            group = f.create_group(layer)
            group.attrs["weight_names"] = [n.encode() for n, _ in layers[layer]]
            for name, array in layers[layer]:
                group.create_dataset(name, data=array)


@pytest.fixture(scope="module")
def tf_only(tmp_path_factory):
    """A tiny random mT5 (encoder-decoder, untied head) laid out as google/mt5-xxl is on the Hub:
    config.json, the tokenizer and tf_model.h5, no safetensors. Returns (folder, the PyTorch
    model's state, the original directory)."""
    import transformers

    root = tmp_path_factory.mktemp("tf")
    original = make_tiny_mt5(root / "pt", sample_texts(300), vocab_size=300)
    model = transformers.MT5ForConditionalGeneration.from_pretrained(original)
    state = model.state_dict()
    folder = root / "mt5-tf"
    folder.mkdir()
    shutil.copy(original / "config.json", folder / "config.json")
    # the tokenizer as google/mt5-* ship it: the sentencepiece model (the same one make_tiny_mt5
    # trains: sentencepiece is deterministic) and its configs, no tokenizer.json
    proto = _sentencepiece(sample_texts(300), model_type="unigram", vocab_size=300, normalization_rule_name="nmt_nfkc",
                           pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    (folder / "spiece.model").write_bytes(proto.SerializeToString())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 0,
         "additional_special_tokens": None, "special_tokens_map_file": "", "tokenizer_file": None}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>",
                                                                "pad_token": "<pad>"}))
    write_keras_h5(state, folder / "tf_model.h5")
    return folder, state, original


def encode(model, tokenizer):
    batch = tokenizer(["Hallo Welt, wie geht es?", "Салам дүйнө"], padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state


def test_parameter_keys_follow_transformers_tf_names():
    assert tc.parameter_key(f"encoder/{PREFIX}/encoder/block_._11/layer_._0/SelfAttention/q/kernel:0") == (
        "encoder.block.11.layer.0.SelfAttention.q.weight", True)
    assert tc.parameter_key(f"encoder/{PREFIX}/encoder/block_._0/layer_._0/SelfAttention/relative_attention_bias/"
                            "embeddings:0") == ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                                                False)
    assert tc.parameter_key(f"encoder/{PREFIX}/encoder/final_layer_norm/weight:0") == (
        "encoder.final_layer_norm.weight", False)
    assert tc.parameter_key("shared/shared/weight:0") == ("shared.weight", False)
    assert tc.parameter_key(f"shared/{PREFIX}/shared/embeddings:0") == ("shared.weight", False)
    # the names of TFMT5Model's variables as loaded from the mT5 checkpoints (the old layout: the
    # vocabulary in its own absolute scope), and a newer layout's second listing of the table
    assert tc.parameter_key("tfm_t5model/encoder/block_._23/layer_._1/DenseReluDense/wi_1/kernel:0") == (
        "encoder.block.23.layer.1.DenseReluDense.wi_1.weight", True)
    assert tc.parameter_key("encoder/shared/shared/embeddings:0") == ("shared.weight", False)
    for skipped in (f"decoder/{PREFIX}/decoder/block_._0/layer_._1/EncDecAttention/k/kernel:0",
                    f"lm_head/{PREFIX}/lm_head/kernel:0", "top_level_model_weights/step:0"):
        assert tc.parameter_key(skipped) == (None, False)


def test_the_converted_encoder_encodes_as_the_pytorch_checkpoint(tf_only, tmp_path):
    folder, _, original = tf_only
    out = tc.convert(str(folder), tmp_path / "mt5-enc", progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names and "spiece.model" in names
    assert "tokenizer.json" in names  # the fast tokenizer built once from spiece.model
    assert not [n for n in names if n.endswith((".bin", ".h5", ".pt", ".pkl"))]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MT5EncoderModel"]
    body, tokenizer = tf.load_encoder_body(out)
    reference, ref_tokenizer = tf.load_encoder_body(original)
    body.eval(), reference.eval()
    got, want = encode(body, tokenizer), encode(reference, ref_tokenizer)
    assert got.shape == want.shape and got.shape[-1] == 32
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same float32 numbers, transposed back
    for name, param in body.named_parameters():  # and every parameter, not only what two sentences touch
        torch.testing.assert_close(param, reference.get_parameter(name), rtol=0, atol=0)


def test_a_vocabulary_listed_under_each_layer_that_uses_it_is_read_once(tf_only, tmp_path):
    folder, state, original = tf_only
    twice = tmp_path / "twice"
    shutil.copytree(folder, twice)
    write_keras_h5(state, twice / "tf_model.h5", shared_in_users=True)
    out = tc.convert(str(twice), tmp_path / "out", progress=False)
    body, _ = tf.load_encoder_body(out)
    torch.testing.assert_close(body.get_parameter("shared.weight"), state["shared.weight"], rtol=0, atol=0)


def test_a_large_encoder_is_written_in_shards_that_load_the_same(tf_only, tmp_path):
    folder, state, _ = tf_only
    out = tc.convert(str(folder), tmp_path / "sharded", shard_bytes=20_000, progress=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == sum(
        v.numel() * 4 for k, v in state.items()
        if k == "shared.weight" or (k.startswith("encoder.") and k != "encoder.embed_tokens.weight"))
    body, _ = tf.load_encoder_body(out)
    torch.testing.assert_close(body.get_parameter("encoder.block.1.layer.1.DenseReluDense.wo.weight"),
                               state["encoder.block.1.layer.1.DenseReluDense.wo.weight"], rtol=0, atol=0)


def test_missing_or_misshapen_weights_write_nothing(tf_only, tmp_path):
    folder, state, _ = tf_only
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    write_keras_h5(state, broken / "tf_model.h5", skip={"encoder.block.1.layer.0.SelfAttention.k.weight"})
    with pytest.raises(InputError, match=r"missing 1 of the encoder's .*encoder\.block\.1\.layer\.0\.SelfAttention\.k"):
        tc.convert(str(broken), tmp_path / "out", progress=False)
    assert not list(tmp_path.glob("*out*"))  # not even a temporary directory

    wrong = dict(state)
    wrong["encoder.block.0.layer.1.DenseReluDense.wo.weight"] = state["encoder.block.0.layer.1.DenseReluDense.wo.weight"].T
    write_keras_h5(wrong, broken / "tf_model.h5")
    with pytest.raises(InputError, match=r"DenseReluDense/wo/kernel:0: shape .*encoder\.block\.0\.layer\.1\."
                                         r"DenseReluDense\.wo\.weight has \(32, 64\)"):
        tc.convert(str(broken), tmp_path / "out", progress=False)
    assert not list(tmp_path.glob("*out*"))


def test_the_cli_converts_and_refuses_to_overwrite(tf_only, tmp_path, capsys):
    folder, _, _ = tf_only
    out = tmp_path / "cli-out"
    assert cli.main(["convert-tf", str(folder), str(out), "--quiet"]) == 0
    assert (out / "model.safetensors").is_file()
    assert cli.main(["convert-tf", str(folder), str(out), "--quiet"]) == 2
    assert "exists" in capsys.readouterr().err
    (tmp_path / "not-t5").mkdir()
    (tmp_path / "not-t5" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "not-t5" / "tf_model.h5").write_bytes(b"")
    assert cli.main(["convert-tf", str(tmp_path / "not-t5"), str(tmp_path / "x"), "--quiet"]) == 2
    assert "model_type 'bert'" in capsys.readouterr().err


def test_a_hub_model_without_safetensors_is_converted_once_by_fetch_and_loaded_by_its_id(tf_only, tmp_path,
                                                                                         monkeypatch):
    """google/mt5-xxl's case: modsent fetch finds no safetensors, converts the TensorFlow weights
    into $HF_HOME/modsent/converted once per commit, and the loader reads that by the Hub id
    (offline: no Hub call), so the config keeps naming the Hub model."""
    import huggingface_hub
    from huggingface_hub import constants

    from modsent import fetch

    folder, _, original = tf_only
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / commit
    shutil.copytree(folder, snapshot)
    calls = []

    def snapshot_download(repo_id, revision, allow_patterns):
        calls.append(tuple(allow_patterns))
        assert repo_id == "google/mt5-tiny" and revision is None
        assert not any(pattern.endswith((".bin", ".pt", ".pkl", ".py")) for pattern in allow_patterns)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    assert tc.converted_folder("google/mt5-tiny") is None
    [converted] = fetch.download([fetch.HubModel("google/mt5-tiny", None, "methods.mST5-xnli.model")])
    assert converted == tmp_path / "hf" / "modsent" / "converted" / "models--google--mt5-tiny" / "snapshots" / commit
    assert calls == [tuple(fetch.HUB_PATTERNS), tuple(tc.HUB_FILES)]
    assert (converted / "model.safetensors").is_file()
    assert tc.converted_folder("google/mt5-tiny") == tc.converted_folder("google/mt5-tiny", commit) == converted
    assert tc.hub_encoder("google/mt5-tiny") == converted and len(calls) == 2  # not downloaded or converted again

    def offline(**kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    body, tokenizer = tf.load_encoder_body("google/mt5-tiny")
    reference, ref_tokenizer = tf.load_encoder_body(original)
    body.eval(), reference.eval()
    torch.testing.assert_close(encode(body, tokenizer), encode(reference, ref_tokenizer), rtol=0, atol=0)

    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: str(tmp_path / "bert"))
    with pytest.raises(InputError, match=r"^methods\.X\.model: org/bert \(revision main\) has no safetensors "
                                         r"weights, which modsent's loaders need"):
        fetch.download([fetch.HubModel("org/bert", None, "methods.X.model")])


def test_a_job_converts_a_hub_model_that_fetch_did_not_convert_and_asks_no_conversion_service(
        tf_only, tmp_path, monkeypatch):
    """load_encoder_body by a Hub id whose repository has no safetensors: transformers' loader
    fails (without asking the Hub's conversion service), and the job converts the TensorFlow
    weights itself, once, under a lock, then loads them. (The Hub is simulated: its config
    answers for the id, its weights loader finds no safetensors.)"""
    import os

    import huggingface_hub
    import transformers
    from huggingface_hub import constants

    folder, _, original = tf_only
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    snapshot = tmp_path / "hub" / commit
    shutil.copytree(folder, snapshot)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: str(snapshot))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    real_config = transformers.AutoConfig.from_pretrained
    real_model = transformers.AutoModelForTextEncoding.from_pretrained
    hub_calls = []

    def config_from(source, **kwargs):
        return real_config(str(folder) if source == "google/mt5-tiny" else source, **kwargs)

    def model_from(source, **kwargs):
        if source == "google/mt5-tiny":
            hub_calls.append(os.environ.get("DISABLE_SAFETENSORS_CONVERSION"))
            raise OSError("google/mt5-tiny does not appear to have a file named model.safetensors")
        return real_model(source, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", config_from)
    monkeypatch.setattr(transformers.AutoModelForTextEncoding, "from_pretrained", model_from)
    monkeypatch.delenv("DISABLE_SAFETENSORS_CONVERSION", raising=False)
    body, tokenizer = tf.load_encoder_body("google/mt5-tiny")
    assert hub_calls == ["1"] and "DISABLE_SAFETENSORS_CONVERSION" not in os.environ
    converted = tc.converted_folder("google/mt5-tiny")
    assert converted is not None and converted.name == commit and (converted / "tokenizer.json").is_file()
    assert (converted.parent.parent / ".lock").exists()
    reference, ref_tokenizer = tf.load_encoder_body(original)
    body.eval(), reference.eval()
    torch.testing.assert_close(encode(body, tokenizer), encode(reference, ref_tokenizer), rtol=0, atol=0)
    tf.load_encoder_body("google/mt5-tiny")  # the conversion found by the id: no Hub call
    assert hub_calls == ["1"]
