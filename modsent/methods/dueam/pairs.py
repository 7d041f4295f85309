"""DuEAM's training pairs: a pure function of (pair files, translation files, settings), so the
WMD stage scores exactly the pairs the training reads.

Sources. The multi-parallel paraphrase files ``results/paraphrase/{lang}.parquet`` (``pair_id,
dataset, anchor, positive, negative``: the same pair ids in every language) stand in for XNLI:
the rows of the datasets in ``datasets`` (default ``mnli``: premise = anchor, hypotheses =
positive and negative, the entailed and the contradicting one; the labels are not used) of every
language. XNLI's neutral hypotheses have no counterpart: the paraphrase files hold NLI rows as
(premise, entailment, contradiction) triplets, so the weak pairs are two of XNLI's three per
premise. The translations
``results/translation/{lang}.parquet`` (``unit_id, text, translation``) give parallel pairs.

Held out: ``split_heldout`` on the English (pivot) rows picks ``eval_pairs`` pair ids (the rule
of the baselines and m-ST5: :func:`modsent.methods.baselines.split_heldout_by_pivot`); they
leave the training pairs of every language, and no parallel pair holds one of their texts.

Data settings (``data``):

- ``weak`` (:func:`weak_pairs`): for every training pair id, the monolingual pair (anchor in L,
  positive in L) of every language L (en-en, X-X), and the cross-lingual pairs (English anchor,
  positive in X) and (anchor in X, English positive) of every other language X: the paper's
  premise/hypothesis pairs with the hypothesis (or the premise) replaced by its translation.
  With ``contradictions`` (the default) the same pairs again with the row's negative in place of
  its positive, where the row has one (the paper drops XNLI's labels: a premise is paired with
  its contradiction as with its entailment).
- ``unsup`` (:func:`unsupervised_pairs`): the weak pairs with their second sides randomly
  re-paired (a seeded permutation with no pair keeping a second side of its own pair id), so
  the pairs hold the same sentences and languages and no relation.
- ``parallel`` (:func:`parallel_pairs`): (English sentence, its translation into X) for every X.
- ``weak+parallel``: both (``max_pairs`` caps each part).

A pair whose two texts are equal (a name spelt alike in two languages) is dropped and counted:
it carries no signal (d_wmd = d_euc = 0). ``max_pairs`` keeps a seeded sample. Rows are ordered
by group (pair id, or ``unit:{unit_id}``), so the pairs of one group are neighbours.

Bad input is an :class:`modsent.io.InputError`: a used pair (or translation) with an empty side,
duplicate pair ids, a dataset filter that selects nothing, a re-pairing that cannot be made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from modsent.io import InputError

PAIR_COLUMNS = ["group", "kind", "lang_a", "text_a", "lang_b", "text_b"]


@dataclasses.dataclass
class PairSet:
    """The training pairs (columns :data:`PAIR_COLUMNS`), the held-out pairs of every language
    (``pair_id, anchor, positive``), the pivot language and counts for the metrics."""

    rows: pd.DataFrame
    heldout: dict[str, pd.DataFrame]
    pivot: str
    stats: dict


def _empty(value) -> bool:
    return not isinstance(value, str) or not value.strip()


def read_pair_file(path: str | Path, lang: str, datasets, key: str = "datasets") -> pd.DataFrame:
    """``pair_id, anchor, positive, negative`` of the rows of ``datasets`` (None: all) in a
    paraphrase file, texts stripped. An empty anchor or positive among them is an error."""
    frame = pd.read_parquet(path)
    missing = {"pair_id", "anchor", "positive"} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: missing column(s) {sorted(missing)} (expected pair_id, dataset, anchor, "
                         "positive, negative)")
    if datasets is not None:
        if "dataset" not in frame.columns:
            raise InputError(f"{path}: no dataset column to select {key} {list(datasets)} by")
        present = sorted(frame["dataset"].dropna().unique())
        frame = frame[frame["dataset"].isin(list(datasets))]
        if frame.empty:
            raise InputError(f"{key} {list(datasets)} selects no row of {path}; its datasets: "
                             f"{', '.join(present) or 'none'} (null: every row)")
    frame = frame.assign(pair_id=frame["pair_id"].astype(str))
    if frame["pair_id"].duplicated().any():
        raise InputError(f"{path}: pair_id {frame['pair_id'][frame['pair_id'].duplicated()].iloc[0]!r} occurs twice")
    for column in ("anchor", "positive"):
        bad = frame[column].map(_empty)
        if bad.any():
            raise InputError(f"{path}: pair {frame['pair_id'][bad].iloc[0]!r} ({lang}) has an empty {column} "
                             f"({int(bad.sum())} such row(s)); every DuEAM pair needs two non-empty texts")
    negative = frame["negative"] if "negative" in frame.columns else pd.Series(None, index=frame.index)
    return pd.DataFrame({"pair_id": frame["pair_id"].to_numpy(),
                         "anchor": frame["anchor"].str.strip().to_numpy(),
                         "positive": frame["positive"].str.strip().to_numpy(),
                         "negative": negative.map(lambda t: (t.strip() or None) if isinstance(t, str) else None).to_numpy()})


def read_translation_file(path: str | Path, lang: str) -> pd.DataFrame:
    """``unit_id, text, translation`` of a translation file; an empty side is an error."""
    frame = pd.read_parquet(path)
    missing = {"unit_id", "text", "translation"} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: missing column(s) {sorted(missing)} (expected unit_id, text, translation)")
    for column in ("text", "translation"):
        bad = frame[column].map(_empty)
        if bad.any():
            raise InputError(f"{path}: unit {str(frame['unit_id'][bad].iloc[0])!r} ({lang}) has an empty {column} "
                             f"({int(bad.sum())} such row(s)); every DuEAM pair needs two non-empty texts")
    return pd.DataFrame({"unit_id": frame["unit_id"].astype(str).to_numpy(),
                         "text": frame["text"].str.strip().to_numpy(),
                         "translation": frame["translation"].str.strip().to_numpy()})


def _frame(group, kind, lang_a, text_a, lang_b, text_b) -> pd.DataFrame:
    return pd.DataFrame({"group": group, "kind": kind, "lang_a": lang_a, "text_a": text_a,
                         "lang_b": lang_b, "text_b": text_b})[PAIR_COLUMNS]


def weak_pairs(train: Mapping[str, pd.DataFrame], pivot: str, contradictions: bool = False) -> pd.DataFrame:
    """Mono pairs of every language and pivot<->X cross pairs, for every pair id all languages
    share (rows grouped by pair id): each anchor with its positive and, with ``contradictions``,
    with its negative too where both languages' rows have one."""
    langs = sorted(train)
    indexed = {lang: frame.set_index("pair_id") for lang, frame in train.items()}
    ids = sorted(set.intersection(*(set(frame.index) for frame in indexed.values())))
    if not ids:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    anchor = {lang: indexed[lang].loc[ids, "anchor"].to_numpy(dtype=object) for lang in langs}
    directions = [(lang, lang) for lang in langs] + [pair for lang in langs if lang != pivot
                                                     for pair in ((pivot, lang), (lang, pivot))]
    parts = []
    for column in ("positive", "negative") if contradictions else ("positive",):
        second = {lang: indexed[lang].loc[ids, column].to_numpy(dtype=object) for lang in langs}
        for lang_a, lang_b in directions:
            kind = "mono" if lang_a == lang_b else "cross"
            frame = _frame(ids, kind, lang_a, anchor[lang_a], lang_b, second[lang_b])
            parts.append(frame[frame["text_b"].map(lambda t: isinstance(t, str))])
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.drop_duplicates(["group", "lang_a", "text_a", "lang_b", "text_b"])  # a negative spelt as the positive
    return rows.sort_values("group", kind="stable").reset_index(drop=True)


def unsupervised_pairs(weak: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The weak pairs with their second sides (text and language) re-paired: row i takes the
    second side of row partner[i], a seeded permutation in which no row keeps a second side of
    its own group (pair id) or its own first text. Same sentences, same languages, no relation."""
    n = len(weak)
    if n < 2:
        raise InputError(f"unsupervised pairs: {n} weak pair(s) to re-pair; at least 2 are needed")
    groups = weak["group"].to_numpy(dtype=object)
    text_a, text_b = weak["text_a"].to_numpy(dtype=object), weak["text_b"].to_numpy(dtype=object)
    rng = np.random.default_rng([seed, 1])
    order = rng.permutation(n)
    partner = np.empty(n, dtype=np.int64)
    partner[order] = np.roll(order, 1)  # a cycle through every row: nobody is its own partner

    def fits(i: int, j: int) -> bool:  # row i may take row j's second side
        return groups[i] != groups[j] and text_a[i] != text_b[j]

    for i in range(n):
        if fits(i, partner[i]):
            continue
        for _ in range(100):  # swap with a random row where both then fit
            k = int(rng.integers(n))
            if k != i and fits(i, partner[k]) and fits(k, partner[i]):
                partner[i], partner[k] = partner[k], partner[i]
                break
        else:
            raise InputError(f"unsupervised pairs: no partner for pair {groups[i]!r} outside its own pair id "
                             "(too few pair ids to re-pair)")
    rows = weak.copy()
    rows["kind"] = "random"
    rows["lang_b"] = weak["lang_b"].to_numpy(dtype=object)[partner]
    rows["text_b"] = text_b[partner]
    return rows


def parallel_pairs(translations: Mapping[str, pd.DataFrame], pivot: str, excluded: set[str]) -> pd.DataFrame:
    """(English sentence, its translation into X) for every X, the units whose English text is
    in ``excluded`` (the held-out pairs' texts) left out; grouped by unit."""
    parts = []
    for lang in sorted(translations):
        frame = translations[lang]
        frame = frame[~frame["text"].isin(excluded)]
        parts.append(_frame("unit:" + frame["unit_id"], "parallel", pivot, frame["text"].to_numpy(dtype=object),
                            lang, frame["translation"].to_numpy(dtype=object)))
    if not parts:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    rows = pd.concat(parts, ignore_index=True)
    return rows.sort_values("group", kind="stable").reset_index(drop=True)


def _sample(rows: pd.DataFrame, max_pairs: int | None, seed: int, stream: int) -> pd.DataFrame:
    if max_pairs is None or len(rows) <= max_pairs:
        return rows
    keep = np.sort(np.random.default_rng([seed, stream]).choice(len(rows), size=max_pairs, replace=False))
    return rows.iloc[keep].reset_index(drop=True)


def build_pairs(pairs_paths: Mapping[str, str | Path], translation_paths: Mapping[str, str | Path] | None,
                cfg, key: str = "methods.DuEAM") -> PairSet:
    """The training pairs and held-out pairs of settings ``cfg`` (a ``DuEAMConfig``: ``data``,
    ``datasets``, ``eval_pairs``, ``max_pairs``, ``seed``) from the pair files ({lang: path})
    and, for parallel data, the translation files ({lang: path}, non-English languages). A pure
    function of the files' content and these settings. ``key`` names the settings in errors."""
    from modsent.methods import baselines as bl

    if not pairs_paths:
        raise InputError(f"{key}: no paraphrase pair files given")
    frames = {lang: read_pair_file(path, lang, cfg.datasets, f"{key}.datasets")
              for lang, path in sorted(pairs_paths.items())}
    pivot = bl.pivot_language(frames)
    train, heldout = bl.split_heldout_by_pivot(frames, cfg.eval_pairs)
    held_ids = set(frames[pivot]["pair_id"]) - set(train[pivot]["pair_id"])
    parts, stats = [], {}
    if cfg.data in ("weak", "unsup", "weak+parallel"):
        weak = weak_pairs(train, pivot, cfg.contradictions)
        weak, identical = _drop_identical(weak)
        stats["weak_identical_dropped"] = identical
        if cfg.data == "unsup":
            weak = unsupervised_pairs(weak, cfg.seed)
        parts.append(_sample(weak, cfg.max_pairs, cfg.seed, 2))
    if cfg.data in ("parallel", "weak+parallel"):
        languages = [lang for lang in sorted(pairs_paths) if lang != pivot]
        missing = [lang for lang in languages if lang not in (translation_paths or {})]
        if missing:
            raise InputError(f"{key}.data {cfg.data}: no translation file for {', '.join(missing)}")
        translations = {lang: read_translation_file(translation_paths[lang], lang) for lang in languages}
        held = frames[pivot][frames[pivot]["pair_id"].isin(held_ids)]
        excluded = {t for column in ("anchor", "positive", "negative") for t in held[column] if isinstance(t, str)}
        parallel = parallel_pairs(translations, pivot, excluded)
        parallel, identical = _drop_identical(parallel)
        stats["parallel_identical_dropped"] = identical
        parts.append(_sample(parallel, cfg.max_pairs, cfg.seed, 3))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PAIR_COLUMNS)
    if len(rows) < 1:
        raise InputError(f"{key}: no training pairs (data {cfg.data}, datasets "
                         f"{list(cfg.datasets) if cfg.datasets is not None else 'all'}, {len(held_ids)} pair ids "
                         "held out)")
    counts = rows["kind"].value_counts()
    directions = (rows["lang_a"] + "-" + rows["lang_b"]).value_counts()
    stats.update({"pairs": len(rows), "groups": int(rows["group"].nunique()),
                  "pairs_by_kind": {k: int(counts[k]) for k in sorted(counts.index)},
                  "pairs_by_languages": {k: int(directions[k]) for k in sorted(directions.index)},
                  "heldout_pair_ids": len(held_ids)})
    return PairSet(rows.reset_index(drop=True), heldout, pivot, stats)


def _drop_identical(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    same = rows["text_a"] == rows["text_b"]
    return rows[~same].reset_index(drop=True), int(same.sum())


def pair_digest(text_a: str, text_b: str) -> str:
    """A pair's identity by its texts (order matters): ties a WMD row to its training pair."""
    return hashlib.sha256(json.dumps([text_a, text_b], ensure_ascii=False).encode()).hexdigest()[:20]


def shard_of(group: str, shards: int) -> int:
    """The WMD shard of a pair group: a hash of the group, so adding pairs moves no group."""
    return int(hashlib.sha256(str(group).encode()).hexdigest()[:12], 16) % shards
