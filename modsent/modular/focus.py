"""Step 3 of monolingual specialisation: FOCUS initialisation of the new token embeddings.

FOCUS (Dobler & de Melo 2023, "FOCUS: Effective Embedding Initialization for Monolingual
Specialization of Multilingual Models") builds the embedding matrix for a new, language-specific
vocabulary from the base model's matrix:

1. *Copied*: a new token that the base vocabulary also has (compared in a canonical form that
   ignores the tokenizers' word-boundary conventions, see :func:`canonical_token`) takes its base
   embedding. Special tokens map to the base's special token of the same role (``pad_token`` to
   ``pad_token``, ...), which for our tokenizers is the same string anyway.
2. *Combined*: every other new token with a fastText vector becomes a convex combination of the
   copied ("overlapping") tokens' base embeddings. The weights are sparsemax over the cosine
   similarities between the new token's fastText vector and the overlapping tokens' fastText
   vectors; only overlapping tokens that have a fastText vector take part (the *anchors*).
3. *Random*: new tokens without a fastText vector (rarer than fastText's ``min_count``) are
   drawn from a normal distribution with the per-dimension mean and standard deviation of the
   base embeddings, one token after another in id order from ``torch.Generator().manual_seed(seed)``.

Reference implementation: deepfocus 1.0.1 (PyPI, by the paper's authors). This module follows it
exactly (tests/test_specialization.py compares the two on the same inputs): exact matching of
canonical forms (deepfocus' defaults ``exact_match_all=True``, no fuzzy or symbol matching);
deepfocus' canonicalisation; where several base tokens share a canonical form the one with the
highest id wins (what deepfocus' ``construct_vocab_view`` does; none of multilingual-e5's 250,002
pieces shares one); sparsemax from ``entmax``; similarities and weighted sums in float64 (deepfocus:
``fastdist`` in float64); the same random stream. It is our own code because deepfocus declares
the ``fasttext`` package (whose sdist compiles and shadows fasttext-numpy2, the one that works with
numpy 2), caches tokenised text and models under ``~/.cache/deepfocus``, downloads vectors in its
word-level mode, pulls numba (via fastdist) and tokenises through ``datasets``; and because it
holds the whole new-tokens x anchors similarity matrix in memory (50K x 50K float64 = 20 GB).

Memory: the similarities are computed for ``chunk_size`` new tokens at a time (default 1024:
1024 x anchors float64, 0.4 GB for 50K anchors, and sparsemax holds about three arrays of that
size); only the sparse weights (tens of non-zeros per token) are kept, and the weighted sums are
one sparse-dense product. A 50,000-token vocabulary on multilingual-e5-small (16,307 combined
tokens, 5,125 anchors) took 10 s including loading the model; deepfocus took 54-159 s on the
same inputs and agreed to 1.5e-8 (random rows bit for bit). Sparsemax sorts only the top ``k`` similarities per
row and widens k where the support is larger (entmax's exact partial-sort mode), which gives the
same result as a full sort.

Besides the input embeddings, a base model with an MLM head gets the head's vocabulary-sized
parameters initialised the same way (same copies, same sparsemax weights): the decoder bias
always, and the decoder (output) embeddings when they are not tied to the input embeddings.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from modsent.io import InputError, atomic_path, write_safetensors
from modsent.modular.tokenizer_training import SPECIAL_ROLES, load_tokenizer

log = logging.getLogger(__name__)

WORD_START = "▁"  # the canonical word-start mark (SentencePiece's)
BYTE_LEVEL_SPACE = "Ġ"
CONVENTIONS = ("wordpiece", "sentencepiece", "bytelevel")
EMBEDDINGS_NAME = "embeddings.safetensors"
REPORT_NAME = "report.json"
_BYTE_FALLBACK = re.compile(r"<0x[0-9,A-F]{2}>")  # deepfocus' pattern for sentencepiece byte pieces


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table of byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


_BYTE_DECODER = {char: byte for byte, char in _bytes_to_unicode().items()}


def canonical_token(token: str, convention: str, *, continuing_prefix: str = "##") -> str:
    """The token in a form comparable across tokenizers: ``"▁word"`` for a piece that starts a
    word, the bare text for a piece inside a word (deepfocus' canonicalisation, from strings).

    - ``wordpiece``: ``"##ing"`` → ``"ing"``; ``"walk"`` → ``"▁walk"`` (a WordPiece token
      without the continuation prefix starts a word).
    - ``sentencepiece``: ``"▁walk"`` → ``"▁walk"``; ``"ing"`` → ``"ing"``; inner ``▁`` become
      spaces and leading whitespace of the text is dropped, as decoding does; byte pieces
      (``<0x0A>``) stay as they are.
    - ``bytelevel``: ``"Ġwalk"`` → ``"▁walk"``; ``"ing"`` → ``"ing"``; the byte characters are
      decoded to UTF-8 text (an incomplete character becomes U+FFFD, as in decoding).
    """
    if convention == "wordpiece":
        if token.startswith(continuing_prefix):
            return token[len(continuing_prefix):]
        return WORD_START + token
    if convention == "sentencepiece":
        if _BYTE_FALLBACK.match(token):
            return token
        body = token.replace(WORD_START, " ").lstrip()
        return WORD_START + body if token.startswith(WORD_START) else body
    if convention == "bytelevel":
        if all(char in _BYTE_DECODER for char in token):
            text = bytes(_BYTE_DECODER[char] for char in token).decode("utf-8", errors="replace")
        else:  # an added token such as "<|endoftext|>" is plain text
            text = token
        body = text.lstrip()
        return WORD_START + body if token.startswith(BYTE_LEVEL_SPACE) else body
    raise ValueError(f"unknown tokenizer convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def tokenizer_convention(tokenizer) -> tuple[str, str]:
    """(convention, continuing-subword prefix) of a fast tokenizer, read from its pipeline."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    parts = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    prefix = model.get("continuing_subword_prefix") or "##"
    if model["type"] == "WordPiece":
        return "wordpiece", prefix
    if model["type"] == "Unigram" or '"Metaspace"' in parts:
        return "sentencepiece", prefix
    if '"ByteLevel"' in parts:
        return "bytelevel", prefix
    if model.get("continuing_subword_prefix"):
        return "wordpiece", prefix
    raise InputError(f"tokenizer {tokenizer.name_or_path}: cannot tell its word-boundary convention "
                     f"(model {model['type']}, no Metaspace, ByteLevel or continuation prefix)")


def canonical_vocab(vocab: dict[str, int], convention: str, *, continuing_prefix: str = "##") -> dict[str, int]:
    """Canonical form → id; where forms collide the highest id wins (as in deepfocus)."""
    out: dict[str, int] = {}
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        out[canonical_token(token, convention, continuing_prefix=continuing_prefix)] = index
    return out


@dataclass
class FocusPlan:
    """What :func:`focus_plan` decided for each new token; :func:`apply_focus_plan` turns it into
    rows of any base matrix with one row per base token (input or output embeddings, a bias)."""

    num_new: int
    copy_new: torch.Tensor  # new ids that copy a base row ...
    copy_base: torch.Tensor  # ... from these base ids
    anchor_new: torch.Tensor  # new ids of the anchors (copied tokens with a fastText vector) ...
    anchor_base: torch.Tensor  # ... and their base ids
    combine_new: torch.Tensor  # new ids initialised as sparsemax combinations
    weight_rows: torch.Tensor  # index into combine_new
    weight_cols: torch.Tensor  # index into anchor_base
    weight_values: torch.Tensor  # float64 sparsemax weights (each row sums to 1)
    random_new: torch.Tensor  # new ids drawn at random, ascending
    report: dict = field(default_factory=dict)

    def weights_dense(self) -> torch.Tensor:
        """The [len(combine_new), len(anchor_base)] weight matrix (for inspection and tests)."""
        dense = torch.zeros(len(self.combine_new), len(self.anchor_base), dtype=torch.float64)
        dense[self.weight_rows, self.weight_cols] = self.weight_values
        return dense


def _as_tensor(array, dtype=None) -> torch.Tensor:
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.asarray(array))
    return tensor.to(dtype) if dtype is not None else tensor


def _cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


def focus_plan(
    base_vocab: dict[str, int],
    new_vocab: dict[str, int],
    new_vectors,
    new_vector_mask,
    *,
    base_convention: str,
    new_convention: str,
    base_prefix: str = "##",
    new_prefix: str = "##",
    special_map: dict[int, int] | None = None,
    chunk_size: int = 1024,
    sparsemax_k: int | None = 128,
) -> FocusPlan:
    """Decide copy / combine / random for every new token and compute the sparsemax weights.

    ``new_vectors`` [num_new, dim] and ``new_vector_mask`` [num_new] are the fastText vectors by
    new token id (:func:`modsent.modular.fasttext_embeddings.load_token_vectors`). ``special_map`` (new id
    → base id) overrides the canonical match for special tokens.
    """
    import entmax

    vectors = _as_tensor(new_vectors, torch.float64)
    mask = _as_tensor(new_vector_mask).to(torch.bool)
    num_new = max(new_vocab.values()) + 1
    if vectors.shape[0] != num_new or mask.shape[0] != num_new:
        raise InputError(f"fastText vectors have {vectors.shape[0]} rows for a vocabulary of {num_new} ids")
    # A vector of zeros has no direction: deepfocus counts it as "no vector" too.
    mask = mask & (vectors.abs().sum(dim=1) > 0)

    base_canonical = canonical_vocab(base_vocab, base_convention, continuing_prefix=base_prefix)
    copies: dict[int, int] = {}
    for token, new_id in new_vocab.items():
        base_id = base_canonical.get(canonical_token(token, new_convention, continuing_prefix=new_prefix))
        if base_id is not None:
            copies[new_id] = base_id
    copies.update(special_map or {})

    copy_new = torch.tensor(sorted(copies), dtype=torch.long)
    copy_base = torch.tensor([copies[i] for i in copy_new.tolist()], dtype=torch.long)
    is_copied = torch.zeros(num_new, dtype=torch.bool)
    is_copied[copy_new] = True
    anchor_new = copy_new[mask[copy_new]]
    anchor_base = copy_base[mask[copy_new]]
    ids = torch.arange(num_new)
    combine_new = ids[~is_copied & mask]
    random_new = ids[~is_copied & ~mask]
    if len(combine_new) and not len(anchor_new):
        raise InputError("FOCUS needs anchors: no token of the new vocabulary is both in the base "
                         "vocabulary and has a fastText vector")

    rows, cols, values = [], [], []
    support = torch.zeros(len(combine_new), dtype=torch.long)
    if len(combine_new):
        anchors = vectors[anchor_new]
        anchors = anchors / anchors.norm(dim=1, keepdim=True)
        k = sparsemax_k if sparsemax_k is not None and sparsemax_k < len(anchor_new) else None
        for start in range(0, len(combine_new), chunk_size):
            chunk = vectors[combine_new[start:start + chunk_size]]
            similarity = (chunk / chunk.norm(dim=1, keepdim=True)) @ anchors.T
            weights = entmax.sparsemax(similarity, dim=-1, k=k)
            r, c = weights.nonzero(as_tuple=True)
            rows.append(r + start)
            cols.append(c)
            values.append(weights[r, c])
            support[start:start + len(chunk)] = (weights > 0).sum(dim=1)
            del similarity, weights
    plan = FocusPlan(
        num_new=num_new, copy_new=copy_new, copy_base=copy_base, anchor_new=anchor_new, anchor_base=anchor_base,
        combine_new=combine_new, weight_rows=_cat(rows, torch.long), weight_cols=_cat(cols, torch.long),
        weight_values=_cat(values, torch.float64), random_new=random_new,
    )
    support_f = support.double()
    plan.report = {
        "new_vocab_size": num_new,
        "base_vocab_size": len(base_vocab),
        "conventions": {"base": base_convention, "new": new_convention},
        "copied": len(copy_new),
        "combined": len(combine_new),
        "random": len(random_new),
        "anchors": len(anchor_new),
        "copied_without_vector": len(copy_new) - len(anchor_new),
        "special_tokens_mapped": len(special_map or {}),
        "sparsemax_support": {
            "mean": round(support_f.mean().item(), 3) if len(support) else None,
            "median": int(support.median().item()) if len(support) else None,
            "max": int(support.max().item()) if len(support) else None,
        },
    }
    return plan


def apply_focus_plan(plan: FocusPlan, base_matrix: torch.Tensor, *, random: str = "normal",
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Rows of a new matrix from ``base_matrix`` [base rows, ...] (2-D embeddings or a 1-D bias).

    Copied rows are copied, combined rows are the weighted sums (in float64), random rows are
    ``torch.normal(mean, std, generator)`` one token at a time in id order (``random="normal"``,
    deepfocus' stream) or the mean row (``random="mean"``, used for biases).
    """
    one_d = base_matrix.dim() == 1
    base = (base_matrix.unsqueeze(1) if one_d else base_matrix).detach().float()
    out = torch.zeros(plan.num_new, base.shape[1], dtype=torch.float32)
    out[plan.copy_new] = base[plan.copy_base]
    if len(plan.combine_new):
        weights = torch.sparse_coo_tensor(
            torch.stack([plan.weight_rows, plan.weight_cols]), plan.weight_values,
            (len(plan.combine_new), len(plan.anchor_base)), check_invariants=False,
        )
        combined = torch.sparse.mm(weights, base[plan.anchor_base].double())
        out[plan.combine_new] = combined.float()
    if len(plan.random_new):
        mean = base.mean(dim=0)
        if random == "normal":
            std = base.std(dim=0)
            for index in plan.random_new.tolist():
                out[index] = torch.normal(mean, std, generator=generator)
        elif random == "mean":
            out[plan.random_new] = mean
        else:
            raise ValueError(f"random must be 'normal' or 'mean', not {random!r}")
    out = out.to(base_matrix.dtype)
    return out.squeeze(1) if one_d else out


def special_token_map(base_tokenizer, new_tokenizer) -> dict[int, int]:
    """New id → base id for each special-token role both tokenizers define."""
    mapping = {}
    for role in SPECIAL_ROLES:
        new_token, base_token = getattr(new_tokenizer, role, None), getattr(base_tokenizer, role, None)
        if new_token is not None and base_token is not None:
            mapping[new_tokenizer.convert_tokens_to_ids(str(new_token))] = base_tokenizer.convert_tokens_to_ids(str(base_token))
    return mapping


def focus_initialize(
    base_embeddings: torch.Tensor,
    base_tokenizer,
    new_tokenizer,
    new_vectors,
    new_vector_mask,
    *,
    seed: int = 42,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, dict]:
    """FOCUS embeddings [len(new_tokenizer), dim] for ``new_tokenizer`` and a report with the
    counts ``copied`` / ``combined`` / ``random`` (see the module docstring).

    ``base_embeddings``: the base model's input embeddings, one row per base token id (rows
    beyond ``len(base_tokenizer)`` are ignored); ``new_vectors``/``new_vector_mask``: fastText
    vectors by new token id. Tokenizers are fast transformers tokenizers.
    """
    plan = _plan_for(base_tokenizer, new_tokenizer, new_vectors, new_vector_mask, chunk_size)
    base = _base_rows(base_embeddings, base_tokenizer, "input embeddings")
    generator = torch.Generator().manual_seed(seed)
    embeddings = apply_focus_plan(plan, base, generator=generator)
    return embeddings, {**plan.report, "seed": seed}


def _plan_for(base_tokenizer, new_tokenizer, vectors, mask, chunk_size: int) -> FocusPlan:
    base_convention, base_prefix = tokenizer_convention(base_tokenizer)
    new_convention, new_prefix = tokenizer_convention(new_tokenizer)
    return focus_plan(
        base_tokenizer.get_vocab(), new_tokenizer.get_vocab(), vectors, mask,
        base_convention=base_convention, new_convention=new_convention,
        base_prefix=base_prefix, new_prefix=new_prefix,
        special_map=special_token_map(base_tokenizer, new_tokenizer), chunk_size=chunk_size,
    )


def _base_rows(matrix: torch.Tensor, base_tokenizer, what: str) -> torch.Tensor:
    """The rows of a base matrix that base token ids address (a model may have spare rows)."""
    rows = len(base_tokenizer)
    if matrix.shape[0] < rows:
        raise InputError(f"base model: the {what} have {matrix.shape[0]} rows but the base tokenizer "
                         f"has {rows} tokens")
    return matrix[:rows]


def load_base_embeddings(base_model_dir: str | Path) -> dict:
    """The base model's vocabulary-sized parameters.

    Returns ``{"input": [V, d], "output": [V, d] or None, "bias": [V] or None, "tied": bool or
    None}``: ``output``/``bias`` come from the MLM head if the checkpoint has one (``tied`` says
    whether its decoder shares the input embeddings; then ``output`` is None); a checkpoint
    without an MLM head (a sentence encoder such as LaBSE or multilingual-E5) gives the input
    embeddings only.
    """
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    base_model_dir = Path(base_model_dir)
    try:
        config = AutoConfig.from_pretrained(str(base_model_dir), local_files_only=True)
    except (OSError, ValueError) as err:
        raise InputError(f"{base_model_dir}: cannot read the base model's config: {err}") from err
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialised head" warnings are expected here
    try:
        try:
            model, info = AutoModelForMaskedLM.from_pretrained(
                str(base_model_dir), config=config, local_files_only=True, output_loading_info=True
            )
            has_head = not info.get("missing_keys")
        except ValueError:  # no masked-LM class for this architecture
            model, has_head = AutoModel.from_pretrained(str(base_model_dir), config=config, local_files_only=True), False
    finally:
        transformers.logging.set_verbosity(verbosity)
    inputs = model.get_input_embeddings().weight.detach()
    result = {"input": inputs, "output": None, "bias": None, "tied": None}
    head = model.get_output_embeddings() if has_head else None
    if head is not None:
        tied = head.weight.data_ptr() == inputs.data_ptr()
        result["tied"] = tied
        result["output"] = None if tied else head.weight.detach()
        bias = getattr(head, "bias", None)
        result["bias"] = bias.detach() if bias is not None else None
    return result


def initialize_embeddings(
    base_model_dir: str | Path,
    tokenizer_dir: str | Path,
    fasttext_dir: str | Path,
    out_dir: str | Path,
    seed: int = 42,
    *,
    chunk_size: int = 1024,
) -> dict:
    """Write FOCUS embeddings for the tokenizer in ``tokenizer_dir`` to ``out_dir`` (atomically).

    ``out_dir/embeddings.safetensors``: ``input_embeddings`` [len(tokenizer), hidden]; if the base
    checkpoint has an MLM head also ``output_bias`` [len(tokenizer)] and, when its decoder is not
    tied to the input embeddings, ``output_embeddings`` [len(tokenizer), hidden] (metadata ``tied``:
    "true", "false" or "no_head"). Random rows of the output embeddings continue the input's
    random stream; random rows of the bias get the base bias' mean. ``out_dir/report.json``: the
    counts and settings, also returned.
    """
    from modsent.modular.fasttext_embeddings import load_token_vectors, vocab_fingerprint

    start = time.perf_counter()
    base_tokenizer = load_tokenizer(base_model_dir, "base model tokenizer")
    new_tokenizer = load_tokenizer(tokenizer_dir, "new tokenizer")
    vectors, mask = load_token_vectors(fasttext_dir, new_tokenizer)
    base = load_base_embeddings(base_model_dir)
    plan = _plan_for(base_tokenizer, new_tokenizer, vectors, mask, chunk_size)
    generator = torch.Generator().manual_seed(seed)
    tensors = {"input_embeddings": apply_focus_plan(
        plan, _base_rows(base["input"], base_tokenizer, "input embeddings"), generator=generator)}
    if base["output"] is not None:
        tensors["output_embeddings"] = apply_focus_plan(
            plan, _base_rows(base["output"], base_tokenizer, "output embeddings"), generator=generator)
    if base["bias"] is not None:
        tensors["output_bias"] = apply_focus_plan(
            plan, _base_rows(base["bias"], base_tokenizer, "output bias"), random="mean")
    tied = "no_head" if base["tied"] is None else str(base["tied"]).lower()
    report = {
        **plan.report,
        "seed": seed,
        "chunk_size": chunk_size,
        "base_model": str(base_model_dir),
        "tokenizer": str(tokenizer_dir),
        "fasttext": str(fasttext_dir),
        "tied": tied,
        "tensors": {name: list(t.shape) for name, t in tensors.items()},
        "examples": _examples(plan, base_tokenizer, new_tokenizer),
        "seconds": round(time.perf_counter() - start, 3),
    }
    with atomic_path(out_dir, directory=True) as tmp:
        write_safetensors({k: v.contiguous() for k, v in tensors.items()}, tmp / EMBEDDINGS_NAME, {
            "format": "pt", "tied": tied, "vocab_sha256": vocab_fingerprint(new_tokenizer),
        })
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("FOCUS: %d copied, %d combined, %d random (%.1f s) -> %s", report["copied"],
             report["combined"], report["random"], report["seconds"], out_dir)
    return report


def _examples(plan: FocusPlan, base_tokenizer, new_tokenizer, count: int = 10, top: int = 5) -> list[dict]:
    """A few combined tokens with their heaviest anchors, spread over the vocabulary (for reading)."""
    if not len(plan.combine_new):
        return []
    picks = np.linspace(0, len(plan.combine_new) - 1, num=min(count, len(plan.combine_new))).round().astype(int)
    examples = []
    for row in sorted(set(picks.tolist())):
        selected = plan.weight_rows == row
        cols, values = plan.weight_cols[selected], plan.weight_values[selected]
        order = values.argsort(descending=True)[:top]
        examples.append({
            "token": new_tokenizer.convert_ids_to_tokens(int(plan.combine_new[row])),
            "anchors": {base_tokenizer.convert_ids_to_tokens(int(plan.anchor_base[cols[i]])): round(float(values[i]), 4)
                        for i in order.tolist()},
        })
    return examples
