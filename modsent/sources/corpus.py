"""Turn raw text records into the monolingual corpus contract: one clean sentence a line.

:func:`iter_corpus` normalises whitespace, splits documents into sentences, filters by
length, drops exact duplicates and stops at ``max_sentences``, reading its input lazily so a
streamed Hub source is read no further than needed; several sources of one language (CC100 and
MADLAD-400, as paper 000 combines them) are interleaved sentence by sentence.
:func:`write_corpus` writes the sentences atomically as they come.

Sentence splitting is rule-based and dependency-free (:func:`split_sentences`): terminal
punctuation of many scripts, abbreviation lists for the larger Latin/Cyrillic-script languages,
initials and dotted abbreviations ("e.g.", "U.S."), ordinal dots in languages that write them
("am 3. Oktober"). Where it is unsure it does not split: two sentences left together cost a
little training signal, a sentence cut in two teaches the tokenizer and the encoder a fragment.
``splitter="sentencex"`` uses Wikimedia's sentencex package instead (MIT, ~300 languages, not a
dependency of modsent: install it to use it).
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, MutableMapping

from modsent.io import InputError, atomic_open
from modsent.sources.local import record_location

# --- normalisation -------------------------------------------------------------------------

_WHITESPACE = re.compile(r"\s+")  # str patterns: all Unicode whitespace (NBSP, U+3000, U+2028, ...)
# Control characters that are not whitespace, and the byte-order mark. Format characters such as
# ZWJ/ZWNJ are kept: Persian and Indic scripts need them.
_INVISIBLE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ufeff]")


def normalise_text(text: str) -> str:
    """NFC, control characters removed, every run of whitespace one space, stripped."""
    text = unicodedata.normalize("NFC", text)
    text = _INVISIBLE.sub("", text)
    return _WHITESPACE.sub(" ", text).strip()


# --- sentence splitting --------------------------------------------------------------------

# Terminators written before a space (Latin, Cyrillic, Greek, Arabic, Indic scripts ...).
_SPACED = r"\.{3}|[.!?…‼⁇⁈⁉]+"
# Terminators that end a sentence by themselves: CJK full-width marks (no spaces in CJK text),
# Devanagari danda and double danda, Arabic question mark, Urdu full stop, Ethiopic full stop,
# question mark and paragraph separator, Armenian full stop, Myanmar and Khmer full stops.
_UNSPACED = "。！？｡।॥؟۔።፧፨։။។"
_CLOSERS = "\"'”’»)]}」』）〉》›“"
_BOUNDARY = re.compile(
    rf"(?P<term>{_SPACED}|[{_UNSPACED}]+|[;;])(?P<close>[{re.escape(_CLOSERS)}]*)"
)
_OPENERS = "\"'“‘«‹([{„¿¡「『（〈《"

# Abbreviations that are (almost) never the end of a sentence, lower-cased, without the dot.
_COMMON_ABBREVIATIONS = {
    "dr", "prof", "mr", "mrs", "ms", "mme", "mlle", "sr", "sra", "srta", "jr", "st", "mt",
    "vs", "etc", "cf", "ca", "approx", "dept", "univ", "inc", "ltd", "co", "corp", "gen",
    "col", "lt", "sgt", "capt", "gov", "sen", "rep", "rev", "hon", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
}
_ABBREVIATIONS: Mapping[str, set[str]] = {
    "de": {"bzw", "usw", "vgl", "ggf", "evtl", "inkl", "zzgl", "ca", "hr", "fr", "str", "abs",
           "bd", "geb", "gest", "sog", "u", "z", "d", "s", "o", "v", "jh", "mio", "mrd", "tel"},
    "fr": {"m", "mm", "env", "av", "apr", "éd", "chap", "cf", "p", "vol", "bd"},
    "es": {"ud", "uds", "dra", "lic", "av", "pág", "aprox", "núm", "ej", "cía"},
    "it": {"sig", "sigg", "dott", "ing", "avv", "pag", "ecc", "ca"},
    "pt": {"sr", "sra", "dra", "av", "pág", "aprox", "ex"},
    "nl": {"dhr", "mevr", "bijv", "blz", "ca", "enz", "nl", "o.a", "m.a.w"},
    "ru": {"г", "гг", "т", "тт", "д", "др", "пр", "им", "ул", "стр", "см", "рис", "ок", "тыс",
           "млн", "млрд", "руб", "коп", "в", "вв"},
    "uk": {"р", "рр", "ст", "вул", "див", "ім", "млн", "тис"},
    "pl": {"np", "tzw", "itd", "itp", "ok", "ul", "godz", "r", "w", "im", "prof", "dr"},
    "cs": {"tzv", "apod", "např", "atd", "mj", "tj", "ul", "č", "str", "resp"},
}
# Abbreviations that stand before a number ("No. 5", "Art. 3"): no split when a digit follows.
_NUMBER_ABBREVIATIONS = {"no", "nos", "nr", "art", "p", "pp", "vol", "fig", "ch", "sec", "s", "bd", "nº"}
# Languages that write ordinal numbers with a dot ("am 3. Oktober", "1. maaliskuuta").
_ORDINAL_DOT_LANGS = {"de", "da", "nb", "no", "nn", "fi", "is", "cs", "sk", "sl", "hr", "sr",
                      "bs", "hu", "lv", "et", "fo", "tr", "mk"}
_DOTTED = re.compile(r"^(?:\w{1,3}\.)+\w{1,3}$")  # e.g, i.e, U.S, z.B, p.m


def _abbreviations(lang: str | None) -> set[str]:
    base = (lang or "").split("-")[0].split("_")[0].lower()
    return _COMMON_ABBREVIATIONS | _ABBREVIATIONS.get(base, set())


def split_sentences(text: str, lang: str | None = None) -> list[str]:
    """Split one paragraph into sentences with language-aware punctuation rules.

    Newlines are not boundaries here (documents are split into lines first, by the caller).
    """
    text = text.strip()
    if not text:
        return []
    base = (lang or "").split("-")[0].split("_")[0].lower()
    abbreviations = _abbreviations(lang)
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        term, end = match.group("term"), match.end()
        if term in (";", ";") and base != "el":  # Greek writes its question mark as ';'
            continue
        if term[0] in _UNSPACED:
            boundary = True
        else:
            boundary = _spaced_boundary(text, match.start(), end, term, base, abbreviations)
        if boundary:
            piece = text[start:end].strip()
            if piece:
                sentences.append(piece)
            start = end
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def _spaced_boundary(text: str, begin: int, end: int, term: str, base: str, abbreviations: set[str]) -> bool:
    if end < len(text) and not text[end].isspace():
        return False  # "3.14", "example.com", "Hello!World"
    following = text[end:].lstrip()
    if not following:
        return True
    nxt = following.lstrip(_OPENERS)[:1] or following[0]
    if nxt.islower():
        return False  # "etc. and", "Yes… really", "Yahoo! and"
    if term != ".":
        return True
    # A single dot: is the word before it an abbreviation?
    word_start = text.rfind(" ", 0, begin) + 1
    word = text[word_start:begin].lstrip(_OPENERS)
    lowered = word.lower()
    if not word:
        return True
    if lowered in abbreviations:
        return False
    if lowered in _NUMBER_ABBREVIATIONS and nxt.isdigit():
        return False
    if len(word) == 1 and word.isalpha() and word.isupper():
        return False  # an initial: "J. R. R. Tolkien"
    if _DOTTED.match(word):
        return False  # "e.g.", "U.S.", "z.B."
    if word.isdigit() and base in _ORDINAL_DOT_LANGS:
        return False  # "am 3. Oktober"
    return True


def _splitter(name: str):
    if name == "rules":
        return split_sentences
    if name == "sentencex":
        try:
            from sentencex import segment
        except ImportError:
            raise InputError(
                "splitter 'sentencex' needs the sentencex package (pip install sentencex); "
                "or use splitter 'rules'"
            ) from None

        def split_with_sentencex(text: str, lang: str | None) -> list[str]:
            return [s.strip() for s in segment(lang or "en", text) if s.strip()]

        return split_with_sentencex
    raise InputError(f"unknown sentence splitter {name!r}; expected 'rules' or 'sentencex'")


# --- the corpus ----------------------------------------------------------------------------


def _texts(records: Iterable[str | Mapping], source: str) -> Iterator[str | None]:
    for number, record in enumerate(records, start=1):
        if isinstance(record, str) or record is None:
            yield record
            continue
        if not isinstance(record, Mapping) or "text" not in record:
            found = list(record) if isinstance(record, Mapping) else type(record).__name__
            raise InputError(f"{record_location(record, source, number)}: no 'text' field (found: {found})")
        text = record["text"]
        if text is not None and not isinstance(text, str):
            raise InputError(f"{record_location(record, source, number)}: 'text' must be a string, got "
                             f"{type(text).__name__}")
        yield text


def _candidates(records: Iterable[str | Mapping], split_documents: bool, lang: str | None,
                split, source: str, counts: MutableMapping[str, int]) -> Iterator[str]:
    """Each record's normalised sentences (its lines split into sentences with
    ``split_documents``, else the record whole), empty ones left out, read lazily."""
    for text in _texts(records, source):
        counts["records"] += 1
        if not text:
            continue
        if not split_documents:
            pieces: Iterable[str] = (normalise_text(text),)
        else:
            pieces = (sentence for raw in text.splitlines() if (line := normalise_text(raw))
                      for sentence in split(line, lang))
        for sentence in pieces:
            sentence = normalise_text(sentence)
            if sentence:
                yield sentence


def iter_corpus(
    sources: list[tuple[Iterable[str | Mapping], bool, str]],
    max_sentences: int | None,
    min_chars: int,
    max_chars: int,
    lang: str | None,
    *,
    splitter: str = "rules",
    stats: MutableMapping[str, int] | None = None,
) -> Iterator[str]:
    """Clean sentences of one or more sources, ``(records, split_documents, name)`` each, read
    lazily; several sources are interleaved one kept sentence of each in turn (a source that
    runs out drops out; one whose candidates are dropped reads on to its next kept one), so any
    prefix of the corpus, and so the cap, takes from all of them alike.

    Records are strings or dicts with a ``text`` field; each is normalised
    (:func:`normalise_text`) and, with its source's ``split_documents``, cut into lines and every
    line into sentences (:func:`split_sentences`), otherwise it is one sentence. Sentences
    shorter than ``min_chars`` or longer than ``max_chars`` characters are dropped (not
    truncated), exact duplicates after normalisation are dropped (across sources too), and
    reading stops once ``max_sentences`` are kept (``None``: no cap). ``stats``, when given,
    receives the counts once the iterator is exhausted or closed (``kept NAME`` per source when
    there are several). Memory: an 8-byte digest per kept sentence in a set (~70 bytes each in
    Python), not the sentences themselves."""
    if max_sentences is not None and max_sentences < 1:
        raise InputError(f"{sources[0][2] if sources else 'corpus source'}: max_sentences must be >= 1, "
                         f"got {max_sentences}")
    if min_chars < 0 or max_chars < max(min_chars, 1):
        raise InputError(
            f"{sources[0][2] if sources else 'corpus source'}: need 0 <= min_chars <= max_chars and "
            f"max_chars >= 1, got min_chars={min_chars}, max_chars={max_chars}"
        )
    split = _splitter(splitter)
    return _iter_corpus(sources, max_sentences, min_chars, max_chars, lang, split, stats)


def _iter_corpus(sources, max_sentences, min_chars, max_chars, lang, split, stats) -> Iterator[str]:
    counts = {"records": 0, "candidates": 0, "too_short": 0, "too_long": 0, "duplicates": 0, "kept": 0}
    kept_from = [0] * len(sources)
    seen: set[int] = set()
    streams = [_candidates(records, documents, lang, split, name, counts) for records, documents, name in sources]
    live = list(range(len(streams)))
    try:
        while live:  # each live source in turn gives its next kept sentence
            still = []
            for index in live:
                for sentence in streams[index]:
                    counts["candidates"] += 1
                    if len(sentence) < min_chars:
                        counts["too_short"] += 1
                        continue
                    if len(sentence) > max_chars:
                        counts["too_long"] += 1
                        continue
                    # 8-byte digests keep 10M sentences in well under a GB; a false duplicate
                    # is a ~1e-6 event at that size.
                    key = int.from_bytes(hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest(), "big")
                    if key in seen:
                        counts["duplicates"] += 1
                        continue
                    seen.add(key)
                    counts["kept"] += 1
                    kept_from[index] += 1
                    yield sentence
                    if max_sentences is not None and counts["kept"] >= max_sentences:
                        return
                    still.append(index)
                    break
            live = still
    finally:
        if len(sources) > 1:
            counts.update({f"kept {name}": kept for (_, _, name), kept in zip(sources, kept_from)})
        if stats is not None:
            stats.update(counts)


def build_corpus(
    records: Iterable[str | Mapping],
    max_sentences: int | None,
    min_chars: int,
    max_chars: int,
    split_documents: bool,
    lang: str | None,
    *,
    splitter: str = "rules",
    source: str = "corpus source",
    stats: MutableMapping[str, int] | None = None,
) -> list[str]:
    """Clean sentences from ``records`` (strings or dicts with a ``text`` field), in input order:
    :func:`iter_corpus` of one source, as a list."""
    return list(iter_corpus([(records, split_documents, source)], max_sentences, min_chars, max_chars, lang,
                            splitter=splitter, stats=stats))


def write_corpus(
    sentences: Iterable[str], path: str | os.PathLike, *, source: str | None = None
) -> int:
    """Write ``sentences`` one a line (UTF-8, ``\\n``) to ``path`` atomically; return the count.

    Raises :class:`InputError` naming ``source`` when there is no sentence to write, and for a
    sentence holding a line break (it would break the one-sentence-a-line contract).
    """
    count = 0
    with atomic_open(path, "w", newline="\n") as handle:
        for count, sentence in enumerate(sentences, start=1):
            if "\n" in sentence or "\r" in sentence:
                raise InputError(f"{source or path}: sentence {count} contains a line break: {sentence[:60]!r}")
            handle.write(sentence)
            handle.write("\n")
        if count == 0:
            raise InputError(
                f"{source or path}: no sentences survived cleaning (length filter, deduplication); "
                f"nothing written to {path}"
            )
    return count
