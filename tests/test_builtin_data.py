"""The built-in demo data: real text from installed packages, train and evaluation kept apart."""

from __future__ import annotations

import gettext
import random
import re
from pathlib import Path

import pandas as pd
import pytest

from modsent.io import InputError
from modsent.sources import builtin
from modsent.sources.builtin import (
    DEMO_LANGUAGES,
    PROVENANCE,
    available_languages,
    builtin_classification,
    builtin_corpus,
    builtin_parallel_eval,
    builtin_paraphrase_eval,
    builtin_paraphrases,
    builtin_translations,
    clean_text,
    overlap_key,
)
from modsent.sources import builtin_catalogs
from modsent.sources.builtin_catalogs import read_mo


def _simple_key(text: str) -> str:
    """The plain normalisation: casefold and collapsed whitespace."""
    return " ".join(text.casefold().split())


# ------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("lang", DEMO_LANGUAGES)
def test_sizes_per_demo_language(lang):
    assert len(builtin_corpus(lang)) >= 1500
    assert len(builtin_translations(lang)) >= 1500
    classification = builtin_classification(lang)
    assert len(classification) >= 300
    counts = classification.groupby(["label", "split"]).size()
    # every label has items in both splits
    assert len(counts) == 2 * classification["label"].nunique()
    assert classification["label"].nunique() >= 4


def test_demo_languages_shape():
    assert DEMO_LANGUAGES[0] == "en" and len(DEMO_LANGUAGES) == 4
    assert set(DEMO_LANGUAGES) <= set(available_languages())
    # one non-Latin script (zh: Han) and one lower-resource language (ky: Kyrgyz, Cyrillic)
    assert "zh" in DEMO_LANGUAGES and "ky" in DEMO_LANGUAGES


def test_available_languages_are_those_with_text_in_a_prepared_corpus(monkeypatch):
    """The quick answer the workflow asks while parsing equals its definition on every prepared
    unit; and a language only a later source has is still found (the sources are read in order
    until every language has text)."""
    have = {lang for item in builtin._items() for lang in item.corpus}
    assert available_languages() == tuple(lang for lang in builtin.SUPPORTED_LANGUAGES if lang in have)
    assert len(available_languages()) > len(DEMO_LANGUAGES)

    def first(languages):  # every language but Kyrgyz, and a Kyrgyz line that is only noise
        return [unit for unit in builtin_catalogs.cldr_units(languages) if unit.translation("ky") is None] + [
            builtin_catalogs.Unit("test", "test", "k", "", "test", "Bonjour world", (("ky", "--- 12 ---"),))]

    def second(languages):
        return [builtin_catalogs.Unit("test", "test", "k2", "", "test", "Hello world", (("ky", "Салам дүйнө"),))]

    monkeypatch.setattr(builtin, "UNIT_SOURCES", (first,))
    builtin.available_languages.cache_clear()
    try:
        assert "ky" not in available_languages() and "de" in available_languages()
        monkeypatch.setattr(builtin, "UNIT_SOURCES", (first, second))
        builtin.available_languages.cache_clear()
        assert "ky" in available_languages()
    finally:
        builtin.available_languages.cache_clear()


def test_paraphrases_shape():
    pairs = builtin_paraphrases()
    assert list(pairs.columns) == ["pair_id", "dataset", "anchor", "positive", "negative"]
    assert len(pairs) >= 120
    assert pairs["pair_id"].is_unique
    assert set(pairs["dataset"]) >= {"builtin-countries", "builtin-pivot"}
    assert all(name.startswith("builtin-") for name in pairs["dataset"])
    # the labels the config checks know without reading the set (paraphrases.{name}.english_only)
    from modsent.sources.prepare import BUILTIN_PARAPHRASE_SETS

    assert set(pairs["dataset"]) <= set(BUILTIN_PARAPHRASE_SETS)
    assert set(BUILTIN_PARAPHRASE_SETS) == set(builtin._PARAPHRASE_GROUPS.values()) | {"builtin-pivot"}
    assert (pairs["anchor"].map(overlap_key) != pairs["positive"].map(overlap_key)).all()
    negatives = pairs["negative"].tolist()
    assert any(n is None for n in negatives) and any(isinstance(n, str) for n in negatives)
    assert not any(isinstance(n, float) for n in negatives)  # None, never NaN
    row = pairs[(pairs["anchor"] == "Germany")]
    assert row["positive"].tolist() == ["Federal Republic of Germany"]


def test_parallel_eval_shape():
    frame = builtin_parallel_eval(DEMO_LANGUAGES)
    assert list(frame.columns) == ["id", *DEMO_LANGUAGES]
    assert 300 <= len(frame)
    assert frame["id"].is_unique
    for lang in DEMO_LANGUAGES:
        assert frame[lang].map(overlap_key).is_unique, lang
        assert (frame[lang].str.len() > 0).all()
    pair = builtin_parallel_eval(["ky", "en"])
    assert list(pair.columns) == ["id", "ky", "en"] and len(pair) >= len(frame)


# ------------------------------------------------------------------------------- alignment


@pytest.mark.parametrize("lang", DEMO_LANGUAGES)
def test_translations_cover_every_paraphrase_sentence(lang):
    pairs = builtin_paraphrases()
    sentences = set()
    for column in ("anchor", "positive", "negative"):
        sentences.update(s for s in pairs[column] if s is not None)
    table = builtin_translations(lang)
    assert list(table.columns) == ["english", "translation"]
    assert table["english"].is_unique
    missing = sentences - set(table["english"])
    assert not missing, sorted(missing)[:10]
    assert (table["translation"].str.len() > 0).all()


def test_classification_is_parallel_across_languages():
    frames = {lang: builtin_classification(lang) for lang in DEMO_LANGUAGES}
    english = frames["en"]
    assert list(english.columns) == ["id", "text", "label", "split"]
    assert set(english["split"]) == {"train", "test"}
    for lang, frame in frames.items():
        assert frame["id"].tolist() == english["id"].tolist(), lang
        assert frame["label"].tolist() == english["label"].tolist(), lang
        assert frame["split"].tolist() == english["split"].tolist(), lang
    # the texts are translations, not copies of the English ones
    for lang in ("zh", "ky"):
        same = (frames[lang]["text"].map(overlap_key) == english["text"].map(overlap_key)).mean()
        assert same < 0.05, (lang, same)
    # not one dominant label: a majority-class guess is far from perfect
    assert english["label"].value_counts(normalize=True).max() < 0.5


# ------------------------------------------------------------------------ train/eval apart


def _training_texts() -> set[str]:
    texts: list[str] = []
    for lang in available_languages():
        texts += builtin_corpus(lang)
        table = builtin_translations(lang)
        texts += table["english"].tolist() + table["translation"].tolist()
    pairs = builtin_paraphrases()
    for column in ("anchor", "positive", "negative"):
        texts += [s for s in pairs[column] if s is not None]
    return set(texts)


def _evaluation_texts() -> set[str]:
    texts: list[str] = []
    frame = builtin_parallel_eval(DEMO_LANGUAGES)
    for lang in DEMO_LANGUAGES:
        texts += frame[lang].tolist()
    for lang in available_languages():
        if lang != "en":
            texts += builtin_parallel_eval(["en", lang])[lang].tolist()
        texts += builtin_classification(lang)["text"].tolist()
        pairs = builtin_paraphrase_eval(lang)
        texts += pairs["anchor"].tolist() + pairs["positive"].tolist()
    return set(texts)


def test_no_evaluation_text_in_any_training_product():
    training, evaluation = _training_texts(), _evaluation_texts()
    assert len(evaluation) > 1000
    for normalise in (overlap_key, _simple_key):
        train_keys = {normalise(t) for t in training}
        leaked = sorted(t for t in evaluation if normalise(t) in train_keys)
        assert not leaked, leaked[:10]


def test_split_is_made_before_the_products():
    # every unit sits in one pool, and an English text never in both
    pools: dict[str, set[str]] = {}
    for item in builtin._items():
        if item.english:
            pools.setdefault(overlap_key(item.english), set()).add(item.pool)
    assert all(len(p) == 1 for p in pools.values())
    shares = pd.Series([next(iter(p)) for p in pools.values()]).value_counts(normalize=True)
    assert 0.1 < shares["eval"] < 0.4


@pytest.mark.parametrize("lang", DEMO_LANGUAGES)
def test_paraphrase_eval_is_monolingual_and_one_partner_each(lang):
    pairs = builtin_paraphrase_eval(lang)
    assert list(pairs.columns) == ["id", "anchor", "positive"]
    assert len(pairs) == builtin.MAX_PARAPHRASE_EVAL if lang in ("en", "de") else len(pairs) >= 40
    assert pairs["id"].is_unique and list(pairs["id"]) == sorted(pairs["id"])
    keys = [overlap_key(t) for t in pairs["anchor"].tolist() + pairs["positive"].tolist()]
    assert len(keys) == len(set(keys)), "a text in two pairs, or a pair of one text"
    # both sides are text of the language: the language's own names / translations
    units = {overlap_key(text) for item in builtin._items() if item.pool == "eval"
             for text in ([item.english] if lang == "en" else [item.translations.get(lang)]) if text}
    assert set(keys) <= units
    if lang == "zh":
        assert all(re.search(r"[\u4e00-\u9fff]", t) for t in pairs["anchor"])


def test_paraphrase_eval_pairs_name_one_thing():
    # a name pair: both texts are names of one group in the language (e.g. territory:AL)
    pairs = builtin_paraphrase_eval("de")
    groups: dict[str, set[str]] = {}
    for item in builtin._items():
        if item.pool == "eval" and item.unit.group and "de" in item.translations:
            groups.setdefault(overlap_key(item.translations["de"]), set()).add(item.unit.group)
    named = [(a, p) for a, p in zip(pairs["anchor"], pairs["positive"])
             if overlap_key(a) in groups and overlap_key(p) in groups]
    assert len(named) >= 120
    assert all(groups[overlap_key(a)] & groups[overlap_key(p)] for a, p in named)


# ----------------------------------------------------------------------------- determinism


def test_products_are_deterministic():
    first = (
        builtin_corpus("ky"), builtin_paraphrases(), builtin_translations("zh"),
        builtin_parallel_eval(DEMO_LANGUAGES), builtin_classification("de"),
    )
    builtin._clear_caches()
    second = (
        builtin_corpus("ky"), builtin_paraphrases(), builtin_translations("zh"),
        builtin_parallel_eval(DEMO_LANGUAGES), builtin_classification("de"),
    )
    assert first[0] == second[0]
    for a, b in zip(first[1:], second[1:]):
        pd.testing.assert_frame_equal(a, b)
    # a caller that changes its copy does not change the next one
    mutated = builtin_paraphrases()
    mutated.loc[0, "anchor"] = "changed"
    assert builtin_paraphrases().loc[0, "anchor"] != "changed"


# ----------------------------------------------------------------------- real source text


def _package_root(name: str) -> Path:
    module = __import__(name)
    return Path(module.__file__).parent


def _source_blob(lang: str) -> bytes:
    """The raw bytes of every source file that holds text of ``lang``, runs of whitespace made
    one space (as the products write a message on one line)."""
    django, allauth = _package_root("django"), _package_root("allauth")
    pycountry, babel = _package_root("pycountry"), _package_root("babel")
    gettext_dir = {"zh": "zh_Hans"}.get(lang, lang)
    paths = []
    if lang == "en":
        paths += list((pycountry / "databases").glob("*.json"))
        paths += list(django.glob("**/locale/de/LC_MESSAGES/*.mo"))
        paths += list((allauth / "locale" / "de" / "LC_MESSAGES").glob("*.mo"))
        paths += [babel / "locale-data" / "en.dat", babel / "locale-data" / "root.dat"]
    else:
        paths += list(django.glob(f"**/locale/{gettext_dir}/LC_MESSAGES/*.mo"))
        paths += list((allauth / "locale" / gettext_dir / "LC_MESSAGES").glob("*.mo"))
        pycountry_dir = {"zh": "zh_CN"}.get(lang, lang)
        paths += list((pycountry / "locales" / pycountry_dir / "LC_MESSAGES").glob("*.mo"))
        paths += [babel / "locale-data" / f"{lang}.dat"]
    blob = b"\x00".join(p.read_bytes() for p in paths if p.is_file())
    return re.sub(rb"\s+", b" ", blob)


@pytest.mark.parametrize("lang", DEMO_LANGUAGES)
def test_text_comes_from_the_installed_packages(lang):
    blob = _source_blob(lang)
    rng = random.Random(f"sample-{lang}")
    table = builtin_translations(lang)
    for _, row in table.sample(60, random_state=rng.randrange(2**31)).iterrows():
        assert row["translation"].encode("utf-8") in blob, row["translation"]
    corpus = builtin_corpus(lang)
    sample = rng.sample(corpus, 200)
    found = sum(line.encode("utf-8") in blob for line in sample)
    # lines cleaned of placeholders or markup are no longer verbatim substrings
    assert found >= 0.9 * len(sample), found
    evaluation = builtin_classification(lang)["text"].tolist()
    for text in rng.sample(evaluation, 40):
        assert text.encode("utf-8") in blob, text


def test_translations_agree_with_gettext():
    """Independent check through the standard library's gettext on two sources."""
    import django
    import pycountry

    countries = gettext.translation("iso3166-1", pycountry.LOCALES_DIR, languages=["ky"])
    table = dict(builtin_translations("ky").itertuples(index=False))
    assert table["Federal Republic of Germany"] == countries.gettext("Federal Republic of Germany")
    admin = Path(django.__file__).parent / "contrib/admin/locale/de/LC_MESSAGES/django.mo"
    with open(admin, "rb") as handle:
        catalog = gettext.GNUTranslations(handle)
    german = dict(builtin_translations("de").itertuples(index=False))
    checked = 0
    for message in read_mo(admin):
        text = message.msgid
        if message.context is None and text in german and clean_text(text) == text:
            if german[text] != catalog.gettext(text):
                # another source (CLDR, pycountry) translated the same English text first
                continue
            checked += 1
    assert checked >= 50


# --------------------------------------------------------------------------- errors, misc


@pytest.mark.parametrize("call", [
    lambda: builtin_corpus("sw"),
    lambda: builtin_translations("xx"),
    lambda: builtin_classification("sw"),
    lambda: builtin_parallel_eval(["en", "sw"]),
    lambda: builtin_paraphrase_eval("sw"),
])
def test_unknown_language_fails_clearly(call):
    with pytest.raises(InputError) as err:
        call()
    message = str(err.value)
    assert ("'sw'" in message or "'xx'" in message) and "available" in message
    assert "ky" in message and "de" in message


def test_clean_text():
    assert clean_text("Ensure this value has at most %(limit_value)d characters "
                      "(it has %(show_value)d).") == (
        "Ensure this value has at most characters (it has).")
    assert clean_text("<a href=\"{url}\">Sign in</a> &amp; go") == "Sign in & go"
    assert clean_text("Choose %s “%(name)s” 100%%") == "Choose 100%"
    assert clean_text("  Name:  ") == "Name"
    assert clean_text("{0} и {1}") == "и"


def test_provenance_matches_installed_versions():
    assert {p["source"] for p in PROVENANCE} == {"django", "django-allauth", "pycountry", "cldr"}
    for item in PROVENANCE:
        assert {"package", "version", "files", "licence", "content", "url"} <= set(item)
    for package, (pinned, installed) in builtin.source_versions().items():
        assert installed == pinned, (package, pinned, installed)


def test_read_mo_rejects_a_broken_file(tmp_path):
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"not a catalog at all, but long enough")
    with pytest.raises(InputError, match="bad.mo"):
        read_mo(bad)
    import django

    good = (Path(django.__file__).parent / "conf/locale/de/LC_MESSAGES/django.mo").read_bytes()
    truncated = tmp_path / "truncated.mo"
    truncated.write_bytes(good[:2000])
    with pytest.raises(InputError, match="truncated"):
        read_mo(truncated)


# ------------------------------------------------------------------- Debian's gettext catalogs


def _write_catalog(path: Path, messages: dict[str, str]) -> None:
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    catalog = Catalog(locale=path.parts[-3].split("_")[0])
    for msgid, msgstr in messages.items():
        catalog.add(msgid, msgstr)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        write_mo(handle, catalog)


def test_debian_translations_read_installed_catalogs_and_keep_evaluation_text_out(tmp_path, monkeypatch):
    from modsent.sources import builtin_catalogs
    from modsent.sources.builtin import debian_provenance, debian_translations
    from modsent.sources.prepare import prepare_translations

    held_out = builtin_parallel_eval(["en", "de"]).iloc[0]           # an evaluation sentence
    root = tmp_path / "locale"
    _write_catalog(root / "de/LC_MESSAGES/tar.mo", {
        "Cannot open archive": "Archiv kann nicht geöffnet werden",
        "_Open the file": "Datei _öffnen",
        "Usage: tar [OPTION...]\nMore help": "Aufruf: tar [OPTION...]\nMehr Hilfe",
        held_out["en"]: "eine andere Übersetzung",
        "Unrelated message": held_out["de"],
    })
    _write_catalog(root / "zh_CN/LC_MESSAGES/gtk30.mo", {"_Cancel": "取消(_C)"})
    _write_catalog(root / "de/LC_MESSAGES/unlisted.mo", {"Not read": "Nicht gelesen"})
    de = debian_translations("de", root)
    assert sorted(map(tuple, de.to_numpy().tolist())) == [
        ("Cannot open archive", "Archiv kann nicht geöffnet werden"), ("Open the file", "Datei öffnen")]
    assert debian_translations("zh", root).to_numpy().tolist() == [["Cancel", "取消"]]
    assert debian_translations("en", root)["english"].tolist() == debian_translations("en", root)["translation"].tolist()
    assert "Cancel" in debian_translations("en", root)["english"].tolist()
    packages = {row["package"]: row for row in debian_provenance(["de", "zh"], root)}
    assert set(packages) == {"tar", "libgtk-3-common"}
    assert packages["tar"]["licence"] == "GPL-3+" and packages["tar"]["languages"] == ["de"]
    # translation.provided: builtin:debian is the built-in translations, then Debian's
    monkeypatch.setattr(builtin_catalogs, "DEBIAN_LOCALE_ROOT", root)
    count = prepare_translations("builtin:debian", "de", tmp_path / "de.parquet")
    frame = pd.read_parquet(tmp_path / "de.parquet")
    assert count == len(builtin_translations("de")) + 2 == len(frame)
    assert frame["english"].iloc[-2:].tolist() == de["english"].tolist()
    with pytest.raises(InputError, match="unknown built-in translations"):
        prepare_translations("builtin:nope", "de", tmp_path / "x.parquet")
    # the config check names the packages when no catalog exists
    from modsent.config import source_errors
    monkeypatch.setattr(builtin_catalogs, "DEBIAN_LOCALE_ROOT", tmp_path / "empty")
    config = {"languages": ["en", "ky"], "translation": {"engine": "provided", "provided": "builtin:debian"}}
    assert any("found no gettext catalog" in p and "apt-get install coreutils" in p for p in source_errors(config))
