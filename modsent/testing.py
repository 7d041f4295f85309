"""Helpers for the tests and benchmarks; no production module imports this one.

The tiny random sentence encoders (:mod:`modsent.encoders.base_models.tiny`, also the workflow's
`builtin:tiny-*` base models) and random NLLB / M2M100 translation checkpoints built in code,
with a real tokenizer of the released models' kind learnt from the given texts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from modsent.encoders.base_models.tiny import (  # noqa: F401  (re-exported for the tests)
    BERT_SPECIAL_TOKENS, XLMR_SPECIAL_TOKENS, _sentencepiece, make_tiny_bert, make_tiny_xlmr, sample_texts)
from modsent.io import InputError, atomic_path

# ---- random checkpoints for tests and benchmarks ------------------------------------------

# Architectures of the released NLLB-200 checkpoints (config.json on the Hub), for random
# stand-ins of the same size: d_model, layers (encoder = decoder), heads, FFN width, vocabulary.
NLLB_SIZES = {
    "600M": dict(d_model=1024, layers=12, heads=16, ffn_dim=4096, model_vocab_size=256206),
    "1.3B": dict(d_model=1024, layers=24, heads=16, ffn_dim=8192, model_vocab_size=256206),
    "3.3B": dict(d_model=2048, layers=24, heads=16, ffn_dim=8192, model_vocab_size=256206),
}


def _spm_bpe(texts: Sequence[str], vocab_size: int):
    return _sentencepiece(list(texts), model_type="bpe", vocab_size=vocab_size,
                          normalization_rule_name="nmt_nfkc", unk_id=0, bos_id=1, eos_id=2, pad_id=-1)


def _nllb_tokenizer(texts: Sequence[str], vocab_size: int, out_dir: Path) -> int:
    """NLLB's tokenizer files, the real ones' pipeline on a BPE vocabulary learnt from ``texts``.

    Like facebook/nllb-200-*: fairseq ids ``<s>``=0 ``<pad>``=1 ``</s>``=2 ``<unk>``=3, then the
    sentencepiece pieces, then the 202 language codes as special tokens, then ``<mask>``;
    nmt_nfkc normaliser, Metaspace, template ``[src_lang] $A </s>``. Returns the token count.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    proto = _spm_bpe(texts, vocab_size)
    spm_path = out_dir / ".spm.model"
    spm_path.write_bytes(proto.SerializeToString())
    extracted = SentencePieceExtractor(str(spm_path)).extract(models.BPE)
    spm_path.unlink()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece, index in sorted(extracted["vocab"].items(), key=lambda item: item[1]):
        if index >= 3:  # sentencepiece's own <unk> <s> </s> are 0..2; pieces shift by one
            vocab[piece] = index + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=extracted["merges"], unk_token="<unk>",
                               fuse_unk=True, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "<pad>", "</s>", "<unk>")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in FAIRSEQ_LANGUAGE_CODES])
    tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=True, lstrip=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="eng_Latn $A </s>", pair="eng_Latn $A $B </s>",
        special_tokens=[("eng_Latn", tok.token_to_id("eng_Latn")), ("</s>", 2)])
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "NllbTokenizer", "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
              "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
              "additional_special_tokens": list(FAIRSEQ_LANGUAGE_CODES), "src_lang": None, "tgt_lang": None,
              "legacy_behaviour": False, "model_max_length": 1024}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return tok.get_vocab_size()


def _m2m100_tokenizer(texts: Sequence[str], vocab_size: int, out_dir: Path) -> int:
    """M2M100's tokenizer files (``M2M100Tokenizer``: sentencepiece.bpe.model + vocab.json with
    fairseq ids), language tokens ``__xx__`` after the vocabulary. Returns the model's
    vocabulary size: vocabulary + 100 language tokens + 8 "madeup words", as M2M100's."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    proto = _spm_bpe(texts, vocab_size)
    (out_dir / "sentencepiece.bpe.model").write_bytes(proto.SerializeToString())
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in proto.pieces:
        if piece.type == piece.NORMAL and piece.piece not in vocab:
            vocab[piece.piece] = len(vocab)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    config = {"tokenizer_class": "M2M100Tokenizer", "language_codes": "m2m100", "num_madeup_words": 8,
              "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "unk_token": "<unk>",
              "pad_token": "<pad>", "additional_special_tokens": [f"__{c}__" for c in codes],
              "src_lang": None, "tgt_lang": None, "model_max_length": 1024}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return len(vocab) + len(codes) + 8


def _make_random(kind: str, out_dir, texts, *, vocab_size, model_vocab_size, d_model, layers, heads,
                 ffn_dim, max_position_embeddings, init_std, seed, dtype) -> Path:
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    from modsent.training.seeding import private_cpu_stream

    if d_model % heads:
        raise InputError(f"d_model={d_model} must be a multiple of heads={heads}")
    with atomic_path(out_dir, directory=True) as tmp:
        if kind == "nllb":
            n_tokens = _nllb_tokenizer(texts, vocab_size, tmp)
        else:
            n_tokens = _m2m100_tokenizer(texts, vocab_size, tmp)
        config = M2M100Config(
            vocab_size=max(n_tokens, model_vocab_size or 0), d_model=d_model,
            encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
            decoder_attention_heads=heads, encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim,
            activation_function="relu", max_position_embeddings=max_position_embeddings,
            scale_embedding=True, init_std=init_std, dropout=0.1, attention_dropout=0.1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
            tokenizer_class="NllbTokenizer" if kind == "nllb" else "M2M100Tokenizer",
            architectures=["M2M100ForConditionalGeneration"],
        )
        with private_cpu_stream(seed):
            model = M2M100ForConditionalGeneration(config).to(getattr(torch, dtype)).eval()
        model.generation_config = GenerationConfig(bos_token_id=0, pad_token_id=1, eos_token_id=2,
                                                   decoder_start_token_id=2, max_length=200)
        model.save_pretrained(tmp)
    return Path(out_dir)


def make_random_nllb(out_dir: str | os.PathLike, texts: Sequence[str], *, vocab_size: int = 1000,
                     model_vocab_size: int | None = None, d_model: int = 32, layers: int = 2,
                     heads: int = 4, ffn_dim: int = 64, max_position_embeddings: int = 256,
                     init_std: float = 0.02, seed: int = 0, dtype: str = "float32") -> Path:
    """A random-weight NLLB-shaped checkpoint (``M2M100ForConditionalGeneration``, NLLB's
    config, an ``NllbTokenizer`` with a BPE vocabulary learnt from ``texts`` and NLLB's 202
    language codes) in ``out_dir``, atomically. Deterministic for the same arguments.

    ``vocab_size`` bounds the learnt vocabulary; ``model_vocab_size`` pads the model's
    embedding/output matrices to a real model's size (256206 for NLLB-200, see
    :data:`NLLB_SIZES`) for speed measurements. ``init_std`` 0.02 is NLLB's; a large one (1.0)
    makes the random model's outputs depend on the input, which tests use. Outputs are noise.
    """
    return _make_random("nllb", out_dir, texts, vocab_size=vocab_size, model_vocab_size=model_vocab_size,
                        d_model=d_model, layers=layers, heads=heads, ffn_dim=ffn_dim,
                        max_position_embeddings=max_position_embeddings, init_std=init_std,
                        seed=seed, dtype=dtype)


def make_random_m2m100(out_dir: str | os.PathLike, texts: Sequence[str], *, vocab_size: int = 1000,
                       d_model: int = 32, layers: int = 2, heads: int = 4, ffn_dim: int = 64,
                       max_position_embeddings: int = 256, init_std: float = 0.02, seed: int = 0,
                       dtype: str = "float32") -> Path:
    """A random-weight M2M100 checkpoint with an ``M2M100Tokenizer`` (sentencepiece BPE learnt
    from ``texts``, M2M100's 100 language tokens ``__xx__``), like :func:`make_random_nllb`."""
    return _make_random("m2m100", out_dir, texts, vocab_size=vocab_size, model_vocab_size=None,
                        d_model=d_model, layers=layers, heads=heads, ffn_dim=ffn_dim,
                        max_position_embeddings=max_position_embeddings, init_std=init_std,
                        seed=seed, dtype=dtype)


# The encoders of the released mT5 checkpoints (config.json on the Hub: d_model, d_kv, d_ff,
# layers, heads, relative-position buckets and their distance; every size has 250,112 pieces and
# gated-GELU), for random stand-ins of the same shape; m-ST5 uses the encoder alone
# (google/mt5-xxl is the paper's).
MT5_SIZES = {
    "small": dict(d_model=512, d_kv=64, d_ff=1024, layers=8, heads=6, buckets=32, max_distance=128),
    "base": dict(d_model=768, d_kv=64, d_ff=2048, layers=12, heads=12, buckets=32, max_distance=128),
    "large": dict(d_model=1024, d_kv=64, d_ff=2816, layers=24, heads=16, buckets=32, max_distance=128),
    "xl": dict(d_model=2048, d_kv=64, d_ff=5120, layers=24, heads=32, buckets=32, max_distance=128),
    "xxl": dict(d_model=4096, d_kv=64, d_ff=10240, layers=24, heads=64, buckets=32, max_distance=128),
}
MT5_VOCAB = 250_112


def make_random_mt5(out_dir: str | os.PathLike, texts: Sequence[str], *, vocab_size: int = 600,
                    model_vocab_size: int | None = None, d_model: int = 32, d_kv: int = 8, d_ff: int = 64,
                    layers: int = 2, heads: int = 4, buckets: int = 8, max_distance: int = 32,
                    encoder_only: bool = False, dtype: str = "float32", device: str = "cpu", seed: int = 0) -> Path:
    """A random mT5 checkpoint of the released models' kind in ``out_dir``: gated-GELU, an untied
    head, and a sentencepiece Unigram tokenizer with mT5's ids (<pad> 0, </s> 1, <unk> 2;
    "$A </s>") learnt from ``texts``. The whole encoder-decoder (``MT5ForConditionalGeneration``,
    one decoder layer), or with ``encoder_only`` the encoder alone (``MT5EncoderModel``: what
    m-ST5 loads of it, without a decoder to build and save at the large sizes).

    ``model_vocab_size`` pads the embedding to a real model's (:data:`MT5_VOCAB`; the sizes of
    :data:`MT5_SIZES`) for speed and memory measurements; ``device`` builds the weights there
    (a GPU draws an XXL's 5.6B weights in seconds; the CPU's draws are the deterministic ones:
    the same arguments give the same weights). Outputs are noise."""
    import torch
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import MT5Config, MT5EncoderModel, MT5ForConditionalGeneration

    from modsent.training.seeding import private_cpu_stream

    proto = _sentencepiece(texts, model_type="unigram", vocab_size=vocab_size, normalization_rule_name="nmt_nfkc",
                           pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    vocab = [(p.piece, 0.0 if p.type != p.NORMAL else p.score) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<pad>", "</s>", "<unk>")])
    config = MT5Config(vocab_size=max(tok.get_vocab_size(), model_vocab_size or 0), d_model=d_model, d_kv=d_kv,
                       d_ff=d_ff, num_layers=layers, num_decoder_layers=1, num_heads=heads,
                       relative_attention_num_buckets=buckets, relative_attention_max_distance=max_distance,
                       dropout_rate=0.1, feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0,
                       eos_token_id=1, decoder_start_token_id=0)
    model_class = MT5EncoderModel if encoder_only else MT5ForConditionalGeneration
    previous = torch.get_default_dtype()
    with atomic_path(out_dir, directory=True) as tmp, private_cpu_stream(seed), torch.device(device):
        torch.set_default_dtype(getattr(torch, dtype))
        try:
            model = model_class(config)
        finally:
            torch.set_default_dtype(previous)
        model.save_pretrained(tmp)
        del model
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>",
             "unk_token": "<unk>"}))
    return Path(out_dir)


# ---- pairs for batching tests and benchmarks -----------------------------------------------


def two_length_datasets():
    """Pairs of two datasets of very different lengths, for batching tests and benchmarks: the
    built-in paraphrases (names of countries, currencies and a few UI messages: 5-52
    characters) and consecutive docstring sentences of the standard library as pairs (30-250
    characters; a batching fixture, not paraphrases). Columns: dataset, anchor, positive,
    negative."""
    import pandas as pd

    from modsent.sources.builtin import builtin_paraphrases

    names = builtin_paraphrases()[["dataset", "anchor", "positive", "negative"]]
    sentences = sample_texts(600)
    docs = pd.DataFrame({"dataset": "docstrings", "anchor": sentences[0::2], "positive": sentences[1::2],
                         "negative": None})
    return pd.concat([names, docs], ignore_index=True)
