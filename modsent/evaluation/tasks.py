"""One place per evaluation task kind: the columns of its normalised dataset files, which
sentences a language needs encoded, and how a system is scored from those embeddings.

A dataset of :mod:`modsent.sources.evaluation` names its kind; the suite
(:mod:`modsent.evaluation.suite`) asks this registry for the kind's sentences (embedding step)
and scores (scoring step), so a new kind of task is one :class:`TaskKind` registered here
(and a dataset of that kind), and a new dataset of an existing kind is a catalogue entry only.

============== ================================================ ==========================
kind           columns                                          scores
============== ================================================ ==========================
pairs          pair_id, lang1, lang2, sentence1, sentence2,     STS/STR Spearman ×100
               score                                            (mono, cross, language bias)
parallel       id, text (aligned across languages)              xsim error ×100, RSIM
bitext_pairs   id, lang1, lang2, sentence1, sentence2           xsim error ×100 en↔X
classification id, text, label, split                           accuracy ×100 (mono, zero-shot)
paraphrase     id, anchor, positive (one language per subset)   paraphrase mining error ×100
============== ================================================ ==========================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd

from modsent.io import InputError
from modsent.languages import PIVOT_LANGUAGE


@dataclass(frozen=True)
class Scoring:
    """What scoring one (system, dataset) reads: the dataset's definition, its non-empty subsets
    (name → frame), the system's embeddings per language (text → vector lookups), the
    configured languages in order, and the suite's settings (xsim k and margin, the
    classifier's seed)."""

    dataset: object
    frames: Mapping[str, pd.DataFrame]
    embeddings: Mapping[str, Callable[[Sequence[str]], np.ndarray]]
    languages: Sequence[str]
    k: int = 4
    margin: str = "ratio"
    seed: int = 0


@dataclass(frozen=True)
class TaskKind:
    """A kind of evaluation task. ``columns``: the normalised file's columns; ``text_columns``:
    the columns holding sentences, with the column naming each one's language
    (``(text, lang)``; lang None: the subset's language, one per file); ``score(Scoring) ->
    dict`` the scores (``{metric: {"average": ..., "values": {...}}, ...}``)."""

    name: str
    columns: tuple[str, ...]
    text_columns: tuple[tuple[str, str | None], ...]
    score: Callable[[Scoring], dict]

    def sentences(self, frames: Sequence[pd.DataFrame], lang: str) -> list[str]:
        """The distinct sentences in language ``lang`` of a dataset's subsets, in first-seen
        order (subsets of one language hold only that language's texts)."""
        texts: list[str] = []
        for frame in frames:
            for column, lang_column in self.text_columns:
                rows = frame if lang_column is None else frame[frame[lang_column] == lang]
                texts += rows[column].tolist()
        return list(dict.fromkeys(texts))


def _pct(value: float) -> float:
    return float(100 * value)


def _summary(values: dict[str, float]) -> dict:
    finite = [v for v in values.values() if v is not None and math.isfinite(v)]
    return {"average": float(np.mean(finite)) if finite else None, "values": values}


def _key(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


def score_pairs(s: Scoring) -> dict:
    """STS/STR: Spearman of cosine vs gold per subset; multi-parallel sets also every language
    pair joined on pair_id, and the language bias."""
    from modsent.evaluation import metrics  # scipy: not while the workflow plans

    dataset, frames, emb, languages = s.dataset, s.frames, s.embeddings, s.languages
    mono, cross = {}, {}
    for subset, frame in frames.items():
        l1, l2 = frame["lang1"].iloc[0], frame["lang2"].iloc[0]
        value = _pct(metrics.sts_spearman(emb[l1](frame["sentence1"]), emb[l2](frame["sentence2"]),
                                          frame["score"].to_numpy()))
        if l1 == l2:
            mono[l1] = value
        else:
            cross[(l1, l2)] = value
    out = {"mono": _summary(mono)}
    if dataset.multi_parallel:
        monolingual = {f["lang1"].iloc[0]: f for f in frames.values() if f["lang1"].iloc[0] == f["lang2"].iloc[0]}
        langs = [lang for lang in languages if lang in monolingual]
        common = set.intersection(*(set(monolingual[lang]["pair_id"]) for lang in langs)) if langs else set()
        ids = sorted(common)
        aligned = {lang: monolingual[lang].set_index("pair_id").loc[ids] for lang in langs}
        combos = {}
        for a in langs:
            for b in langs:
                u = emb[a](aligned[a]["sentence1"])
                v = emb[b](aligned[b]["sentence2"])
                gold = aligned[a]["score"].to_numpy()
                combos[(a, b)] = (metrics.cosine_rows(u, v), gold)
                if a != b:
                    cross[(a, b)] = _pct(metrics.sts_spearman(u, v, gold))
        if len(langs) >= 2:
            bias, bilingual, pooled = metrics.language_bias(combos)
            out["language_bias"] = {"average": _pct(bias), "bilingual": _pct(bilingual), "pooled": _pct(pooled),
                                    "languages": langs, "pairs": len(ids)}
    if cross:
        out["cross"] = _summary({_key(pair): value for pair, value in metrics.symmetric_average(cross).items()})
    return out


def score_parallel(s: Scoring) -> dict:
    """Bitext mining over aligned ids: xsim error for every ordered language pair; RSIM."""
    from modsent.evaluation import metrics  # scipy: not while the workflow plans

    frames, emb, languages, k, margin = s.frames, s.embeddings, s.languages, s.k, s.margin
    langs = [lang for lang in languages if lang in frames]
    if len(langs) < 2:
        return {}
    ids = sorted(set.intersection(*(set(frames[lang]["id"]) for lang in langs)))
    vectors = {lang: emb[lang](frames[lang].set_index("id").loc[ids, "text"]) for lang in langs}
    errors = metrics.xsim_all_pairs(vectors, k=k, margin=margin)
    average, per_pair = metrics.rsim(vectors)
    return {
        "xsim": {**_summary({_key(pair): _pct(v) for pair, v in errors.items()}), "sentences": len(ids),
                 "k": k, "margin": margin},
        "rsim": {**_summary({_key(pair): float(v) for pair, v in per_pair.items()}), "sentences": len(ids)},
    }


def _both_directions(u: np.ndarray, v: np.ndarray, k: int, margin: str) -> float:
    """xsim error rate, the mean of mining u → v and v → u (rows aligned)."""
    from modsent.evaluation import metrics  # scipy: not while the workflow plans

    return (metrics.xsim_error_rate(u, v, k=k, margin=margin)
            + metrics.xsim_error_rate(v, u, k=k, margin=margin)) / 2


def score_bitext_pairs(s: Scoring) -> dict:
    """Bitext mining en↔X on given pairs: xsim error, the mean of both directions."""
    frames, emb, k, margin = s.frames, s.embeddings, s.k, s.margin
    values = {}
    for frame in frames.values():
        l1, l2 = frame["lang1"].iloc[0], frame["lang2"].iloc[0]
        both = _both_directions(emb[l1](frame["sentence1"]), emb[l2](frame["sentence2"]), k, margin)
        other = l1 if l2 == PIVOT_LANGUAGE else l2
        values[other] = _pct(both)
    return {"xsim": {**_summary(values), "k": k, "margin": margin, "directions": "mean of en→X and X→en"}}


def score_classification(s: Scoring) -> dict:
    """Logistic regression on frozen embeddings: in-language and zero-shot from English."""
    from modsent.evaluation import metrics  # scipy: not while the workflow plans

    frames, emb, seed = s.frames, s.embeddings, s.seed
    def split(lang, name):
        frame = frames[lang]
        part = frame[frame["split"] == name]
        return emb[lang](part["text"]), part["label"].to_numpy()

    mono, zero_shot = {}, {}
    english = split(PIVOT_LANGUAGE, "train") if PIVOT_LANGUAGE in frames else None
    for lang in frames:
        train_x, train_y = split(lang, "train")
        test_x, test_y = split(lang, "test")
        if len(test_y) == 0:
            continue
        if len(set(train_y)) >= 2:
            mono[lang] = _pct(metrics.classification_accuracy(train_x, train_y, test_x, test_y, seed=seed))
        if english is not None and lang != PIVOT_LANGUAGE and len(set(english[1])) >= 2:
            zero_shot[lang] = _pct(metrics.classification_accuracy(*english, test_x, test_y, seed=seed))
    out = {"mono": _summary(mono)}
    if zero_shot:
        out["zero_shot"] = _summary(zero_shot)
    return out


def score_paraphrase_pairs(s: Scoring) -> dict:
    """Monolingual paraphrase mining: each anchor's paraphrase among the subset's positives and
    back, scored like bitext mining inside one language (xsim error ×100, the mean of both
    directions)."""
    frames, emb, k, margin = s.frames, s.embeddings, s.k, s.margin
    values, too_small = {}, {}
    for lang, frame in frames.items():
        if len(frame) <= k:  # the margin needs k neighbours besides the right partner
            too_small[lang] = len(frame)
            continue
        values[lang] = _pct(_both_directions(emb[lang](frame["anchor"]), emb[lang](frame["positive"]),
                                             k, margin))
    out = {"error": {**_summary(values), "k": k, "margin": margin,
                     "directions": "mean of anchor→positive and positive→anchor"}}
    if too_small:
        out["error"]["skipped_languages"] = {lang: f"{n} pairs, k = {k}" for lang, n in too_small.items()}
    return out


REGISTRY: dict[str, TaskKind] = {}
_COLUMNS: dict[str, tuple[str, ...]] = {}
# kind → its normalised file's columns (a live view of the registry)
KIND_COLUMNS: Mapping[str, tuple[str, ...]] = MappingProxyType(_COLUMNS)


def register(kind: TaskKind) -> TaskKind:
    REGISTRY[kind.name] = kind
    _COLUMNS[kind.name] = kind.columns
    return kind


register(TaskKind("pairs", ("pair_id", "lang1", "lang2", "sentence1", "sentence2", "score"),
                  (("sentence1", "lang1"), ("sentence2", "lang2")), score_pairs))
register(TaskKind("parallel", ("id", "text"), (("text", None),), score_parallel))
register(TaskKind("bitext_pairs", ("id", "lang1", "lang2", "sentence1", "sentence2"),
                  (("sentence1", "lang1"), ("sentence2", "lang2")), score_bitext_pairs))
register(TaskKind("classification", ("id", "text", "label", "split"), (("text", None),), score_classification))
register(TaskKind("paraphrase", ("id", "anchor", "positive"), (("anchor", None), ("positive", None)),
                  score_paraphrase_pairs))

def get(name: str) -> TaskKind:
    if name not in REGISTRY:
        raise InputError(f"unknown evaluation task kind {name!r}; kinds: {', '.join(REGISTRY)}")
    return REGISTRY[name]
