"""Step 1 of monolingual specialisation: a new tokenizer for one language.

The new tokenizer is of the base model's kind, trained on the language's corpus (one sentence a
line): WordPiece for BERT/LaBSE-style bases, Unigram (sentencepiece-style, Metaspace "▁") for
XLM-R/E5-style bases. The kind is the ``model.type`` of the base's ``tokenizer.json``.

We use transformers' ``train_new_from_iterator``, which empties the base tokenizer's model and
trains a new one with the matching ``tokenizers`` trainer while keeping everything else of the
base: normaliser, pre-tokenizer, decoder, post-processor (its special-token ids are re-resolved
in the new vocabulary) and the special tokens themselves (same strings, placed first in the new
vocabulary). Checked for both kinds (tests/test_specialization.py):

- WordPiece: the ``##`` continuation prefix, BertNormalizer and BertPreTokenizer are kept; the
  five BERT specials become ids 0-4 in the order of their base ids, so ``[PAD]`` keeps id 0 (the
  ``pad_token_id`` of BERT configs) while ``[UNK]``/``[CLS]``/``[SEP]``/``[MASK]`` (100-103 in
  LaBSE) move to 1-4.
- Unigram: the Precompiled normaliser and Metaspace are kept; ``<s>``=0, ``<pad>``=1,
  ``</s>``=2, ``<unk>``=3 keep XLM-R's ids and ``<mask>`` (the base's last id) becomes 4.

The special-token ids of a base model's config therefore stay right wherever they are small; the
language-adapter stage takes the ids from the new tokenizer anyway.

Facts to know:

- transformers 5 rebuilds XLM-R tokenizers in ``XLMRobertaTokenizer.__init__`` (a
  WhitespaceSplit before Metaspace; the Precompiled normaliser without the "collapse spaces"
  Replace of the original tokenizer.json). That happens to the *base* tokenizer as well, when it
  is loaded, so the new tokenizer has exactly the pipeline the base model is used with.
- Text in the corpus that spells an added token (``<s>``, ``</s>``, ``[CLS]``...) is replaced by a
  space before training. Encoding cuts added tokens out of the text before the model sees it,
  so the model never needs them; left in, the Unigram trainer learned ``<s>`` from Python
  docstrings (171,028 lines, 50,000 pieces) as an ordinary piece, whose id then replaced the
  special token's (``convert_tokens_to_ids("<s>")`` gave 33556, not 0).
- The ``tokenizers`` trainers are not deterministic, even within one process (Rust hash maps
  decide ties). Measured on 15,000 English sentences at 8,000 tokens: Unigram gave the same set
  of pieces in every run but ~2,000 ids permuted among equal-score pieces (scores differing by
  <1e-10); WordPiece differed in 16 tokens (0.2%, equal-count merges at the cut-off) and most
  ids. A Unigram tokenizer is therefore written canonically (:func:`canonical_unigram_file`).
  The WordPiece trainer (BPE's, with ``##``) numbers the pieces ``##c`` of characters inside
  words in hash order and breaks ties between merges of equal count by those numbers; its
  initial vocabulary (the characters by code point, then the ``##c`` sorted) is therefore given
  to it first as special tokens (:func:`wordpiece_initial_pieces`: a training of no merges on
  the same text finds it), which makes its training deterministic, and made ordinary pieces again
  in the saved files (:func:`unpin_wordpiece_pieces`). Every training on the same text then
  writes the same bytes, of either kind, and so does everything built on it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from modsent.io import InputError, atomic_path, iter_utf8_lines, record_added_tokens

log = logging.getLogger(__name__)

#: tokenizer.json ``model.type`` → our name of the kind.
TOKENIZER_KINDS = {"WordPiece": "wordpiece", "Unigram": "unigram"}
#: A trained vocabulary smaller than this share of the requested size means the corpus is too small.
MIN_VOCAB_FRACTION = 0.9
#: Special-token roles of transformers tokenizers.
SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: Written next to the tokenizer files: what was trained from what.
REPORT_NAME = "modsent_tokenizer.json"
# Distinct words are counted for error messages only; beyond this many per requested token the
# count stops (it can only say "at least").
_WORD_COUNT_CAP_FACTOR = 4


def load_tokenizer(path: str | Path, what: str = "tokenizer"):
    """A fast (``tokenizers``-backed) transformers tokenizer from a local directory."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: {what} directory not found")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot load a {what} from this directory: {err}") from err
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"{path}: the {what} has no tokenizer.json (a fast tokenizer is needed)")
    return tokenizer


def tokenizer_model_type(tokenizer) -> str:
    """The ``model.type`` of the tokenizer's tokenizer.json: WordPiece, Unigram, BPE, WordLevel."""
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"]


def tokenizer_kind(tokenizer) -> str:
    """``"wordpiece"`` or ``"unigram"``; InputError for any other kind of base tokenizer."""
    model_type = tokenizer_model_type(tokenizer)
    if model_type not in TOKENIZER_KINDS:
        raise InputError(
            f"base tokenizer {tokenizer.name_or_path}: a {model_type} tokenizer is not supported; "
            f"supported kinds: {', '.join(TOKENIZER_KINDS)} (BERT/LaBSE and XLM-R/E5 style)"
        )
    return TOKENIZER_KINDS[model_type]


def special_tokens(tokenizer) -> dict[str, str]:
    """Role → token string for the special tokens the tokenizer defines (e.g. pad_token → [PAD])."""
    out = {}
    for role in SPECIAL_ROLES:
        token = getattr(tokenizer, role, None)
        if token is not None:
            out[role] = str(token)
    return out


class _CorpusBatches:
    """Batches of non-empty lines of a corpus, read strictly as UTF-8, with counts on the way;
    added-token text becomes a space (see the module docstring)."""

    def __init__(self, path: Path, max_sentences: int | None, batch_size: int, word_cap: int,
                 added_tokens: list[str]):
        self.path, self.max_sentences, self.batch_size, self.word_cap = path, max_sentences, batch_size, word_cap
        self.added = re.compile("|".join(map(re.escape, sorted(added_tokens, key=len, reverse=True)))) if added_tokens else None
        self._count_afresh()

    def _count_afresh(self) -> None:
        """The counts of a pass; every pass counts afresh (a WordPiece training reads the corpus twice)."""
        self.added_removed = 0
        self.sentences = 0
        self.characters: set[str] = set()
        self.words: set[str] = set()
        self.words_capped = False

    def __iter__(self) -> Iterator[list[str]]:
        self._count_afresh()
        batch: list[str] = []
        for _, line in iter_utf8_lines(self.path):
            if not line.strip():
                continue
            if self.max_sentences is not None and self.sentences >= self.max_sentences:
                break
            self.sentences += 1
            if self.added is not None:
                line, removed = self.added.subn(" ", line)
                self.added_removed += removed
            self.characters.update(line)
            if not self.words_capped:
                self.words.update(line.split())
                self.words_capped = len(self.words) >= self.word_cap
            batch.append(line)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch


def _first_nonempty_line(path: Path) -> int | None:
    for number, line in iter_utf8_lines(path):
        if line.strip():
            return number
    return None


def wordpiece_initial_pieces(base, batches) -> list[str]:
    """The vocabulary the WordPiece trainer starts from on these batches, in the order it would
    number it but for hash order: the characters by code point, then the pieces ``##c`` of the
    characters met inside words, sorted. The trainer numbers the ``##c`` in the order of a hash
    map's iteration, and its merges of equal count go by those numbers, so two trainings on the
    same text learned other pieces near the cut-off. Given to it first, as special tokens in this
    order, they get the same numbers every time and the training is deterministic, with ties
    broken as an ordinary training breaks them but for that order
    (:func:`unpin_wordpiece_pieces` makes them ordinary pieces again). Found by the trainer itself
    (a training of no merges through ``train_new_from_iterator``), so they are exactly its own
    whatever normaliser, pre-tokenizer and trainer settings the base brings."""
    probe = base.train_new_from_iterator(iter(batches), vocab_size=0, show_progress=False)
    added = set(probe.get_added_vocab())
    own = [piece for piece in probe.backend_tokenizer.get_vocab() if piece not in added]
    return sorted(piece for piece in own if len(piece) == 1) + sorted(piece for piece in own if len(piece) > 1)


def unpin_wordpiece_pieces(directory: str | Path, pinned: list[str]) -> None:
    """Undo the special-token side of :func:`wordpiece_initial_pieces` in a saved tokenizer: the
    pinned pieces stay in the vocabulary at their ids, as ordinary pieces (as the trainer makes
    them), not as added special tokens (which would cut them out of text before the model saw
    it)."""
    directory = Path(directory)
    pinned_set = set(pinned)
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"] = [token for token in data["added_tokens"] if token["content"] not in pinned_set]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for key in ("extra_special_tokens", "additional_special_tokens"):
        if key in config:
            kept = [token for token in config[key]
                    if (token if isinstance(token, str) else token.get("content")) not in pinned_set]
            if kept:
                config[key] = kept
            else:
                del config[key]
    if isinstance(config.get("added_tokens_decoder"), dict):
        config["added_tokens_decoder"] = {i: token for i, token in config["added_tokens_decoder"].items()
                                          if token.get("content") not in pinned_set}
    path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


#: Decimals a Unigram piece's score keeps (:func:`canonical_unigram_file`): runs differ by ~1e-15.
UNIGRAM_SCORE_DECIMALS = 8
_REQUIRED_CHAR_STEP = 1e-4  # tokenizers' Unigram trainer: the score step between appended characters
#: How far from a rung of that ladder a rounded score may be and still be on it (the rounding's half
#: unit and the trainer's accumulated float error, ~1e-15 a step).
_LADDER_TOLERANCE = 2e-8


def canonical_unigram_file(path: str | Path) -> None:
    """Rewrite a trained Unigram ``tokenizer.json`` so that every training on the same text
    writes the same bytes. The trainer sums scores in the order of Rust hash maps, which differs
    from process to process and from call to call: the same pieces come out, their log
    probabilities ~1e-15 apart, and pieces of equal score in any order, so their ids move (the
    demo's German tokenizer: 162 of 4,000 ids moved between two runs, and with them the
    embeddings, the adapters and the scores built on it). Here each score is rounded to
    :data:`UNIGRAM_SCORE_DECIMALS` decimals and the pieces are ordered by score, highest first,
    then by their text (the characters the trainer appends last, numbered by their scores in hash
    order, by their text); the added tokens (``<s>``, ``<pad>``, ``</s>``, ``<unk>``, ``<mask>``)
    keep their ids. Segmentation is the trainer's but where two segmentations' scores were
    within the rounding of each other."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    fixed = {token["id"] for token in data.get("added_tokens", [])}
    free = [i for i in range(len(vocab)) if i not in fixed]
    pieces = sorted(([piece, round(float(score), UNIGRAM_SCORE_DECIMALS)] for piece, score in (vocab[i] for i in free)),
                    key=lambda entry: (-entry[1], entry[0]))
    # The characters the corpus needs but training dropped are appended by the trainer with the
    # scores min, min + 1e-4, min + 2e-4, ... (min: the lowest learned score) in hash order:
    # their scores only number them. They are found by their scores on that ladder (learned
    # pieces whose scores fall between its rungs stay where they are: the demo's Chinese had one
    # among 256 appended characters) and, ordered by text, take the ladder's scores in turn.
    lowest = min(entry[1] for entry in pieces)
    rungs: dict[int, list[int]] = {}
    for i, (_, score) in enumerate(pieces):
        k = round((score - lowest) / _REQUIRED_CHAR_STEP)
        if abs(score - lowest - k * _REQUIRED_CHAR_STEP) <= _LADDER_TOLERANCE:
            rungs.setdefault(k, []).append(i)
    ladder = []
    k = 0
    while k in rungs:  # the rungs are consecutive from the lowest score up
        ladder += rungs[k]
        k += 1
    if len(ladder) > 1:
        scores = sorted((pieces[i][1] for i in ladder), reverse=True)
        texts = sorted(pieces[i][0] for i in ladder)
        for i, text, score in zip(sorted(ladder), texts, scores):
            pieces[i] = [text, score]
        pieces.sort(key=lambda entry: (-entry[1], entry[0]))
    for i, entry in zip(free, pieces):
        vocab[i] = entry
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def train_tokenizer(
    corpus_path: str | Path,
    base_tokenizer_dir: str | Path,
    out_dir: str | Path,
    vocab_size: int,
    max_sentences: int | None = None,
    *,
    min_vocab_fraction: float = MIN_VOCAB_FRACTION,
    batch_size: int = 1000,
) -> dict:
    """Train a tokenizer of the base's kind on ``corpus_path`` and save it to ``out_dir``.

    ``corpus_path``: UTF-8 text, one sentence a line; empty lines are skipped and the first
    ``max_sentences`` non-empty lines are used (all when None). ``base_tokenizer_dir``: any
    directory ``AutoTokenizer`` loads (a base model directory works). ``out_dir`` becomes a
    ``save_pretrained`` tokenizer directory, written atomically, plus ``modsent_tokenizer.json``
    (kind, sizes, special-token ids, corpus counts, seconds), which is also returned.

    Raises InputError for an empty corpus, invalid UTF-8 (file and line), an unsupported base
    kind, and a corpus too small for ``vocab_size`` (fewer than ``min_vocab_fraction`` of the
    requested tokens came out; the message gives both sizes and the corpus' counts).
    """
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if not corpus_path.is_file():
        raise InputError(f"{corpus_path}: corpus file not found")
    if max_sentences is not None and max_sentences < 1:
        raise InputError(f"max_sentences must be at least 1 (or None for all lines), not {max_sentences}")
    base = load_tokenizer(base_tokenizer_dir, "base tokenizer")
    kind = tokenizer_kind(base)
    specials = special_tokens(base)
    n_specials = len(set(base.all_special_tokens))
    if vocab_size <= n_specials:
        raise InputError(f"vocab_size={vocab_size} must exceed the {n_specials} special tokens of the base tokenizer")
    if _first_nonempty_line(corpus_path) is None:
        raise InputError(f"{corpus_path}: the corpus is empty (no non-empty line); the tokenizer needs text")

    added = sorted({token.content for token in base.backend_tokenizer.get_added_tokens_decoder().values()})
    batches = _CorpusBatches(corpus_path, max_sentences, batch_size, _WORD_COUNT_CAP_FACTOR * vocab_size, added)
    log.info("training a %s tokenizer of %d tokens on %s (max_sentences=%s)", kind, vocab_size, corpus_path, max_sentences)
    start = time.perf_counter()
    pinned = wordpiece_initial_pieces(base, batches) if kind == "wordpiece" else []
    if pinned:
        log.info("the WordPiece trainer's %d initial pieces pinned in %.1f s", len(pinned), time.perf_counter() - start)
    try:
        new = base.train_new_from_iterator(iter(batches), vocab_size=vocab_size, show_progress=False,
                                           new_special_tokens=pinned or None)
    except Exception as err:  # the Rust trainers raise plain exceptions
        if "not large enough to contain all chars" not in str(err):
            raise
        raise InputError(
            f"{corpus_path}: a vocabulary of {vocab_size} tokens cannot hold the corpus' "
            f"{len(batches.characters)} distinct characters (plus {n_specials} special tokens): raise "
            f"tokenizer.vocab_size (or tokenizer.per_language.<lang>.vocab_size) above "
            f"{len(batches.characters) + n_specials}") from None
    seconds = time.perf_counter() - start

    obtained = len(new)
    if obtained < min_vocab_fraction * vocab_size:
        words = f"at least {len(batches.words)}" if batches.words_capped else str(len(batches.words))
        raise InputError(
            f"{corpus_path}: corpus too small for a vocabulary of {vocab_size} tokens: training gave "
            f"{obtained} ({obtained / vocab_size:.0%}; at least {min_vocab_fraction:.0%} needed) from "
            f"{batches.sentences} sentences with {len(batches.characters)} distinct characters and "
            f"{words} distinct space-separated words; use a larger corpus or a smaller vocab_size"
        )
    if obtained > vocab_size:
        log.warning("the trained vocabulary has %d tokens, more than the %d requested (the corpus' "
                    "alphabet does not fit)", obtained, vocab_size)
    new_specials = special_tokens(new)
    if new_specials != specials:  # train_new_from_iterator guarantees this; a changed library might not
        raise RuntimeError(f"special tokens changed in training: base {specials}, new {new_specials}")
    if len(new.get_vocab()) != len(new):
        # Two ids for one string: the model learned an added token's text as an ordinary piece
        # (possible only through the normaliser, e.g. NFKC of full-width "＜s＞").
        vocab = json.loads(new.backend_tokenizer.to_str())["model"]["vocab"]
        pieces = [entry[0] if isinstance(entry, list) else entry for entry in vocab]
        twice = sorted(p for p, n in Counter(pieces).items() if n > 1)
        raise InputError(f"{corpus_path}: the trained vocabulary contains the added token(s) {twice} as "
                         f"ordinary pieces too; remove text that normalises to them from the corpus")
    report = {
        "kind": kind,
        "base_tokenizer": str(base_tokenizer_dir),
        "corpus": str(corpus_path),
        "sentences": batches.sentences,
        "distinct_characters": len(batches.characters),
        "added_token_texts_removed": batches.added_removed,
        "vocab_size_requested": vocab_size,
        "vocab_size": obtained,
        "special_tokens": {role: {"token": tok, "base_id": base.convert_tokens_to_ids(tok),
                                  "id": new.convert_tokens_to_ids(tok)} for role, tok in specials.items()},
        "seconds": round(seconds, 3),
    }
    with atomic_path(out_dir, directory=True) as tmp:
        new.save_pretrained(str(tmp))
        if kind == "unigram":
            canonical_unigram_file(tmp / "tokenizer.json")
        if pinned:
            unpin_wordpiece_pieces(tmp, pinned)
            saved = load_tokenizer(tmp, "trained tokenizer")
            if set(saved.get_added_vocab()) != set(base.get_added_vocab()) or len(saved) != obtained:
                raise RuntimeError(f"the pinned WordPiece pieces did not become ordinary pieces: added tokens "
                                   f"{sorted(set(saved.get_added_vocab()) - set(base.get_added_vocab()))[:5]}, "
                                   f"{len(saved)} tokens instead of {obtained}")
        record_added_tokens(tmp)  # loads without re-parsing tokenizer.json (modsent.io)
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("tokenizer: %d tokens from %d sentences in %.1f s -> %s", obtained, batches.sentences, seconds, out_dir)
    return report
