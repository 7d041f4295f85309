"""Monolingual specialisation, steps 1-3: new tokenizer, token-level fastText, FOCUS embeddings.

Base models are the tiny random encoders of ``modsent.testing`` (tokenizers trained on English
docstrings); the "new language" is German from the built-in demo corpus (human translations in
Django, pycountry and CLDR catalogs). FOCUS is compared with deepfocus 1.0.1, the reference
implementation, on the same fastText model.
"""

from __future__ import annotations

import gettext
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from modsent.modular.fasttext_embeddings import load_token_vectors, train_token_fasttext
from modsent.modular.focus import (
    apply_focus_plan,
    canonical_token,
    focus_initialize,
    focus_plan,
    initialize_embeddings,
    load_base_embeddings,
    tokenizer_convention,
)
from modsent.io import InputError
from modsent.testing import make_tiny_bert, make_tiny_xlmr, sample_texts
from modsent.modular.tokenizer_training import (
    canonical_unigram_file,
    load_tokenizer,
    tokenizer_kind,
    train_tokenizer,
)

KINDS = ("bert", "xlmr")
NEW_VOCAB = 600
# Small fastText settings: seconds, not minutes (the defaults allocate 2M n-gram buckets). With
# few epochs on a corpus this small the vectors stay nearly parallel and sparsemax keeps almost
# every anchor (5 epochs: ~200 of 204); 50 epochs give supports of ~25.
FASTTEXT = dict(dim=16, epochs=50, min_count=3, threads=1, bucket=200_000, keep_model=True)
FASTTEXT_MAGIC = 793712314  # first int32 of every fastText binary model (FASTTEXT_FILEFORMAT_MAGIC_INT32)


def _german_lines() -> list[str]:
    """German sentences and names written by people: the built-in demo corpus, or (while that
    module is unavailable) the German messages of Django's own catalogs."""
    try:
        from modsent.sources.builtin import builtin_corpus
    except ImportError:
        import django

        mo = Path(django.__file__).parent / "conf/locale/de/LC_MESSAGES/django.mo"
        with open(mo, "rb") as handle:
            catalog = gettext.GNUTranslations(handle)._catalog
        return sorted({v for k, v in catalog.items() if isinstance(k, str) and k and v})
    return builtin_corpus("de")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("specialization")


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    path = work / "de.txt"
    path.write_text("\n".join(_german_lines()[:4000]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bases(work) -> dict[str, Path]:
    texts = sample_texts(1000)
    return {
        "bert": make_tiny_bert(work / "base-bert", texts, vocab_size=1500),
        "xlmr": make_tiny_xlmr(work / "base-xlmr", texts, vocab_size=1500),
    }


@pytest.fixture(scope="module")
def tokenizers(work, bases, corpus) -> dict[str, Path]:
    out = {}
    for kind, base in bases.items():
        train_tokenizer(corpus, base, work / f"tok-{kind}", NEW_VOCAB)
        out[kind] = work / f"tok-{kind}"
    return out


@pytest.fixture(scope="module")
def fasttexts(work, tokenizers, corpus) -> dict[str, Path]:
    out = {}
    for kind, tok in tokenizers.items():
        train_token_fasttext(corpus, tok, work / f"ft-{kind}", **FASTTEXT)
        out[kind] = work / f"ft-{kind}"
    return out


def _pipeline(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


# ------------------------------------------------------------------------------ 1. tokenizer


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_of_the_base_kind(kind, bases, tokenizers, corpus):
    base, new = load_tokenizer(bases[kind]), load_tokenizer(tokenizers[kind])
    expected = {"bert": "wordpiece", "xlmr": "unigram"}[kind]
    assert tokenizer_kind(base) == tokenizer_kind(new) == expected
    assert type(new) is type(base)
    assert 0.9 * NEW_VOCAB <= len(new) <= NEW_VOCAB
    assert set(new.get_vocab()) != set(base.get_vocab())  # German, not the base's English vocabulary

    # The pipeline around the vocabulary is the base's; only special-token ids may differ.
    b, n = _pipeline(base), _pipeline(new)
    for part in ("normalizer", "pre_tokenizer", "decoder"):
        assert n[part] == b[part], part
    assert n["post_processor"]["type"] == b["post_processor"]["type"]
    assert n["post_processor"]["single"] == b["post_processor"]["single"]
    if kind == "bert":
        assert n["model"]["continuing_subword_prefix"] == "##"

    # Same special-token strings; the ids a model config refers to stay where they were.
    assert new.all_special_tokens == base.all_special_tokens
    keep = ["<s>", "<pad>", "</s>", "<unk>"] if kind == "xlmr" else ["[PAD]"]
    assert new.convert_tokens_to_ids(keep) == base.convert_tokens_to_ids(keep)
    assert new.pad_token_id == base.pad_token_id
    ids = new("Geheimes Token")["input_ids"]
    assert ids[0] == new.cls_token_id and ids[-1] == new.sep_token_id
    assert new.unk_token_id not in ids

    report = json.loads((tokenizers[kind] / "modsent_tokenizer.json").read_text(encoding="utf-8"))
    assert report["kind"] == expected and report["vocab_size"] == len(new)
    assert report["sentences"] == sum(1 for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip())


def test_a_unigram_tokenizer_trained_again_is_the_same_file(bases, tokenizers, corpus, tmp_path):
    """tokenizers' Unigram trainer sums scores in hash-map order: each call gave the same pieces
    with ids moved (the demo's German: 162 of 4,000). The written file is canonical: the same
    bytes from every training on the same text, pieces by score, then text; the added tokens
    where the base has them."""
    train_tokenizer(corpus, bases["xlmr"], tmp_path / "again", NEW_VOCAB)
    first = (tokenizers["xlmr"] / "tokenizer.json").read_bytes()
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == first
    data = json.loads(first)
    fixed = {token["id"] for token in data["added_tokens"]}
    pieces = [entry for i, entry in enumerate(data["model"]["vocab"]) if i not in fixed]
    scores = [score for _, score in pieces]
    assert scores == sorted(scores, reverse=True) and len({piece for piece, _ in pieces}) == len(pieces)
    new = load_tokenizer(tmp_path / "again")
    assert new.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    assert new.unk_token_id not in new("Geheimes Token")["input_ids"]


def test_unigram_appended_characters_are_ordered_around_learned_pieces(tmp_path):
    """The characters tokenizers' Unigram trainer appends get the scores min, min + 1e-4, ...
    in hash order, and learned pieces can score between those rungs (the demo's Chinese
    tokenizer: one learned piece among 256 appended characters, and every training wrote another
    file). Two hash orders of the same training give the same canonical file; the learned
    pieces keep their scores, the appended characters take the ladder's scores in text order."""
    lowest = -11.71537523407750  # the lowest learned score, where the ladder starts
    # "斯泰" between the ladder's fifth and sixth rungs
    learned = [["▁der", -3.25], ["en", -4.5], ["▁坦", -11.66776490118166], ["斯泰", lowest + 4.31234e-4]]
    chars = ["钟", "准", "绝", "逗", "巽", "申", "箭", "够", "进", "素"]
    rng = np.random.default_rng(0)
    files = []
    for run in range(2):
        order = rng.permutation(len(chars))
        # the trainer's float error: scores ~1e-15 apart between runs
        ladder = [[chars[j], lowest + k * 1e-4 + run * 1e-15] for k, j in enumerate(order)]
        vocab = [["<s>", 0.0], ["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0]]
        vocab += sorted(learned + [["鲜", lowest]] + ladder, key=lambda entry: -entry[1])
        data = {"added_tokens": [{"id": i, "content": vocab[i][0]} for i in range(4)],
                "model": {"type": "Unigram", "unk_id": 3, "vocab": vocab}}
        path = tmp_path / f"run{run}.json"
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        canonical_unigram_file(path)
        files.append(path.read_bytes())
    assert files[0] == files[1]
    vocab = json.loads(files[0])["model"]["vocab"]
    assert vocab[:4] == [["<s>", 0.0], ["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0]]
    scores = dict(vocab)
    for piece, score in learned:
        assert scores[piece] == round(score, 8)
    # the ladder, "鲜" on its lowest rung with the first appended character: texts in order,
    # scores from the top rung down
    rungs = sorted([round(lowest + k * 1e-4, 8) for k in range(len(chars))] + [round(lowest, 8)], reverse=True)
    on_ladder = sorted(chars + ["鲜"])
    assert [scores[c] for c in on_ladder] == rungs
    assert [score for _, score in vocab[4:]] == sorted((score for _, score in vocab[4:]), reverse=True)


def test_wordpiece_trainings_on_the_same_text_write_the_same_files(bases, corpus, tmp_path):
    """The WordPiece trainer numbers the pieces ##c in hash order and breaks ties between merges
    of equal count by those numbers: two trainings in one process learned other pieces near the
    cut-off (vocabularies of 1,500 pieces 8-32 apart) and most ids moved. With its initial
    vocabulary given to it first (the characters by code point, then the ##c sorted), every
    training writes the same bytes, and the pinned pieces end as ordinary pieces (no added
    tokens beyond the base's: text spelling ##0 is not cut out), right after the specials."""
    files = []
    for run in range(3):
        train_tokenizer(corpus, bases["bert"], tmp_path / f"tok{run}", 1500, max_sentences=3000)
        files.append({name: (tmp_path / f"tok{run}" / name).read_bytes()
                      for name in ("tokenizer.json", "tokenizer_config.json")})
    assert files[0] == files[1] == files[2]
    base, new = load_tokenizer(bases["bert"]), load_tokenizer(tmp_path / "tok0")
    assert set(new.get_added_vocab()) == set(base.get_added_vocab())
    assert "extra_special_tokens" not in json.loads(files[0]["tokenizer_config.json"])
    vocab = json.loads(files[0]["tokenizer.json"])["model"]["vocab"]
    characters = sorted(token for token in vocab if len(token) == 1)
    continuation = sorted(token for token in vocab if token.startswith("##") and len(token) == 3)
    assert characters and continuation
    assert [vocab[token] for token in characters + continuation] == list(range(5, 5 + len(characters + continuation)))
    assert len(new) == 1500 and sorted(new.all_special_ids) == list(range(5))
    # an ordinary piece: literal "##0" is split by the pre-tokenizer, as any punctuation, not cut out
    assert "##0" in vocab and "##0" not in new.tokenize("a##0")


def test_max_sentences(bases, corpus, tmp_path):
    report = train_tokenizer(corpus, bases["xlmr"], tmp_path / "tok", 200, max_sentences=500)
    assert report["sentences"] == 500


def test_added_token_text_is_not_learned(bases, corpus, tmp_path):
    """Text such as "<s>" in the corpus must not become an ordinary piece that steals the special
    token's string (it happened with 50,000 pieces on Python docstrings)."""
    import inspect

    from transformers.models.xlm_roberta import tokenization_xlm_roberta

    doc = inspect.getdoc(tokenization_xlm_roberta.XLMRobertaTokenizer)  # mentions "<s>" and "</s>"
    lines = [" ".join(line.split()) for line in doc.splitlines() if "<s>" in line or "</s>" in line]
    path = tmp_path / "with-specials.txt"
    path.write_text(corpus.read_text(encoding="utf-8") + "\n".join(lines) + "\n", encoding="utf-8")
    report = train_tokenizer(path, bases["xlmr"], tmp_path / "tok", 400)
    assert report["added_token_texts_removed"] >= len(lines)
    new = load_tokenizer(tmp_path / "tok")
    assert len(new.get_vocab()) == len(new)  # every string has one id
    assert new.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"]) == [0, 1, 2, 3]


def test_tokenizer_bad_input(bases, corpus, tmp_path):
    base = bases["bert"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"{empty}.*empty"):
        train_tokenizer(empty, base, tmp_path / "out", 100)

    tiny = tmp_path / "tiny.txt"
    tiny.write_text("".join(line + "\n" for line in _german_lines()[:5]), encoding="utf-8")
    for kind in KINDS:
        with pytest.raises(InputError, match=rf"{tiny}: corpus too small for a vocabulary of 5000 tokens: training gave \d+"):
            train_tokenizer(tiny, bases[kind], tmp_path / "out", 5000)

    bad = tmp_path / "bad.txt"
    bad.write_bytes(corpus.read_bytes()[:2000].rsplit(b"\n", 1)[0] + b"\nok\nkaputt \xff\xfe\n")
    bad_line = bad.read_bytes().count(b"\n")
    with pytest.raises(InputError, match=rf"{bad}: line {bad_line}: invalid UTF-8"):
        train_tokenizer(bad, base, tmp_path / "out", 100)

    with pytest.raises(InputError, match="not found"):
        train_tokenizer(tmp_path / "missing.txt", base, tmp_path / "out", 100)

    han = tmp_path / "han.txt"  # more distinct characters than the vocabulary has room for
    han.write_text("".join(chr(0x4E00 + i) * 2 + " " + chr(0x4E01 + i) + "\n" for i in range(0, 600, 2)),
                   encoding="utf-8")
    with pytest.raises(InputError, match=r"a vocabulary of 100 tokens cannot hold the corpus' 60[01] distinct "
                                         r"characters.*raise tokenizer.vocab_size"):
        train_tokenizer(han, bases["xlmr"], tmp_path / "out", 100)
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert not list(tmp_path.glob(".out*"))


def test_unsupported_base_kind(corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(sample_texts(200), trainers.BpeTrainer(vocab_size=300, show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(tmp_path / "bpe")
    with pytest.raises(InputError, match="BPE tokenizer is not supported"):
        train_tokenizer(corpus, tmp_path / "bpe", tmp_path / "out", 100)


# ------------------------------------------------------------------------------- 2. fastText


@pytest.mark.parametrize("kind", KINDS)
def test_fasttext_vectors_aligned_with_vocabulary(kind, tokenizers, fasttexts, corpus):
    import fasttext

    tokenizer = load_tokenizer(tokenizers[kind])
    vectors, mask = load_token_vectors(fasttexts[kind], tokenizer)
    assert vectors.dtype == np.float32 and vectors.shape == (len(tokenizer), FASTTEXT["dim"])
    assert mask.dtype == np.bool_ and mask.shape == (len(tokenizer),)
    assert sorted(p.name for p in fasttexts[kind].iterdir()) == ["fasttext.bin", "report.json", "vectors.safetensors"]

    binary = fasttexts[kind] / "fasttext.bin"
    assert struct.unpack("<i", binary.read_bytes()[:4])[0] == FASTTEXT_MAGIC  # fastText's format, no pickle
    model = fasttext.load_model(str(binary))
    words = set(model.words)
    seen: dict[str, int] = {}
    for line in corpus.read_text(encoding="utf-8").splitlines():
        for token in tokenizer.tokenize(line):
            seen[token] = seen.get(token, 0) + 1
    vocab = tokenizer.get_vocab()
    for token, index in vocab.items():
        assert mask[index] == (token in words), token
        if mask[index]:
            np.testing.assert_array_equal(vectors[index], model.get_word_vector(token))
            assert seen.get(token, 0) >= FASTTEXT["min_count"] or token == "</s>"  # fastText's line end
        else:
            assert not vectors[index].any()
    unseen = [t for t in vocab if t not in seen and t != "</s>"]
    assert unseen and not mask[[vocab[t] for t in unseen]].any()  # never seen: no vector
    assert 0.3 * len(vocab) < mask.sum() < len(vocab)

    report = json.loads((fasttexts[kind] / "report.json").read_text(encoding="utf-8"))
    assert report["tokens_with_vector"] == mask.sum() and report["fasttext"]["model"] == "cbow"


def test_fasttext_single_thread_is_deterministic(tokenizers, fasttexts, corpus, tmp_path, monkeypatch):
    # A second training in this process (which already trained fastText in the fixture) gives the
    # same vectors: each training runs in a fresh interpreter.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home/.cache"))
    train_token_fasttext(corpus, tokenizers["xlmr"], tmp_path / "again", **FASTTEXT)
    first = load_file(fasttexts["xlmr"] / "vectors.safetensors")
    second = load_file(tmp_path / "again/vectors.safetensors")
    assert torch.equal(first["vectors"], second["vectors"]) and torch.equal(first["mask"], second["mask"])
    assert (fasttexts["xlmr"] / "fasttext.bin").read_bytes() == (tmp_path / "again/fasttext.bin").read_bytes()
    assert not (tmp_path / "home").exists()  # no cache anywhere near the home directory
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # the tokenised text was temporary


def test_fasttext_bad_input(tokenizers, corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputError, match=rf"{empty}.*empty"):
        train_token_fasttext(empty, tokenizers["bert"], tmp_path / "out", **FASTTEXT)
    with pytest.raises(InputError, match=rf"{corpus}: no token occurs min_count=1000000 times"):
        train_token_fasttext(corpus, tokenizers["bert"], tmp_path / "out", **{**FASTTEXT, "min_count": 1_000_000})
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Guten Tag\n\xc3\x28\n")
    with pytest.raises(InputError, match=rf"{bad}: line 2: invalid UTF-8"):
        train_token_fasttext(bad, tokenizers["bert"], tmp_path / "out", **FASTTEXT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "empty.txt"]


def test_vectors_refuse_another_vocabulary(tokenizers, fasttexts):
    with pytest.raises(InputError, match="another vocabulary"):
        load_token_vectors(fasttexts["bert"], load_tokenizer(tokenizers["xlmr"]))


# ---------------------------------------------------------------------- 3. FOCUS: canonical forms


@pytest.mark.parametrize("token, convention, canonical", [
    ("##ung", "wordpiece", "ung"),
    ("Haus", "wordpiece", "▁Haus"),
    ("[CLS]", "wordpiece", "▁[CLS]"),
    ("▁Haus", "sentencepiece", "▁Haus"),
    ("ung", "sentencepiece", "ung"),
    ("▁", "sentencepiece", "▁"),
    ("<0x0A>", "sentencepiece", "<0x0A>"),
    ("ĠHaus", "bytelevel", "▁Haus"),
    ("ung", "bytelevel", "ung"),
    ("ĠÃ¼ber", "bytelevel", "▁über"),  # UTF-8 bytes of "ü" as byte-level characters
    ("<|endoftext|>", "bytelevel", "<|endoftext|>"),
])
def test_canonical_token(token, convention, canonical):
    assert canonical_token(token, convention) == canonical


def test_canonical_forms_agree_across_conventions():
    # One word start and one word-inner piece, written in each tokenizer family's convention.
    assert canonical_token("über", "wordpiece") == canonical_token("▁über", "sentencepiece") \
        == canonical_token("ĠÃ¼ber", "bytelevel") == "▁über"
    assert canonical_token("##ung", "wordpiece") == canonical_token("ung", "sentencepiece") \
        == canonical_token("ung", "bytelevel") == "ung"
    assert canonical_token("ung", "wordpiece") != canonical_token("ung", "sentencepiece")
    with pytest.raises(ValueError, match="unknown tokenizer convention"):
        canonical_token("x", "morfessor")


@pytest.mark.parametrize("kind", KINDS)
def test_canonical_forms_match_deepfocus(kind, bases, tokenizers, deepfocus_env):
    from deepfocus.vocab_helper import get_canonicalize_token_fn

    for path in (bases[kind], tokenizers[kind]):
        tokenizer = load_tokenizer(path)
        convention, prefix = tokenizer_convention(tokenizer)
        assert convention == {"bert": "wordpiece", "xlmr": "sentencepiece"}[kind]
        reference = get_canonicalize_token_fn(tokenizer)
        for token, index in tokenizer.get_vocab().items():
            assert canonical_token(token, convention, continuing_prefix=prefix) == reference(tokenizer, index)[0], token


# ------------------------------------------------------------------------------ 3. FOCUS: rules


@pytest.fixture
def deepfocus_env(tmp_path, monkeypatch):
    """deepfocus with its caches pointed into tmp_path (it computes them at import)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    import deepfocus  # noqa: F401  (installed by ./run with --no-deps into .venv/reference)

    yield tmp_path
    assert not (tmp_path / "home").exists() and not (tmp_path / "cache").exists()


def _plan_and_base(kind, bases, tokenizers, fasttexts):
    from modsent.modular.focus import _plan_for

    base_tok, new_tok = load_tokenizer(bases[kind]), load_tokenizer(tokenizers[kind])
    vectors, mask = load_token_vectors(fasttexts[kind], new_tok)
    plan = _plan_for(base_tok, new_tok, vectors, mask, chunk_size=1024)
    base = load_base_embeddings(bases[kind])["input"][: len(base_tok)]
    return plan, base, base_tok, new_tok, vectors, mask


@pytest.mark.parametrize("kind", KINDS)
def test_focus_rows_copied_combined_random(kind, bases, tokenizers, fasttexts):
    plan, base, base_tok, new_tok, vectors, mask = _plan_and_base(kind, bases, tokenizers, fasttexts)
    embeddings, report = focus_initialize(base, base_tok, new_tok, vectors, mask, seed=7)
    assert embeddings.shape == (len(new_tok), base.shape[1])
    assert report["copied"] + report["combined"] + report["random"] == len(new_tok)
    assert min(report["copied"], report["combined"], report["random"], report["anchors"]) > 0

    # Copied: exactly the base rows, specials to the base's specials of the same role.
    torch.testing.assert_close(embeddings[plan.copy_new], base[plan.copy_base], rtol=0, atol=0)
    for role in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"):
        new_id = new_tok.convert_tokens_to_ids(getattr(new_tok, role))
        torch.testing.assert_close(embeddings[new_id], base[base_tok.convert_tokens_to_ids(getattr(base_tok, role))])
    shared = next(t for t in new_tok.get_vocab() if t in base_tok.get_vocab() and len(t) > 3)
    torch.testing.assert_close(embeddings[new_tok.convert_tokens_to_ids(shared)], base[base_tok.convert_tokens_to_ids(shared)])

    # Combined: convex combinations of anchor rows with sparse weights.
    weights = plan.weights_dense()
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(len(weights), dtype=torch.float64))
    support = (weights > 0).sum(dim=1)  # sparse: sparsemax gives most anchors a weight of 0
    assert (support < weights.shape[1]).all() and support.float().mean() < 0.5 * weights.shape[1]
    assert report["sparsemax_support"]["max"] == support.max()
    torch.testing.assert_close(embeddings[plan.combine_new], (weights @ base[plan.anchor_base].double()).float())
    assert mask[plan.combine_new.numpy()].all() and mask[plan.anchor_new.numpy()].all()
    assert set(plan.anchor_new.tolist()) <= set(plan.copy_new.tolist())

    # Random: no fastText vector; drawn from N(mean, std) of the base embeddings, seeded.
    assert not mask[plan.random_new.numpy()].any()
    drawn = embeddings[plan.random_new]
    assert abs(drawn.mean() - base.mean()) < 3 * base.std() / len(plan.random_new) ** 0.5
    assert 0.8 < drawn.std(dim=0).mean() / base.std(dim=0).mean() < 1.2
    again, _ = focus_initialize(base, base_tok, new_tok, vectors, mask, seed=7)
    other, _ = focus_initialize(base, base_tok, new_tok, vectors, mask, seed=8)
    assert torch.equal(again, embeddings)
    assert not torch.equal(other[plan.random_new], drawn)
    torch.testing.assert_close(other[plan.combine_new], embeddings[plan.combine_new], rtol=0, atol=0)


def test_focus_chunks_and_partial_sort_change_nothing(bases, tokenizers, fasttexts):
    plan, base, base_tok, new_tok, vectors, mask = _plan_and_base("xlmr", bases, tokenizers, fasttexts)
    kwargs = dict(base_convention="sentencepiece", new_convention="sentencepiece")
    small = focus_plan(base_tok.get_vocab(), new_tok.get_vocab(), vectors, mask, chunk_size=5,
                       sparsemax_k=2, **kwargs)
    full = focus_plan(base_tok.get_vocab(), new_tok.get_vocab(), vectors, mask, chunk_size=10_000,
                      sparsemax_k=None, **kwargs)
    torch.testing.assert_close(small.weights_dense(), full.weights_dense(), rtol=0, atol=1e-12)
    torch.testing.assert_close(apply_focus_plan(small, base, generator=torch.Generator().manual_seed(1)),
                               apply_focus_plan(full, base, generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("kind", KINDS)
def test_focus_equals_deepfocus(kind, bases, tokenizers, fasttexts, deepfocus_env):
    from deepfocus import FOCUS

    plan, base, base_tok, new_tok, vectors, mask = _plan_and_base(kind, bases, tokenizers, fasttexts)
    ours, report = focus_initialize(base, base_tok, new_tok, vectors, mask, seed=42)
    reference = FOCUS(
        target_tokenizer=new_tok, source_tokenizer=base_tok, source_embeddings=base,
        fasttext_model_path=str(fasttexts[kind] / "fasttext.bin"), verbosity="silent", seed=42,
    )
    assert reference.shape == ours.shape
    fixed = torch.cat([plan.copy_new, plan.combine_new])
    torch.testing.assert_close(ours[fixed], reference[fixed], rtol=0, atol=1e-5)
    # Random rows: the same distribution; in fact the same draws (same generator, same order).
    drawn, ref_drawn = ours[plan.random_new], reference[plan.random_new]
    torch.testing.assert_close(drawn.mean(dim=0), ref_drawn.mean(dim=0), rtol=0, atol=1e-5)
    torch.testing.assert_close(drawn.std(dim=0), ref_drawn.std(dim=0), rtol=0, atol=1e-5)
    torch.testing.assert_close(drawn, ref_drawn, rtol=0, atol=1e-6)


# -------------------------------------------------------- 3. FOCUS: files, tied and untied heads


def _untied_copy(src: Path, dst: Path) -> Path:
    """The tiny model with its MLM decoder untied from the input embeddings (a different matrix)."""
    import shutil

    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(src, tie_word_embeddings=False)
    with torch.no_grad():
        decoder = model.get_output_embeddings()
        decoder.weight.copy_(torch.randn(decoder.weight.shape, generator=torch.Generator().manual_seed(3)))
        decoder.bias.copy_(torch.randn(decoder.bias.shape, generator=torch.Generator().manual_seed(4)))
    model.save_pretrained(dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def _headless_copy(src: Path, dst: Path) -> Path:
    """The tiny model as a bare encoder checkpoint (as LaBSE and multilingual-E5 are published)."""
    import shutil

    from transformers import AutoModel

    AutoModel.from_pretrained(src).save_pretrained(dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


@pytest.mark.parametrize("kind", KINDS)
def test_initialize_embeddings_tied_untied_headless(kind, bases, tokenizers, fasttexts, tmp_path):
    plan, base, base_tok, new_tok, vectors, mask = _plan_and_base(kind, bases, tokenizers, fasttexts)
    expected, _ = focus_initialize(base, base_tok, new_tok, vectors, mask, seed=11)
    weights = plan.weights_dense()
    n = len(new_tok)

    # Tied (the tiny models' MLM decoder is the input embedding matrix): input rows + the bias.
    report = initialize_embeddings(bases[kind], tokenizers[kind], fasttexts[kind], tmp_path / "tied", seed=11)
    tensors = load_file(tmp_path / "tied/embeddings.safetensors")
    assert sorted(tensors) == ["input_embeddings", "output_bias"] and report["tied"] == "true"
    torch.testing.assert_close(tensors["input_embeddings"], expected, rtol=0, atol=0)
    bias = load_base_embeddings(bases[kind])["bias"]
    assert tensors["output_bias"].shape == (n,)
    torch.testing.assert_close(tensors["output_bias"][plan.copy_new], bias[plan.copy_base])
    torch.testing.assert_close(tensors["output_bias"][plan.combine_new], (weights @ bias[plan.anchor_base].double()).float())
    torch.testing.assert_close(tensors["output_bias"][plan.random_new], bias.mean().expand(len(plan.random_new)))
    with safe_open(str(tmp_path / "tied/embeddings.safetensors"), "pt") as handle:
        assert handle.metadata()["tied"] == "true"
    saved = json.loads((tmp_path / "tied/report.json").read_text(encoding="utf-8"))
    assert saved["copied"] + saved["combined"] + saved["random"] == n and saved["examples"]

    # Untied: the decoder gets its own rows from the same plan.
    untied = _untied_copy(bases[kind], tmp_path / "untied-base")
    loaded = load_base_embeddings(untied)
    assert loaded["tied"] is False and not torch.equal(loaded["output"], loaded["input"])
    report = initialize_embeddings(untied, tokenizers[kind], fasttexts[kind], tmp_path / "untied", seed=11)
    tensors = load_file(tmp_path / "untied/embeddings.safetensors")
    assert sorted(tensors) == ["input_embeddings", "output_bias", "output_embeddings"] and report["tied"] == "false"
    torch.testing.assert_close(tensors["input_embeddings"], expected, rtol=0, atol=0)
    decoder = loaded["output"][: len(base_tok)]
    out = tensors["output_embeddings"]
    torch.testing.assert_close(out[plan.copy_new], decoder[plan.copy_base], rtol=0, atol=0)
    torch.testing.assert_close(out[plan.combine_new], (weights @ decoder[plan.anchor_base].double()).float())
    assert not torch.equal(out[plan.random_new], tensors["input_embeddings"][plan.random_new])

    # No MLM head at all: the input embeddings only.
    headless = _headless_copy(bases[kind], tmp_path / "headless-base")
    report = initialize_embeddings(headless, tokenizers[kind], fasttexts[kind], tmp_path / "headless", seed=11)
    tensors = load_file(tmp_path / "headless/embeddings.safetensors")
    assert sorted(tensors) == ["input_embeddings"] and report["tied"] == "no_head"
    torch.testing.assert_close(tensors["input_embeddings"], expected, rtol=0, atol=0)


def test_initialize_embeddings_refuses_mismatched_inputs(bases, tokenizers, fasttexts, tmp_path):
    with pytest.raises(InputError, match="another vocabulary"):
        initialize_embeddings(bases["bert"], tokenizers["bert"], fasttexts["xlmr"], tmp_path / "out")
    with pytest.raises(InputError, match="not found"):
        initialize_embeddings(bases["bert"], tmp_path / "nope", fasttexts["bert"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fasttext_model_is_dropped_unless_kept(tokenizers, tmp_path):
    corpus = tmp_path / "de.txt"
    corpus.write_text("\n".join(_german_lines()) + "\n", encoding="utf-8")
    report = train_token_fasttext(corpus, tokenizers["xlmr"], tmp_path / "ft",
                                  **{**FASTTEXT, "keep_model": False})
    assert sorted(p.name for p in (tmp_path / "ft").iterdir()) == ["report.json", "vectors.safetensors"]
    assert report["model_kept"] is False
