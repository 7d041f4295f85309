"""The offline demo data of the workflow (``builtin:`` sources), made of real human-written text.

No sentence here is invented: every line comes from a translation catalog that a pinned PyPI
package ships (see :data:`PROVENANCE` and :mod:`modsent.sources.builtin_catalogs`): Django's
and django-allauth's user-interface messages, pycountry's names of countries, languages,
currencies and scripts, and the Unicode CLDR display names that Babel carries. Translations are
the ones that people contributed to those projects, so English and each language are aligned by
the catalogs themselves, which makes them usable both as training data and as a stand-in for
machine translation in the demo.

Products (each a deterministic function of the installed package versions):

- :func:`builtin_corpus` — monolingual lines of a language (tokenizer, fastText, MLM);
- :func:`builtin_paraphrases` — English pairs of the same meaning (SE adapter, CLA);
- :func:`builtin_translations` — English → language pairs (CLA, and the demo's "provided"
  translation engine: every English paraphrase sentence has one in every demo language);
- :func:`builtin_parallel_eval`, :func:`builtin_paraphrase_eval` and
  :func:`builtin_classification` — held-out evaluation data.

Train and evaluation never share a text. Before anything else every unit (one source text with
its translations) is linked to every other unit that shares a named thing (e.g. ``territory:DE``)
or any text in any language, compared by :func:`overlap_key`; each connected component then goes
as a whole to the training or the evaluation pool by a hash of its smallest English text. A text
therefore lives in exactly one pool, whichever product or language it appears in.
"""

from __future__ import annotations

import hashlib
import html
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

from modsent.io import InputError
from modsent.sources import builtin_catalogs
from modsent.sources.builtin_catalogs import (DEBIAN_CATALOGS, SUPPORTED_LANGUAGES, UNIT_SOURCES, Unit, all_units,
                                              debian_catalog_files, debian_units, debian_versions,
                                              package_version)

#: The languages of the demo: English, German, Chinese (non-Latin script, no spaces between
#: words) and Kyrgyz (lower-resource, Cyrillic). Every English paraphrase sentence has a
#: human translation in each of them.
DEMO_LANGUAGES: tuple[str, ...] = ("en", "de", "zh", "ky")

#: Share of connected components (per mille) that go to the evaluation pool.
EVAL_PERMILLE = 250
#: Components larger than this (in units) always go to training: they are chains of common
#: words ("Name", "Email", ...) that would otherwise take a large slice of the data with them.
MAX_EVAL_COMPONENT = 40
#: Share of classification items (per mille) in the test split; the rest is the train split.
CLASSIFICATION_TEST_PERMILLE = 400
#: A pivot paraphrase needs identical translations in at least this many languages.
PIVOT_MIN_LANGUAGES = 3
#: A line needs at least this many letters to be kept (drops "%s", "—", "5", single letters).
MIN_LETTERS = 2
#: Paraphrase pairs per language in the held-out paraphrase set (the first by id, a hash): every
#: evaluated system encodes them, so they cost the demo's time; 150 keeps the languages alike
#: (Chinese has 129 pairs, Kyrgyz 56).
MAX_PARAPHRASE_EVAL = 150

#: Where the text comes from: the README quotes this. ``version`` is the version the demo was
#: built and tested with (pinned in pyproject.toml); another version gives other data.
PROVENANCE: tuple[dict, ...] = (
    {
        "source": "django",
        "package": "Django",
        "version": "5.2.19",
        "files": ["django/conf/locale/<ll>/LC_MESSAGES/django.mo",
                  "django/contrib/<app>/locale/<ll>/LC_MESSAGES/django.mo",
                  "django/contrib/<app>/locale/<ll>/LC_MESSAGES/djangojs.mo"],
        "content": "user-interface messages of Django and its contrib apps, translated by "
                   "Django's translators (Transifex)",
        "licence": "BSD-3-Clause",
        "copyright": "Copyright (c) Django Software Foundation and individual contributors",
        "url": "https://www.djangoproject.com/",
    },
    {
        "source": "django-allauth",
        "package": "django-allauth",
        "version": "65.21.1",
        "files": ["allauth/locale/<ll>/LC_MESSAGES/django.mo"],
        "content": "user-interface messages of django-allauth (sign-up, log-in, e-mail, "
                   "account pages), translated by its contributors",
        "licence": "MIT",
        "copyright": "Copyright (c) 2010-2026 Raymond Penners and contributors",
        "url": "https://allauth.org/",
    },
    {
        "source": "pycountry",
        "package": "pycountry",
        "version": "26.2.16",
        "files": ["pycountry/databases/{iso3166-1,iso3166-2,iso639-3,iso4217,iso15924}.json",
                  "pycountry/locales/<ll>/LC_MESSAGES/{iso3166-1,iso3166-2,iso639-3,iso4217,"
                  "iso15924}.mo"],
        "content": "names of countries (short, official and common names), subdivisions, "
                   "languages, currencies and scripts from Debian's iso-codes project, "
                   "translated by its translators (Weblate)",
        "licence": "LGPL-2.1-only",
        "copyright": "Copyright (c) Christian Theune and contributors; data: Debian iso-codes",
        "url": "https://salsa.debian.org/iso-codes-team/iso-codes",
    },
    {
        "source": "cldr",
        "package": "babel",
        "version": "2.18.0",
        "files": ["babel/locale-data/{en,<ll>}.dat"],
        "content": "Unicode CLDR 47 display names of territories, languages, scripts, "
                   "currencies, time zones, exemplar cities, units, months and weekdays",
        "licence": "Unicode-3.0 (CLDR data); BSD-3-Clause (Babel)",
        "copyright": "Copyright (c) 1991-2025 Unicode, Inc.; "
                     "Copyright (c) 2013-2026 by the Babel Team",
        "url": "https://cldr.unicode.org/",
    },
)


def source_versions() -> dict[str, tuple[str, str]]:
    """``{package: (version in PROVENANCE, installed version)}`` — they should agree."""
    return {item["package"]: (item["version"], package_version(item["package"]))
            for item in PROVENANCE}


# --------------------------------------------------------------------------------------------
# Cleaning


# printf-style (%(name)s, %s, %.2f, %d) and format-style ({0}, {name}) placeholders.
_PLACEHOLDER = re.compile(
    r"%\([^)]*\)[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]"
    r"|%[-#0 +]*\d*(?:\.\d+)?[sdifrxXeEgGcu]"
    r"|\{[^{}\s]*\}"
)
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
# What a removed placeholder leaves behind: "()", "“”", "«»", "（）", ...
_EMPTY_BRACKETS = re.compile(
    r"\(\s*\)|\[\s*\]|“\s*”|‘\s*’|«\s*»|„\s*“|\"\s*\"|'\s*'|（\s*）|「\s*」"
)
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?)\]»”。，、；：！？）])")


def has_markup(text: str) -> bool:
    """Whether the text holds a placeholder or an HTML tag (not usable as an aligned sentence)."""
    return bool(_PLACEHOLDER.search(text.replace("%%", "")) or _TAG.search(text))


def clean_text(text: str) -> str:
    """One line of plain text: placeholders and tags removed, entities decoded, spaces tidied."""
    if "%" in text or "{" in text or "<" in text or "&" in text:
        text = text.replace("%%", "\x00")
        text = _PLACEHOLDER.sub(" ", text)
        text = _TAG.sub(" ", text).replace("\x00", "%")
        text = html.unescape(text)
        text = " ".join(text.split())
        for _ in range(2):
            text = _EMPTY_BRACKETS.sub("", text)
            text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
            text = " ".join(text.split())
    else:
        text = " ".join(text.split())
    return text.strip(" -–—:;,")


def letters(text: str) -> int:
    """How many letters (not digits, marks or punctuation) the text has."""
    return sum(ch.isalpha() for ch in text)


def overlap_key(text: str) -> str:
    """The form under which two texts count as the same: NFKC, casefolded, spaces collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _stable_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Units, pools and concepts


@dataclass(frozen=True)
class _Item:
    """A unit with its cleaned texts and the pool it went to."""

    unit: Unit
    english: str                      # cleaned English ("" if noise)
    translations: dict[str, str]      # lang -> cleaned translation (noise left out)
    corpus: dict[str, tuple[str, ...]]  # lang -> cleaned lines for the monolingual corpus
    aligned: frozenset[str]           # languages whose translation is a clean aligned sentence
    pool: str = "train"


@dataclass(frozen=True)
class _Concept:
    """All aligned units with one English text: the unit of every aligned product."""

    english: str
    translations: dict[str, str]      # first aligned translation per language, by source order
    domains: frozenset[str]
    groups: frozenset[str]
    pool: str

    @property
    def id(self) -> str:
        return _stable_id(overlap_key(self.english))


def _keep(text: str) -> bool:
    """Whether a cleaned line is text rather than noise (at least MIN_LETTERS letters)."""
    count = 0
    for ch in text:
        if ch.isalpha():
            count += 1
            if count >= MIN_LETTERS:
                return True
    return False


def _kept(raw: str) -> str:
    """``raw`` cleaned, or "" where the cleaned line is noise: what a corpus keeps of a line."""
    text = clean_text(raw)
    return text if _keep(text) else ""


def _prepare(unit: Unit) -> _Item:
    english = _kept(unit.english)
    english_ok = bool(english) and not has_markup(unit.english) and not unit.plural
    translations, corpus, aligned = {}, defaultdict(list), set()
    if english:
        corpus["en"].append(english)
    for lang, raw in unit.translations:
        text = _kept(raw)
        if not text:
            continue
        translations[lang] = text
        corpus[lang].append(text)
        if english_ok and not has_markup(raw):
            aligned.add(lang)
    for lang, raw in unit.variants:
        text = _kept(raw)
        if text:
            corpus[lang].append(text)
    if english_ok:
        aligned.add("en")
    return _Item(unit, english, translations, {k: tuple(v) for k, v in corpus.items()},
                 frozenset(aligned))


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


@lru_cache(maxsize=1)
def _items() -> tuple[_Item, ...]:
    """Every unit, cleaned and assigned to a pool: the split happens here, before any product."""
    items = [_prepare(unit) for unit in all_units(SUPPORTED_LANGUAGES)]
    links = _UnionFind(len(items))
    first_holder: dict[str, int] = {}
    for index, item in enumerate(items):
        keys = {f"group\x00{item.unit.group}"} if item.unit.group else set()
        keys.update(overlap_key(line) for lines in item.corpus.values() for line in lines)
        for key in keys:
            if key in first_holder:
                links.union(first_holder[key], index)
            else:
                first_holder[key] = index
    components: dict[int, list[int]] = defaultdict(list)
    for index in range(len(items)):
        components[links.find(index)].append(index)
    pools = ["train"] * len(items)
    for members in components.values():
        englishes = [overlap_key(items[i].english) for i in members if items[i].english]
        if not englishes or len(members) > MAX_EVAL_COMPONENT:
            continue
        if _digest(min(englishes)) % 1000 < EVAL_PERMILLE:
            for i in members:
                pools[i] = "eval"
    return tuple(_Item(item.unit, item.english, item.translations, item.corpus, item.aligned, pool)
                 for item, pool in zip(items, pools))


@lru_cache(maxsize=1)
def _concepts() -> tuple[_Concept, ...]:
    """Aligned units merged by English text, in first-seen order (sources by preference)."""
    merged: dict[str, dict] = {}
    for item in _items():
        if "en" not in item.aligned:
            continue
        slot = merged.setdefault(overlap_key(item.english), {
            "english": item.english, "translations": {}, "domains": set(), "groups": set(),
            "pool": item.pool})
        assert slot["pool"] == item.pool, "units with one English text share a component"
        for lang in sorted(item.aligned - {"en"}):
            slot["translations"].setdefault(lang, item.translations[lang])
        slot["domains"].add(item.unit.domain)
        if item.unit.group:
            slot["groups"].add(item.unit.group)
    return tuple(_Concept(s["english"], s["translations"], frozenset(s["domains"]),
                          frozenset(s["groups"]), s["pool"]) for s in merged.values())


@lru_cache(maxsize=1)
def available_languages() -> tuple[str, ...]:
    """Languages with any built-in text (a subset of the paper's languages): those with a line
    that :func:`_prepare` keeps in some unit's corpus.

    The workflow asks this while it parses (the built-in evaluation sets' subsets), so it does
    not prepare every unit as :func:`_items` does: it cleans a language's lines only until one
    is kept, and reads the sources in order only until every language has text.
    """
    wanted, have = set(SUPPORTED_LANGUAGES), set()
    for source in UNIT_SOURCES:
        for unit in source(SUPPORTED_LANGUAGES):
            if "en" not in have and _kept(unit.english):
                have.add("en")
            for lang, raw in unit.translations + unit.variants:
                if lang not in have and _kept(raw):
                    have.add(lang)
        if have >= wanted:
            break
    return tuple(lang for lang in SUPPORTED_LANGUAGES if lang in have)


def _check_language(lang: str, what: str) -> None:
    if lang not in available_languages():
        raise InputError(
            f"the built-in {what} has no data for language {lang!r}; languages available: "
            f"{', '.join(available_languages())} (demo languages: {', '.join(DEMO_LANGUAGES)})"
        )


# --------------------------------------------------------------------------------------------
# Training products


@lru_cache(maxsize=None)
def _corpus(lang: str) -> tuple[str, ...]:
    seen, lines = set(), []
    for item in _items():
        if item.pool != "train":
            continue
        for line in item.corpus.get(lang, ()):
            key = overlap_key(line)
            if key not in seen:
                seen.add(key)
                lines.append(line)
    return tuple(lines)


def builtin_corpus(lang: str) -> list[str]:
    """Monolingual lines of ``lang`` from the training pool: every cleaned message and name the
    sources give in that language, deduplicated (by :func:`overlap_key`), in a fixed order."""
    _check_language(lang, "corpus")
    return list(_corpus(lang))


def _translated_in(concept: _Concept, languages: Iterable[str]) -> bool:
    return all(lang == "en" or lang in concept.translations for lang in languages)


# Groups whose different English names say the same thing (name, official name, CLDR name).
_PARAPHRASE_GROUPS = {"territory": "builtin-countries", "language": "builtin-languages",
                      "currency": "builtin-currencies", "script": "builtin-scripts"}


def _tokens(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.casefold()))


@lru_cache(maxsize=1)
def _paraphrases() -> pd.DataFrame:
    train = [c for c in _concepts() if c.pool == "train" and _translated_in(c, DEMO_LANGUAGES)]
    rows = []
    # 1. Different English names of one thing: "Germany" / "Federal Republic of Germany",
    #    "Korea, Republic of" / "South Korea", "Modern Greek (1453-)" / "Greek".
    by_group: dict[str, list[_Concept]] = defaultdict(list)
    for concept in train:
        for group in sorted(concept.groups):
            if group.split(":", 1)[0] in _PARAPHRASE_GROUPS:
                by_group[group].append(concept)
    named = []
    for group, concepts in by_group.items():
        dataset = _PARAPHRASE_GROUPS[group.split(":", 1)[0]]
        # The anchor is the shortest name (the everyday one); the others are its paraphrases.
        concepts = sorted(concepts, key=lambda c: (len(c.english), c.english))
        for other in concepts[1:]:
            named.append((dataset, group, concepts[0].english, other.english))
    # Hard negatives: the name of another thing in the same dataset with the most words in
    # common with the positive ("Republic of Korea" vs "Democratic People's Republic of Korea").
    by_dataset: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for dataset, group, _anchor, positive in named:
        by_dataset[dataset].append((group, positive))
    # Ties go to a hash of the pair, so that one common pattern ("Republic of X") does not
    # make one name the negative of every pair.
    for dataset, group, anchor, positive in named:
        tokens = _tokens(positive)
        best, best_score = None, (0.0, 0)
        for other_group, candidate in by_dataset[dataset]:
            if other_group == group:
                continue
            overlap = len(tokens & _tokens(candidate)) / len(tokens | _tokens(candidate))
            score = (overlap, _digest(positive + "\x00" + candidate))
            if overlap > 0 and score > best_score:
                best, best_score = candidate, score
        rows.append((dataset, anchor, positive, best))
    # 2. Pivot paraphrases (Bannard & Callison-Burch 2005): two different English UI messages
    #    that translators rendered identically in at least PIVOT_MIN_LANGUAGES languages and in
    #    at least half of the languages that translate both ("Log out" / "Sign Out").
    interface = [c for c in train if "interface" in c.domains]
    same: dict[tuple[int, int], int] = defaultdict(int)
    for lang in SUPPORTED_LANGUAGES:
        by_text: dict[str, list[int]] = defaultdict(list)
        for index, concept in enumerate(interface):
            if lang in concept.translations:
                by_text[overlap_key(concept.translations[lang])].append(index)
        for indices in by_text.values():
            for i, a in enumerate(indices):
                for b in indices[i + 1:]:
                    same[a, b] += 1
    for (a, b), count in sorted(same.items()):
        first, second = interface[a], interface[b]
        both = sum(1 for lang in SUPPORTED_LANGUAGES
                   if lang in first.translations and lang in second.translations)
        if count >= PIVOT_MIN_LANGUAGES and 2 * count >= both:
            first, second = sorted((first, second), key=lambda c: (len(c.english), c.english))
            rows.append(("builtin-pivot", first.english, second.english, None))
    frame = pd.DataFrame(rows, columns=["dataset", "anchor", "positive", "negative"])
    frame.insert(0, "pair_id", [_stable_id(d, a, p) for d, a, p, _n in rows])
    frame = frame.drop_duplicates("pair_id").sort_values("pair_id", ignore_index=True)
    frame["negative"] = frame["negative"].astype(object).where(frame["negative"].notna(), None)
    return frame


def builtin_paraphrases() -> pd.DataFrame:
    """English pairs of the same meaning: ``pair_id, dataset, anchor, positive, negative``.

    Datasets: ``builtin-countries`` / ``-languages`` / ``-currencies`` / ``-scripts`` (two
    names of one country, language, ... from pycountry and CLDR; ``negative`` is the most
    similar-looking name of another one, or None) and ``builtin-pivot`` (two UI messages that
    translators rendered identically in most languages; no negative). Every sentence has a translation in every demo
    language (:func:`builtin_translations`). ``pair_id`` is a hash of the content.
    """
    return _paraphrases().copy()


@lru_cache(maxsize=None)
def _translations(lang: str) -> pd.DataFrame:
    rows = [(c.english, c.english if lang == "en" else c.translations[lang])
            for c in _concepts() if c.pool == "train" and _translated_in(c, [lang])]
    return pd.DataFrame(rows, columns=["english", "translation"])


def builtin_translations(lang: str) -> pd.DataFrame:
    """Human translations English → ``lang`` from the training pool: ``english, translation``.

    One row per English text (the first source's translation where sources differ). For the
    demo languages it covers every sentence of :func:`builtin_paraphrases`. For ``"en"`` each
    text is its own translation.
    """
    _check_language(lang, "translations")
    return _translations(lang).copy()


@lru_cache(maxsize=1)
def _evaluation_keys() -> frozenset[str]:
    """Every text of the evaluation pool, in any language, by :func:`overlap_key`."""
    return frozenset(overlap_key(line) for item in _items() if item.pool == "eval"
                     for lines in item.corpus.values() for line in lines)


@lru_cache(maxsize=None)
def _debian_translations(lang: str, root: str) -> pd.DataFrame:
    held_out = _evaluation_keys()
    rows, seen = [], set()
    for unit in debian_units(SUPPORTED_LANGUAGES, root):
        item = _prepare(unit)
        if "en" not in item.aligned or (lang != "en" and lang not in item.aligned):
            continue
        # a message sharing any text, in any language, with the evaluation pool is left out,
        # so the extra translations never teach an evaluation sentence
        if any(overlap_key(line) in held_out for lines in item.corpus.values() for line in lines):
            continue
        key = overlap_key(item.english)
        if key not in seen:
            seen.add(key)
            rows.append((item.english, item.english if lang == "en" else item.translations[lang]))
    return pd.DataFrame(rows, columns=["english", "translation"])


def debian_translations(lang: str, root: str | Path | None = None) -> pd.DataFrame:
    """Human translations English → ``lang`` from the gettext catalogs of installed Debian
    packages (:data:`~modsent.sources.builtin_catalogs.DEBIAN_CATALOGS`): ``english, translation``.

    The extra data of ``translation.provided: builtin:debian``. It does not take part in the
    built-in train/evaluation split (the demo's data stay what they are); instead every message
    that shares a text, in any language, with the built-in evaluation pool is left out. Which
    messages exist depends on the packages installed: :func:`debian_provenance` says which.
    """
    _check_language(lang, "translations")
    return _debian_translations(lang, str(builtin_catalogs.DEBIAN_LOCALE_ROOT if root is None else root)).copy()


def debian_provenance(languages: Iterable[str], root: str | Path | None = None) -> list[dict]:
    """One row per Debian package read: package, installed version, licence, domains and the
    languages it has catalogs for (the notice to keep beside results trained on them)."""
    files = debian_catalog_files(tuple(languages), root)
    packages = sorted({package for package, _domain in files})
    versions = debian_versions(packages)
    licences = {entry["package"]: entry["licence"] for entry in DEBIAN_CATALOGS}
    return [{"package": package, "version": versions[package], "licence": licences[package],
             "copyright": f"/usr/share/doc/{package}/copyright",
             "domains": sorted(d for p, d in files if p == package),
             "languages": sorted({lang for (p, _d), by_lang in files.items() if p == package
                                  for lang in by_lang})}
            for package in packages]


# --------------------------------------------------------------------------------------------
# Evaluation products (held out)


def _distinct(concepts: Sequence[_Concept], languages: Sequence[str]) -> list[_Concept]:
    """Keep concepts whose text in each language differs from every earlier kept one's, so that
    a sentence has one right partner in bitext mining and one label in classification."""
    seen: dict[str, set[str]] = {lang: set() for lang in languages}
    kept = []
    for concept in concepts:
        texts = {lang: overlap_key(concept.english if lang == "en" else concept.translations[lang])
                 for lang in languages}
        if any(texts[lang] in seen[lang] for lang in languages):
            continue
        for lang in languages:
            seen[lang].add(texts[lang])
        kept.append(concept)
    return kept


@lru_cache(maxsize=None)
def _parallel_eval(languages: tuple[str, ...]) -> pd.DataFrame:
    concepts = [c for c in _concepts() if c.pool == "eval" and _translated_in(c, languages)]
    concepts = sorted(_distinct(concepts, languages), key=lambda c: c.id)
    frame = pd.DataFrame({"id": [c.id for c in concepts]})
    for lang in languages:
        frame[lang] = [c.english if lang == "en" else c.translations[lang] for c in concepts]
    return frame


def builtin_parallel_eval(langs: Iterable[str] = DEMO_LANGUAGES) -> pd.DataFrame:
    """Held-out multi-parallel sentences: an ``id`` column and one column per language.

    Row i is one English text and its human translation in every requested language (for
    bitext mining and RSIM); rows are sorted by ``id``, a hash of the English text. Only texts
    of the evaluation pool appear: none of them is in any training product.
    """
    languages = tuple(dict.fromkeys(langs))
    if not languages:
        raise InputError("builtin_parallel_eval needs at least one language")
    for lang in languages:
        _check_language(lang, "parallel evaluation set")
    return _parallel_eval(languages).copy()


@lru_cache(maxsize=None)
def _paraphrase_eval(lang: str) -> pd.DataFrame:
    # 1. Two names of one thing in the language (the held-out counterpart of the training
    #    sets builtin-countries / -languages / ...): "Albanien" / "Republik Albanien".
    names: dict[str, list[str]] = defaultdict(list)
    # 2. Two translations of one English message by different projects' translators (Django and
    #    django-allauth): "Passwort zurücksetzen" / "Mein Passwort zurücksetzen".
    renderings: dict[str, list[str]] = defaultdict(list)
    for item in _items():
        if item.pool != "eval":
            continue
        text = item.english if lang == "en" else item.translations.get(lang)
        if not text or has_markup(text):
            continue
        if item.unit.group and item.unit.group.split(":", 1)[0] in _PARAPHRASE_GROUPS:
            names[item.unit.group].append(text)
        elif not item.unit.group and lang != "en" and lang in item.aligned and "en" in item.aligned:
            renderings[overlap_key(item.english)].append(text)
    candidates = []
    for kind, table in (("name", names), ("message", renderings)):
        for key in sorted(table):
            texts = list({overlap_key(t): t for t in table[key]}.values())
            if len(texts) >= 2:
                # the shortest form is the anchor, the next shortest its paraphrase
                anchor, positive = sorted(texts, key=lambda t: (len(t), t))[:2]
                candidates.append((_stable_id(lang, kind, key), anchor, positive))
    # every text in one pair only, so that each anchor has one right partner
    seen: set[str] = set()
    rows = []
    for pair_id, anchor, positive in sorted(candidates):
        keys = {overlap_key(anchor), overlap_key(positive)}
        if keys & seen:
            continue
        seen |= keys
        rows.append((pair_id, anchor, positive))
    return pd.DataFrame(rows[:MAX_PARAPHRASE_EVAL], columns=["id", "anchor", "positive"])


def builtin_paraphrase_eval(lang: str) -> pd.DataFrame:
    """Held-out monolingual paraphrase pairs of ``lang``: ``id, anchor, positive``.

    Both sides are human-written text of the language as the catalogs give it, not machine
    translations: two names the sources give for one country, language, currency or script
    ("Albanien" / "Republik Albanien", from pycountry and CLDR; most of them are the catalogs'
    translations of the two names of an English pair of the set), and, outside English, two
    different translations of one English message by the translators of different projects.
    Only texts of the evaluation pool appear, and each text appears in one pair only
    (paraphrase mining has one right partner per sentence). Rows are sorted by ``id``, a hash of the pair's source; at most
    :data:`MAX_PARAPHRASE_EVAL` per language (the first by id).
    """
    _check_language(lang, "paraphrase evaluation set")
    return _paraphrase_eval(lang).copy()


#: Classification labels: what kind of thing a text names, or that it is a UI message.
CLASSIFICATION_LABELS: tuple[str, ...] = ("country", "language", "currency", "timezone",
                                          "interface")


def _label(concept: _Concept) -> str | None:
    """The one label of a concept; None when it has none or several (e.g. "Georgia" is a
    country and a subdivision; "German" is a language name in Django's catalog too)."""
    names = concept.domains - {"interface"}
    labels = names or concept.domains
    if len(labels) != 1:
        return None
    (label,) = labels
    return label if label in CLASSIFICATION_LABELS else None


@lru_cache(maxsize=1)
def _classification_items() -> tuple[tuple[_Concept, str, str], ...]:
    concepts = [c for c in _concepts()
                if c.pool == "eval" and _label(c) and _translated_in(c, DEMO_LANGUAGES)]
    concepts = sorted(_distinct(concepts, DEMO_LANGUAGES), key=lambda c: c.id)
    return tuple((c, _label(c), "test" if _digest("split\x00" + c.id) % 1000
                  < CLASSIFICATION_TEST_PERMILLE else "train") for c in concepts)


def builtin_classification(lang: str) -> pd.DataFrame:
    """Held-out labelled texts of ``lang``: ``id, text, label, split`` (split: train / test).

    The label says what the text is: a country, language, currency or time zone name, or
    a user-interface message. Items are the same in every demo language (same ``id``, label and
    split: the texts are translations of each other), so a classifier trained on English can be
    tested zero-shot on another language. For a non-demo language the items it translates.
    """
    _check_language(lang, "classification set")
    rows = [(c.id, c.english if lang == "en" else c.translations[lang], label, split)
            for c, label, split in _classification_items()
            if lang == "en" or lang in c.translations]
    return pd.DataFrame(rows, columns=["id", "text", "label", "split"])


# --------------------------------------------------------------------------------------------


def source_coverage(languages: Iterable[str] = DEMO_LANGUAGES) -> pd.DataFrame:
    """Translated units per source catalog (rows) and language (columns), before cleaning,
    deduplication and the train/evaluation split; ``en`` counts the English source texts."""
    languages = tuple(languages)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(languages, 0))
    for item in _items():
        row = counts[item.unit.catalog.split(":")[0] if item.unit.source == "django"
                     else item.unit.catalog]
        for lang in languages:
            if lang == "en" or item.unit.translation(lang) is not None:
                row[lang] += 1
    return pd.DataFrame.from_dict(counts, orient="index").rename_axis("catalog").sort_index()


def builtin_coverage(languages: Iterable[str] = DEMO_LANGUAGES) -> pd.DataFrame:
    """Rows per product per language (the table the README shows)."""
    languages = tuple(languages)
    paraphrase_sentences = set()
    for column in ("anchor", "positive", "negative"):
        paraphrase_sentences.update(builtin_paraphrases()[column].dropna())
    parallel = builtin_parallel_eval(languages)
    rows = []
    for lang in languages:
        classification = builtin_classification(lang)
        rows.append({
            "language": lang,
            "corpus": len(builtin_corpus(lang)),
            "translations": len(builtin_translations(lang)),
            "paraphrase_pairs": len(builtin_paraphrases()),
            "parallel_eval": len(parallel),
            "classification_train": int((classification["split"] == "train").sum()),
            "classification_test": int((classification["split"] == "test").sum()),
        })
    return pd.DataFrame(rows)


def _clear_caches() -> None:
    """Forget every parsed source and product (tests use it to recompute from scratch)."""
    for function in (_items, _concepts, available_languages, _corpus, _paraphrases,
                     _translations, _parallel_eval, _paraphrase_eval, _classification_items,
                     _evaluation_keys, _debian_translations):
        function.cache_clear()
