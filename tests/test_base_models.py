import json
import os

import pytest

from modsent.encoders.base_models import check_model_dir, parse_source, prepare_base_model
from modsent.io import InputError
from modsent.testing import make_tiny_xlmr, sample_texts


def test_parse_source():
    assert parse_source("builtin:multilingual-e5-small") == ("builtin", "multilingual-e5-small")
    assert parse_source("sentence-transformers/LaBSE") == ("hf", "sentence-transformers/LaBSE")
    assert parse_source("local:/models/x") == ("local", "/models/x")
    assert parse_source("hf:sentence-transformers/LaBSE") == ("hf", "sentence-transformers/LaBSE")  # as data sources
    for bad, message in (("", "is no Hub id"), ("local:", "names no directory"), ("hf:", "is no Hub id"),
                         ("org/na me", "is no Hub id")):
        with pytest.raises(InputError, match=rf"^base_model\.source: .*{message}"):
            parse_source(bad)
    with pytest.raises(InputError, match="built-in models: multilingual-e5-small"):
        parse_source("builtin:labse")
    with pytest.raises(InputError, match="write 'local:/models/labse'"):
        parse_source("/models/labse")


def test_local_base_model_is_copied_checked_and_described(tmp_path):
    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    (src / "pytorch_model.bin").write_bytes(b"not to be copied")
    config = json.loads((src / "tokenizer_config.json").read_text())  # as transformers 5 saves it
    del config["added_tokens_decoder"]
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    out = prepare_base_model(f"local:{src}", tmp_path / "out")
    assert not (out / "pytorch_model.bin").exists()  # pickles are never taken along
    added = json.loads((src / "tokenizer.json").read_text())["added_tokens"]
    assert json.loads((out / "tokenizer_config.json").read_text())["added_tokens_decoder"] == {
        str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}  # the copy lists them
    assert "added_tokens_decoder" not in json.loads((src / "tokenizer_config.json").read_text())
    info = json.loads((out / "modsent_base.json").read_text())
    assert info["dimension"] == 32
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~current_umask())


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_local_model_without_safetensors_is_refused(tmp_path):
    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    for weights in src.rglob("*.safetensors"):
        weights.unlink()
    (src / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(InputError, match="no safetensors weights.*pytorch_model.bin"):
        check_model_dir(src)
    with pytest.raises(InputError, match="no safetensors weights"):
        prepare_base_model(f"local:{src}", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_that_needs_its_own_code_is_refused_naming_the_config_key(tmp_path):
    """A model whose config maps it to code of its own (an unknown model_type with auto_map): no code
    runs, and the error says that base_model.trust_remote_code cannot help (no later stage runs a
    model's code) rather than naming transformers' argument."""
    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    (src / "modeling_custom.py").write_text("raise SystemExit('this code must not run')\n")
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="custom_xlmr", architectures=["CustomModel"],
                  auto_map={"AutoConfig": "modeling_custom.CustomConfig", "AutoModel": "modeling_custom.CustomModel"})
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=rf"^{src}: this model needs its own Python code .*"
                                         r"base_model\.trust_remote_code: true cannot help") as raised:
        prepare_base_model(f"local:{src}", tmp_path / "out")
    assert "https://hf.co" not in str(raised.value) and not (tmp_path / "out").exists()


def test_a_damaged_local_model_is_named_by_its_own_files(tmp_path):
    """Truncated weights and a broken config.json: errors that name the user's file (not the
    temporary copy), before anything is written."""
    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    weights = next(src.rglob("*.safetensors"))
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match=rf"{weights}: unreadable safetensors file \(truncated"):
        prepare_base_model(f"local:{src}", tmp_path / "out")
    weights.write_bytes(good)
    config = src / "config.json"
    config.write_text(config.read_text()[:-10])
    with pytest.raises(InputError, match=rf"{config}: not valid JSON"):
        prepare_base_model(f"local:{src}", tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_e5_models_get_their_prompts_unless_declared():
    from modsent.encoders.base_models import needs_e5_prompts

    assert needs_e5_prompts("intfloat/multilingual-e5-base", {})
    assert needs_e5_prompts("intfloat/e5-large-v2", None)
    assert not needs_e5_prompts("intfloat/multilingual-e5-base", {"query": "query: "})
    assert not needs_e5_prompts("sentence-transformers/LaBSE", {})


def test_configured_prompts_are_written(tmp_path):
    from sentence_transformers import SentenceTransformer

    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    out = prepare_base_model(f"local:{src}", tmp_path / "out", prompts={"query": "query: "})
    model = SentenceTransformer(str(out), device="cpu")
    assert model.prompts["query"] == "query: " and model.default_prompt_name == "query"
    with_prompt = model.encode(["a test"])
    without = model.encode(["a test"], prompt="")
    assert not (with_prompt == without).all()  # the prefix is applied by default


def test_a_sentence_transformers_directory_with_pickled_module_weights_is_refused(tmp_path, monkeypatch):
    """A Dense module stored as pytorch_model.bin alone (an older sentence-transformers save):
    `modsent encode --model DIR` and a recipe's `model:` directory would torch.load it; both
    loaders refuse it naming the file, and nothing is unpickled. With safetensors beside it, the
    pickle is left alone and the directory loads."""
    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from modsent.encoders.systems import load_sentence_transformer
    from modsent.modular.sentence_adapter import _sentence_head

    src = make_tiny_xlmr(tmp_path / "src", sample_texts(200))
    model = SentenceTransformer(str(src), device="cpu")
    model.append(Dense(32, 8))
    model.save(str(tmp_path / "dense"))
    dense = next((tmp_path / "dense").glob("*_Dense"))
    torch.save(load_file(str(dense / "model.safetensors")), dense / "pytorch_model.bin")
    assert len(load_sentence_transformer(tmp_path / "dense", device="cpu").encode(["a b"])[0]) == 8  # beside: fine
    (tmp_path / "dense" / "openvino").mkdir()  # a Hub snapshot's other formats are never loaded: no error
    (tmp_path / "dense" / "openvino" / "openvino_model.bin").write_bytes(b"not a pickle")
    assert len(load_sentence_transformer(tmp_path / "dense", device="cpu").encode(["a b"])[0]) == 8
    (dense / "model.safetensors").unlink()
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called"))
    for load in (lambda d: load_sentence_transformer(d, device="cpu"), _sentence_head):
        with pytest.raises(InputError, match=rf"^{dense}/pytorch_model\.bin: pickled weights, which modsent does not"):
            load(tmp_path / "dense")
