"""XNLI as a source of human translations for the `provided` translation engine.

XNLI (facebook/xnli) has the English MNLI-style validation (2,490) and test (5,010) pairs
translated by professional translators into 14 languages; its train split is machine-translated
and therefore not used. The Hub repository holds one parquet config per language
(`{lang}/validation-00000-of-00001.parquet`, `{lang}/test-00000-of-00001.parquet`; columns
premise, hypothesis, label) whose rows are parallel across configs, as the card's
`all_languages` config shows. Premises and hypotheses of the English config are aligned row by
row with the language's config (labels must agree row by row, which checks the alignment).
"""

from __future__ import annotations

import logging

import pandas as pd

from modsent.io import InputError

log = logging.getLogger(__name__)

REPO_ID = "facebook/xnli"
LANGUAGES = ("ar", "bg", "de", "el", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")
HUMAN_SPLITS = ("validation", "test")


def xnli_translations(lang: str, repo_id: str = REPO_ID, revision: str | None = None) -> pd.DataFrame:
    """``english, translation`` for the premises and hypotheses of XNLI's human-translated splits."""
    import datasets

    if lang not in LANGUAGES:
        raise InputError(f"language {lang!r} is not in XNLI (XNLI languages: {', '.join(LANGUAGES)})")
    rows = []
    for split in HUMAN_SPLITS:
        english = datasets.load_dataset(repo_id, "en", split=split, revision=revision)
        other = datasets.load_dataset(repo_id, lang, split=split, revision=revision)
        if len(english) != len(other) or english["label"] != other["label"]:
            raise InputError(f"{repo_id}: the {split} split of 'en' and {lang!r} are not row-parallel")
        for column in ("premise", "hypothesis"):
            rows.extend(zip(english[column], other[column]))
    frame = pd.DataFrame(rows, columns=["english", "translation"])
    log.info("XNLI %s: %d human-translated sentences", lang, len(frame))
    return frame
