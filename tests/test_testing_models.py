"""The tiny random encoders of modsent.testing: shapes, determinism, reloading."""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from modsent.io import InputError
from modsent.testing import make_tiny_bert, make_tiny_xlmr, sample_texts

# name -> (builder, keyword arguments)
KINDS = {
    "bert-mean": (make_tiny_bert, {"pooling": "mean"}),
    "labse-cls": (make_tiny_bert, {"pooling": "cls"}),
    "xlmr-mean": (make_tiny_xlmr, {}),
}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return sample_texts(500)


@pytest.fixture(scope="module")
def built(tmp_path_factory, texts) -> dict[str, tuple[Path, float]]:
    """Each kind built once: name -> (directory, seconds it took)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for name, (builder, kwargs) in KINDS.items():
        start = time.perf_counter()
        directory = builder(root / name, texts, **kwargs)
        out[name] = (directory, time.perf_counter() - start)
    return out


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_sample_texts_are_real_stable_english():
    first = sample_texts(300)
    assert first == sample_texts(300)  # same sentences, same order
    assert len(set(first)) == 300
    assert all(s[0].isupper() and s[-1] in ".!?" and 5 <= len(s.split()) <= 40 for s in first)
    # They are CPython's own documentation: the first comes from argparse's docstrings.
    import argparse

    argparse_docs = " ".join(
        " ".join((inspect.getdoc(obj) or "").split())
        for obj in [argparse, *vars(argparse).values()] if inspect.getdoc(obj)
    )
    assert first[0] in argparse_docs
    with pytest.raises(ValueError, match="available"):
        sample_texts(100_000)


@pytest.mark.parametrize("name", KINDS)
def test_builds_quickly_into_safetensors(built, name):
    directory, seconds = built[name]
    assert seconds < 5, f"{name} took {seconds:.1f}s"
    files = _files(directory)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"} <= set(files)
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    for content in files.values():  # no pickle (protocol 2+) and no torch zip archive anywhere
        assert not content.startswith((b"\x80", b"PK\x03\x04"))


@pytest.mark.parametrize("name", KINDS)
def test_sentence_transformer_shapes(built, texts, name):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(built[name][0]), device="cpu")
    assert model.max_seq_length == 128
    embeddings = model.encode(texts[:8] + [" ".join(texts[:40])])  # the last one is truncated
    assert embeddings.shape == (9, 32)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(embeddings[0], embeddings[1])
    module_names = [type(m).__name__ for m in model]
    if name == "labse-cls":
        assert module_names == ["Transformer", "Pooling", "Dense", "Normalize"]
        assert model[1].pooling_mode == "cls"
    else:
        assert module_names == ["Transformer", "Pooling", "Normalize"]
        assert model[1].pooling_mode == "mean"


@pytest.mark.parametrize("name", KINDS)
def test_same_seed_same_model_other_seed_other_model(built, texts, tmp_path, name):
    from sentence_transformers import SentenceTransformer

    builder, kwargs = KINDS[name]
    rng_before = torch.get_rng_state()
    again = builder(tmp_path / "again", texts, **kwargs)
    other = builder(tmp_path / "other", texts, seed=1, **kwargs)
    assert torch.equal(rng_before, torch.get_rng_state())  # the caller's random stream is untouched

    assert _files(again) == _files(built[name][0])  # byte for byte
    sample = texts[:16]
    first = SentenceTransformer(str(built[name][0]), device="cpu").encode(sample)
    second = SentenceTransformer(str(again), device="cpu").encode(sample)
    assert np.array_equal(first, second)
    third = SentenceTransformer(str(other), device="cpu").encode(sample)
    assert not np.allclose(first, third)
    # a new seed changes the weights, not the tokenizer
    assert (other / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("name", KINDS)
def test_reloads_as_masked_lm_with_tied_head(built, texts, name):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    directory = built[name][0]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    mlm, info = AutoModelForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert mlm.get_output_embeddings().weight.data_ptr() == mlm.get_input_embeddings().weight.data_ptr()
    base, info = AutoModel.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"]  # the pooler is in the file: nothing is initialised at load

    batch = tokenizer(texts[:3], padding=True, return_tensors="pt")
    batch["input_ids"][:, 2] = tokenizer.mask_token_id
    with torch.no_grad():
        logits = mlm(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, mlm.config.vocab_size)
    assert mlm.config.vocab_size == len(tokenizer) <= 1000


@pytest.mark.parametrize("name", KINDS)
def test_tokenizer_files_agree_and_use_the_real_special_ids(built, texts, name):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    directory = built[name][0]
    fast = Tokenizer.from_file(str(directory / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(directory)
    # also with the stray spaces real text has
    probe = texts + [f" {t}  {t} " for t in texts[:20]]
    assert [auto(t)["input_ids"] for t in probe] == [e.ids for e in fast.encode_batch(probe)]
    # No [UNK]/<unk> on the training texts: the alphabet is complete.
    assert auto.unk_token_id not in {i for t in texts[:100] for i in auto(t)["input_ids"]}
    if name.startswith("xlmr"):
        assert [auto.bos_token_id, auto.pad_token_id, auto.eos_token_id, auto.unk_token_id] == [0, 1, 2, 3]
        assert auto.mask_token_id == len(auto) - 1  # XLM-R: <mask> is the last id
        assert auto.tokenize("a <mask> b")[-2] == " <mask>"  # swallows the space before it, as XLM-R's
    else:
        assert [auto.pad_token_id, auto.unk_token_id, auto.cls_token_id, auto.sep_token_id,
                auto.mask_token_id] == [0, 1, 2, 3, 4]
        assert auto("Python")["input_ids"] != auto("python")["input_ids"]  # cased, like LaBSE
        assert type(auto).__name__ == "BertTokenizer"


def test_sentence_transformer_save_and_reload_round_trip(built, texts, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(built["labse-cls"][0]), device="cpu")
    model.save(str(tmp_path / "saved"))
    again = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    np.testing.assert_allclose(model.encode(texts[:4]), again.encode(texts[:4]), atol=1e-6)


def test_bad_arguments_leave_nothing_behind(texts, tmp_path):
    with pytest.raises(InputError, match="pooling"):
        make_tiny_bert(tmp_path / "m", texts, pooling="max")
    with pytest.raises(InputError, match="no non-empty text"):
        make_tiny_xlmr(tmp_path / "m", ["", "  "])
    with pytest.raises(InputError, match="vocab_size=20"):
        make_tiny_bert(tmp_path / "m", texts, vocab_size=20)
    with pytest.raises(InputError, match="vocab_size=19"):  # 20 minus the room kept for <mask>
        make_tiny_xlmr(tmp_path / "m", texts, vocab_size=20)
    assert list(tmp_path.iterdir()) == []
