"""Multi-parallel paraphrase data: the English set, translation units, per-language files and
the pair builders the training stages use.

Files (all parquet):

    results/paraphrase/en.parquet          pair_id, dataset, anchor, positive, negative
    results/translation/units.parquet      unit_id, text   (unique English sentences)
    results/translation/{lang}.parquet     unit_id, text, translation
    results/paraphrase/{lang}.parquet      the English pairs with every sentence translated
    results/paraphrase/en.all.parquet      en.parquet and the datasets marked english_only (not
                                           translated): the English-only methods' pairs

A pair exists in language L when all of its sentences have a translation into L; machine
translation returns every unit, so then every language has the same pair_ids. With provided
(human) translations a pair may be missing in a language; the count is logged and reported,
and builders that combine languages use the pair_ids the languages share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from modsent.io import InputError
from modsent.sources.paraphrase import combine_pairs, read_pairs
from modsent.data.translation import make_units

log = logging.getLogger(__name__)

SENTENCE_COLUMNS = ("anchor", "positive", "negative")


def merge_english(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The configured English datasets (each already capped) as one contract frame; a pair id
    that occurs in two datasets is kept once (the first)."""
    merged = combine_pairs(read_pairs(path) for path in paths)
    if merged.empty:
        raise InputError("the English paraphrase datasets hold no pairs")
    return merged


def english_training_pairs(english: str | Path, english_only: Iterable[str | Path]) -> pd.DataFrame:
    """The English pairs (``en.parquet``) followed by those of the datasets that are not
    translated (``paraphrases.{name}.english_only``): the English-only methods' training pairs
    (``en.all.parquet``). A pair id already there is kept once, the first."""
    return combine_pairs([read_pairs(english), *(read_pairs(path) for path in english_only)])


def translation_units(pairs: pd.DataFrame) -> pd.DataFrame:
    """Every distinct English sentence of the pairs once, with its content-hash id, sorted by
    id: a sentence in several pairs or datasets is translated once per language."""
    return make_units(pd.concat([pairs[c] for c in SENTENCE_COLUMNS]).dropna().tolist())


def align_provided(units: pd.DataFrame, provided: pd.DataFrame, lang: str) -> tuple[pd.DataFrame, int]:
    """Human translations aligned on the English text; returns (translated units, dropped)."""
    table = dict(zip(provided["english"], provided["translation"]))
    translation = units["text"].map(table)
    kept = units.assign(translation=translation).dropna(subset=["translation"])
    kept = kept[kept["translation"].str.strip() != ""].reset_index(drop=True)
    dropped = len(units) - len(kept)
    if kept.empty:
        raise InputError(f"no English paraphrase sentence has a provided translation into {lang!r}")
    log.info("provided translations into %s: %d of %d sentences; %d dropped (no translation)",
             lang, len(kept), len(units), dropped)
    return kept, dropped


def gather_shards(units: pd.DataFrame, shard_paths: Iterable[str | Path]) -> pd.DataFrame:
    """Join the shards of one language; every unit must come back exactly once."""
    parts = pd.concat([pd.read_parquet(p) for p in shard_paths], ignore_index=True)
    if parts["unit_id"].duplicated().any():
        raise RuntimeError("a translation unit came back twice from the shards")
    merged = units.merge(parts[["unit_id", "translation"]], on="unit_id", how="left")
    if merged["translation"].isna().any():
        raise RuntimeError(f"{int(merged['translation'].isna().sum())} units have no translation")
    return merged


def translate_pairs(english: pd.DataFrame, translations: pd.DataFrame) -> pd.DataFrame:
    """The English pairs with each sentence replaced by its translation; pairs with an
    untranslated sentence are dropped."""
    table = dict(zip(translations["text"], translations["translation"]))
    out = english.copy()
    keep = pd.Series(True, index=out.index)
    for column in SENTENCE_COLUMNS:
        mapped = out[column].map(table)
        if column == "negative":
            keep &= out[column].isna() | mapped.notna()
        else:
            keep &= mapped.notna()
        out[column] = mapped
    return out[keep].reset_index(drop=True)


# ---- pair builders --------------------------------------------------------------------------


def monolingual_pairs(pairs_l: pd.DataFrame) -> pd.DataFrame:
    """(anchor, positive, negative) in language L: the SE adapter's training data."""
    return pairs_l[["pair_id", "anchor", "positive", "negative"]].reset_index(drop=True)


def crosslingual_paraphrase_pairs(pairs_en: pd.DataFrame, pairs_l: pd.DataFrame) -> pd.DataFrame:
    """(English anchor, its paraphrase in L): the `pp` alignment data. The hard negative, where
    there is one, is in L too (it competes with the positive)."""
    kept = ["pair_id", "positive", "negative"] + (["dataset"] if "dataset" in pairs_l.columns else [])
    joined = pairs_en[["pair_id", "anchor"]].merge(pairs_l[kept], on="pair_id", how="inner")
    return joined.reset_index(drop=True)


def parallel_pairs(translations: pd.DataFrame, provided: pd.DataFrame | None = None) -> pd.DataFrame:
    """(English sentence, its translation in L): the `pl` alignment data, one row per unit of
    ``translations`` (unit_id, text, translation), then the rows of ``provided`` (english,
    translation: human translations, ``alignment.provided_translations``) that are not already
    there; rows without both texts are dropped (``alignment.max_parallel`` is applied by the
    stage: ``modular.alignment.alignment_pairs``)."""
    from modsent.data.translation import unit_id

    frame = translations.rename(columns={"text": "english"})[["unit_id", "english", "translation"]]
    if provided is not None:
        extra = provided_sample(provided, None)
        extra.insert(0, "unit_id", extra["english"].map(unit_id))
        frame = pd.concat([frame, extra], ignore_index=True)
        frame = frame.drop_duplicates(subset=["english", "translation"], keep="first").reset_index(drop=True)
    return frame


def provided_sample(provided: pd.DataFrame, limit: int | None, *, source: str = "provided translations") -> pd.DataFrame:
    """The rows of a provided translations file (english, translation) that
    ``alignment.provided_translations`` trains on: both texts present, each pair once, and with
    ``limit`` the ``limit`` pairs of smallest content hash (the same rows whatever their order,
    in the English embeddings job and in every pl job)."""
    missing = {"english", "translation"} - set(provided.columns)
    if missing:
        raise InputError(f"{source}: missing column(s) {sorted(missing)} (expected english, translation)")
    rows = provided[["english", "translation"]]
    rows = rows[rows["english"].map(_usable) & rows["translation"].map(_usable)]
    rows = rows.drop_duplicates().reset_index(drop=True)
    return smallest_hashes(rows, limit)


def smallest_hashes(rows: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """At most ``limit`` rows (english, translation): those of smallest content hash, in their order."""
    from modsent.data.translation import unit_id

    if limit is None or len(rows) <= limit:
        return rows
    keys = [unit_id(f"{e}\t{t}") for e, t in zip(rows["english"], rows["translation"])]
    return rows.iloc[np.sort(np.argsort(keys, kind="stable")[:limit])].reset_index(drop=True)


def _usable(text) -> bool:
    return isinstance(text, str) and bool(text.strip())


def crosslingual_mix(pairs_by_lang: dict[str, pd.DataFrame], seed: int) -> pd.DataFrame:
    """Full_c: for every pair id the languages share, the anchor's and the positive's language
    are drawn at random (independently, from all languages, English included). The pair's
    ``dataset`` is kept where every language's frame has one (else length-grouped batches group
    by length alone)."""
    langs = sorted(pairs_by_lang)
    shared = set.intersection(*(set(f["pair_id"]) for f in pairs_by_lang.values()))
    ids = sorted(shared)
    indexed = {lang: f.set_index("pair_id") for lang, f in pairs_by_lang.items()}
    rng = np.random.default_rng(seed)
    a_lang = rng.choice(langs, size=len(ids))
    p_lang = rng.choice(langs, size=len(ids))
    datasets = all("dataset" in f.columns for f in pairs_by_lang.values())  # a pair id's, in every language
    rows = []
    for pid, la, lp in zip(ids, a_lang, p_lang):
        rows.append({"pair_id": pid, "anchor_lang": la, "anchor": indexed[la].at[pid, "anchor"],
                     "positive_lang": lp, "positive": indexed[lp].at[pid, "positive"],
                     "negative": indexed[lp].at[pid, "negative"],
                     **({"dataset": indexed[la].at[pid, "dataset"]} if datasets else {})})
    return pd.DataFrame(rows, columns=["pair_id", "anchor_lang", "anchor", "positive_lang", "positive", "negative",
                                       *(["dataset"] if datasets else [])])
