"""The language registry: one table mapping our language codes to FLORES-200/NLLB codes.

A language code in modsent is the ISO 639-1 code where one exists (``de``), else the ISO 639-3
code (``ckb``); a language FLORES-200 has in two scripts gets ``-Script`` on its second script
(``zh`` is Simplified, ``zh-Hant`` Traditional Chinese). The table covers every FLORES-200
language (``modsent/data/languages.tsv``, made by ``tools/make_language_table.py``).

Language codes end up in file paths, so the workflow accepts registered codes only; aliases
(ISO 639-3 ``deu``, the macrolanguage ``ara``, the FLORES code ``deu_Latn``) are resolved by
:func:`resolve` for messages and for users' convenience, never silently in paths.
"""

from __future__ import annotations

import csv
import difflib
import functools
import re
from dataclasses import dataclass
from importlib import resources

import pycountry

# The method aligns every language to English: the pivot of alignment, pairs and evaluation
PIVOT_LANGUAGE = "en"

CODE_PATTERN = r"[a-z]{2,3}(?:-[A-Z][a-z]{3})?"


@dataclass(frozen=True)
class Language:
    code: str  # our code: ISO 639-1 where one exists, e.g. "de", "zh-Hant"
    iso639_3: str  # e.g. "deu"; for macrolanguages the individual language FLORES uses ("arb")
    flores: str  # FLORES-200 code, e.g. "deu_Latn"
    nllb: str | None  # NLLB-200 language code, None where NLLB-200 does not cover it
    script: str  # ISO 15924, e.g. "Latn"
    name: str  # English name


class UnknownLanguageError(ValueError):
    """A code that is not in the registry; the message suggests the registered code."""


@functools.cache
def _table() -> dict[str, Language]:
    text = resources.files("modsent.data").joinpath("languages.tsv").read_text("utf-8")
    rows = csv.DictReader(text.splitlines(), delimiter="\t")
    return {
        r["code"]: Language(r["code"], r["iso639_3"], r["flores"], r["nllb"] or None,
                            r["script"], r["name"])
        for r in rows
    }


@functools.cache
def _aliases() -> dict[str, str]:
    """Other spellings of a registered code → the code. Only unambiguous aliases are kept."""
    table = _table()
    candidates: dict[str, set[str]] = {}

    def add(alias: str | None, code: str) -> None:
        if alias and alias not in table:
            candidates.setdefault(alias, set()).add(code)

    for code, lang in table.items():
        add(lang.flores, code)
        if lang.nllb:
            add(lang.nllb, code)
        if "-" in code:
            continue  # a secondary script has no alias of its own besides its FLORES code
        add(lang.iso639_3, code)
        record = pycountry.languages.get(alpha_3=lang.iso639_3)
        if record is not None and hasattr(record, "bibliographic"):
            add(record.bibliographic, code)
        # the macrolanguage's ISO 639-3 code, e.g. "ara" → "ar", "zho" → "zh"
        macro = pycountry.languages.get(alpha_2=code) if len(code) == 2 else None
        if macro is not None:
            add(macro.alpha_3, code)
    return {alias: codes.pop() for alias, codes in candidates.items() if len(codes) == 1}


def codes() -> list[str]:
    """All registered codes, sorted."""
    return sorted(_table())


def is_registered(code: str) -> bool:
    return code in _table()


def get(code: str) -> Language:
    """The registry entry of a registered code; raises UnknownLanguageError otherwise."""
    try:
        return _table()[code]
    except KeyError:
        raise UnknownLanguageError(unknown_message(code)) from None


def resolve(code_or_alias: str) -> Language:
    """Accept a registered code or an alias (``deu``, ``ara``, ``deu_Latn``, ``ger``)."""
    if code_or_alias in _table():
        return _table()[code_or_alias]
    alias = _aliases().get(code_or_alias)
    if alias is None:
        raise UnknownLanguageError(unknown_message(code_or_alias))
    return _table()[alias]


def by_flores(flores_code: str) -> Language:
    for lang in _table().values():
        if lang.flores == flores_code:
            return lang
    raise UnknownLanguageError(f"{flores_code!r} is not a FLORES-200 code")


# Codes in common use that the registry spells otherwise: deprecated ISO 639-1 codes, the
# Norwegian macrolanguage, Filipino, and BCP 47 tags naming Chinese by script or region.
OTHER_SPELLINGS = {
    "no": ("nb", "Nynorsk is 'nn'"), "nor": ("nb", "Nynorsk is 'nn'"),
    "iw": ("he", None), "in": ("id", None), "ji": ("yi", None), "jw": ("jv", None), "mo": ("ro", None),
    "fil": ("tl", "Filipino is based on it"),
    "zh-Hans": ("zh", None), "zh-CN": ("zh", None), "zh-SG": ("zh", None),
    "zh-TW": ("zh-Hant", None), "zh-HK": ("zh-Hant", None), "zh-MO": ("zh-Hant", None),
}


def suggestion(code: str) -> tuple[str, str | None] | None:
    """(the registered code to write instead of ``code``, a note or None), or None: for an alias
    (``deu``), a code in :data:`OTHER_SPELLINGS` (``iw``), and a code spelt with other case,
    spaces, an underscore, a region (``pt-BR``) or its language's own script (``sr-Cyrl``)."""
    table = _table()

    def lookup(text: str) -> tuple[str, str | None] | None:
        if text in OTHER_SPELLINGS and OTHER_SPELLINGS[text][0] in table:
            return OTHER_SPELLINGS[text]
        found = text if text in table else _aliases().get(text)
        return None if found is None else (found, None)

    cleaned = code.strip().replace("_", "-")
    for text in dict.fromkeys([code, cleaned]):
        found = lookup(text) if text != code or text not in table else None
        if found is not None:
            return found
    parts = cleaned.split("-")
    if not 1 <= len(parts) <= 3 or not parts[0].isalpha():
        return None
    language, rest = parts[0].lower(), parts[1:]
    script = next((p.title() for p in rest if len(p) == 4 and p.isalpha()), None)
    regions = [p.upper() for p in rest if len(p) == 2 and p.isalpha() or len(p) == 3 and p.isdigit()]
    if len(rest) != (script is not None) + len(regions):
        return None
    for candidate in [*([f"{language}-{script}"] if script else []), *(f"{language}-{r}" for r in regions), language]:
        found = lookup(candidate)
        if found is None:
            continue
        if candidate == language and script and table[found[0]].script != script:
            return None  # a script the registry does not have for this language
        return found
    return None


def unknown_message(code: object) -> str:
    """Explain why ``code`` is not accepted and what to write instead."""
    text = str(code)
    suggested = suggestion(text) if isinstance(code, str) else None
    if suggested is not None:
        alias, note = suggested
        lang = _table()[alias]
        return (f"{text!r} is not a modsent language code; write {alias!r} ({lang.name}, {lang.flores}"
                f"{f'; {note}' if note else ''})")
    if not re.fullmatch(CODE_PATTERN, text):
        return (f"{text!r} is not a language code: expected an ISO 639-1 code such as 'de', an "
                f"ISO 639-3 code such as 'ckb', or a code with a script such as 'zh-Hant'")
    close = difflib.get_close_matches(text, list(_table()), n=3, cutoff=0.6)
    hint = f"; close registered codes: {', '.join(close)}" if close else ""
    return (f"{text!r} is not a registered language (the registry holds the {len(_table())} "
            f"FLORES-200 languages; `modsent languages` lists them){hint}")


def wildcard_regex(selected: list[str] | None = None) -> str:
    """A regex matching exactly the registered codes (or ``selected``), for Snakemake
    wildcard constraints: nothing else, so a wildcard can never become a path like ``../x``."""
    chosen = sorted(selected if selected is not None else _table(), key=len, reverse=True)
    return "|".join(re.escape(c) for c in chosen)
