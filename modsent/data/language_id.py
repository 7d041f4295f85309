"""Offline language identification, in one place: py3langid's bundled model (97 languages,
naive Bayes over byte n-grams; no download) with its labels mapped to registry codes.

Three users: :class:`modsent.encoders.modular.ModularEncoder` routes sentences without a language
to their detected language's modules (an undetected or unknown language is an error, or an
explicit fallback); the mteb adapter tells the two sides of a cross-lingual subset apart among
the subset's own languages; the translation-quality report compares the identifier's agreement
on machine translations with its agreement on human translations of the same sources or, where
there are none, of the same language (:func:`human_agreement`), because on short UI strings and names it misreads even good human
text (Kyrgyz as Russian or Kazakh, Turkish as Azerbaijani).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from modsent import languages as registry

# py3langid labels that name a variety of one registry language, and registry codes written
# with a region or script
LABEL_ALIASES = {"wuu": "zh", "yue": "zh", "cmn": "zh", "nb": "no", "nn": "no"}
CODE_ALIASES = {"zh-cn": "zh", "zh-hans": "zh", "zh-tw": "zh", "zh-hant": "zh", "nb": "no", "nn": "no"}
# Identification is unreliable on names and single words: agreement counts sentences this long
# (a third of it for scripts that write a word in one or two characters).
MIN_CHARS = 20
DENSE_SCRIPTS = {"Hans", "Hant", "Jpan", "Hang", "Kore"}


def label_of(code: str) -> str:
    """The identifier's label for a registry code (``zh-Hant`` -> ``zh``)."""
    code = CODE_ALIASES.get(code.lower(), code.lower())
    return code.split("-")[0]


def code_of(label: str) -> str:
    """The registry code for an identifier label (``cmn`` -> ``zh``), or the label itself."""
    return LABEL_ALIASES.get(label, label)


@functools.cache
def _model_labels() -> tuple[str, ...]:
    return tuple(_load().labels)


def _load():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE)


def supported(code: str) -> bool:
    """Whether the identifier knows language ``code``."""
    return label_of(code) in _model_labels()


def min_chars(code: str) -> int:
    """The length from which an identification of a ``code`` sentence is counted."""
    dense = registry.is_registered(code) and registry.get(code).script in DENSE_SCRIPTS
    return MIN_CHARS // 3 if dense else MIN_CHARS


class LanguageIdentifier:
    """Identify sentences among ``candidates`` (registry codes), or among every language the
    model knows (``candidates=None``). Candidates it does not know are listed in ``unknown``."""

    def __init__(self, candidates: Iterable[str] | None = None):
        self._identifier = _load()
        self.candidates = None if candidates is None else list(dict.fromkeys(candidates))
        self.unknown: list[str] = []
        self._labels: dict[str, str] = {}
        if self.candidates is not None:
            known = set(self._identifier.labels)
            for code in self.candidates:
                label = label_of(code)
                if label in known:
                    self._labels.setdefault(label, code)
                else:
                    self.unknown.append(code)
            if self._labels:
                self._identifier.set_languages(sorted(self._labels))

    @property
    def usable(self) -> bool:
        """False when candidates were given and the model knows none of them."""
        return self.candidates is None or bool(self._labels)

    def identify(self, sentences: Sequence[str]) -> list[str]:
        """The code of each sentence's identified language (a candidate's code as given)."""
        if not self.usable:
            raise ValueError("the identifier knows none of the candidate languages")
        out = []
        for sentence in sentences:
            label = self._identifier.classify(sentence)[0]
            out.append(self._labels.get(label) or code_of(label))
        return out


# Human translations of the same English sources are the better reference (the identifier's
# errors depend on the text: country names fool it far more than UI sentences); with fewer than
# this many of them, every built-in human translation into the language is used.
MIN_MATCHED = 30


@functools.cache
def _identified_human_translations(lang: str):
    """english, translation, correct (identified as ``lang``) of the built-in human translations
    into ``lang`` that are long enough to identify; None where there are none."""
    from modsent.sources.builtin import builtin_translations
    from modsent.sources.builtin_catalogs import SUPPORTED_LANGUAGES

    if lang not in SUPPORTED_LANGUAGES or not supported(lang):
        return None
    rows = builtin_translations(lang)
    rows = rows[rows["translation"].astype(str).str.strip().str.len() >= min_chars(lang)]
    if rows.empty:
        return None
    target = code_of(label_of(lang))
    found = LanguageIdentifier().identify(rows["translation"].astype(str).tolist())
    return rows.assign(correct=[code == target for code in found])[["english", "translation", "correct"]]


def human_agreement(lang: str, sources: Iterable[str] | None = None) -> tuple[float, int, str] | None:
    """(share identified as ``lang``, sentences counted, scope) on the built-in human
    translations into ``lang``: those of the same English ``sources`` where at least
    :data:`MIN_MATCHED` exist (scope ``"same sources"``), else all of them (``"all built-in"``).
    None where the built-in data has no translations into ``lang`` or the identifier does not
    know it. The reference a machine translation's agreement is compared with."""
    rows = _identified_human_translations(lang)
    if rows is None:
        return None
    if sources is not None:
        matched = rows[rows["english"].isin(set(sources))]
        if len(matched) >= MIN_MATCHED:
            return float(matched["correct"].mean()), len(matched), "same sources"
    return float(rows["correct"].mean()), len(rows), "all built-in"
