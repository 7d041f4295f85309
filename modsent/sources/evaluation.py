"""The evaluation datasets of the paper, loaded from the Hugging Face Hub or from local files and
normalised into five parquet schemas (one file per dataset and subset).

Schemas (:data:`KIND_COLUMNS`, one per task kind of :mod:`modsent.evaluation.tasks`):

- ``pairs`` (STS, STR): ``pair_id, lang1, lang2, sentence1, sentence2, score``. ``pair_id`` is
  a string, unique within the file; for a multi-parallel dataset (the same pairs translated into
  several languages) a pair has the same ``pair_id`` in every language, so cross-lingual pairs
  (``sentence1`` of one language, ``sentence2`` of another) are built at scoring time by joining
  on it. ``score`` is the gold similarity (STS) or relatedness (STR) as a float.
- ``parallel`` (FLORES-200 devtest): ``id, text``; ``id`` aligned across languages.
- ``bitext_pairs`` (Tatoeba): ``id, lang1, lang2, sentence1, sentence2``; ``lang1`` is the
  language X, ``lang2`` English.
- ``classification`` (SIB-200): ``id, text, label, split`` with split ``train``/``dev``/``test``.
- ``paraphrase`` (the built-in paraphrase pairs): ``id, anchor, positive``, both in the subset's
  language; every text appears once in the file (one right partner for mining).

Language codes are the registry's (:mod:`modsent.languages`). A subset is named by a language
code (``de``: monolingual) or by two codes as the dataset ships the pair (``en-de``).

Sources (the ``source`` argument of :func:`prepare_subset`, as the config writes them):

- ``None`` (or ``"hf"``): the dataset's Hub repository, read with ``datasets.load_dataset(repo,
  config, split=..., revision=...)`` (datasets >= 4, which never runs loading scripts; this
  module never passes ``trust_remote_code``). ``"hf:<owner/name>"`` reads a repository with the
  same layout instead (a mirror); ``{"hf": ..., "revision": ...}`` pins a commit.
- ``"local:<path>"``: local files in the layout and format of the Hub repository (or of the
  dataset's original release, where that is what the paper used): a directory searched with the
  dataset's :attr:`EvalDataset.local_files` patterns (tried as given, then under
  ``<path>/<subset>/``), or one file. ``{subset}`` in the path is replaced by the subset name
  (``{lang}`` too, for monolingual subsets). Readable formats: ``.parquet``, ``.jsonl``/
  ``.json`` (one object a line, optionally ``.gz``), ``.csv`` (quoted, with a header unless the
  dataset says otherwise), ``.tsv``/``.txt`` (tab-separated, header, no quoting) and FLORES'
  ``.dev``/``.devtest`` (one sentence a line).
- ``"builtin"``: only for ``builtin_parallel``, ``builtin_topics`` and ``builtin_paraphrase``,
  the offline demo data of :mod:`modsent.sources.builtin`.

Every Hub id, config, split and column below was read off the dataset's card, its file listing
or the loader of the MTEB task that uses it; :attr:`EvalDataset.evidence` says where, and says
what could not be verified. The tests load each dataset from ``tests/fixtures/eval/``, small
files in the same layout, columns and types with rows written for the tests.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import logging
import math
import os
import re
import warnings
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NamedTuple

import pandas as pd

from modsent import languages as registry
from modsent.evaluation.tasks import KIND_COLUMNS
from modsent.io import InputError, iter_utf8_lines, write_parquet

log = logging.getLogger(__name__)

Kind = Literal["pairs", "parallel", "bitext_pairs", "classification", "paraphrase"]
Task = Literal["sts", "str", "bitext", "classification", "paraphrase"]

TEXT_COLUMNS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "pairs": ("sentence1", "sentence2"),
        "parallel": ("text",),
        "bitext_pairs": ("sentence1", "sentence2"),
        "classification": ("text", "label"),
        "paraphrase": ("anchor", "positive"),
    }
)
CLASSIFICATION_SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Subset:
    """One subset of a dataset: its languages and where it lives.

    ``configs`` are the Hub config names to try, in order (the first that exists is read;
    ``None`` is the repository's default config). ``hub_id`` overrides the dataset's repository
    (SICK: one repository per language); ``on_hub=False`` marks a subset that has no loadable
    Hub copy. ``local`` are extra local patterns for this subset (searched before the
    dataset's), ``columns`` replaces the dataset's column mappings for it.
    """

    name: str
    lang1: str
    lang2: str | None = None
    configs: tuple[str | None, ...] = (None,)
    hub_id: str | None = None
    on_hub: bool = True
    local: tuple[str, ...] = ()
    columns: tuple[Mapping[str, str], ...] | None = None

    @property
    def languages(self) -> tuple[str, ...]:
        return (self.lang1,) if self.lang2 in (None, self.lang1) else (self.lang1, self.lang2)


@dataclass(frozen=True)
class EvalDataset:
    """An evaluation dataset: where it lives, which subsets it has and how to read them.

    ``columns`` are alternative mappings from the normalised names to the source's columns; the
    first whose source columns are all present is used (e.g. the Hub parquet layout, then the
    original release). Besides the names of :data:`KIND_COLUMNS`, a mapping may name
    ``pair_text`` (one column holding both sentences separated by a line break: SemRel's CSV
    release). ``pair_id``/``id`` mapped to nothing means "the row number in the source".
    """

    name: str
    kind: Kind
    task: Task
    hub_id: str | None  # None: no loadable (non-script) Hub copy; local files only
    description: str
    multi_parallel: bool = False
    revision: str | None = None  # default Hub revision (None: the repository's main branch)
    split: str | None = "test"  # Hub split; None: every split (classification)
    subset_table: Mapping[str, Subset] = field(default_factory=dict)
    columns: tuple[Mapping[str, str], ...] = ()
    local_files: tuple[str, ...] = ()  # patterns with {config}, {subset}, {split}
    csv_names: tuple[str, ...] | None = None  # CSV files without a header row
    row_filter: tuple[str, str] | None = None  # (column, value): keep matching rows if present
    score_range: tuple[float, float] | None = None
    withheld: Mapping[str, str] = field(default_factory=dict)  # subset -> why it is unusable
    lang_column: str | None = None  # a column naming the config, for repos with one default config
    check_script_order: bool = False  # swap sentence1/2 when their scripts say so
    transliterate: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # lang -> (from, to)
    source: Literal["hub", "builtin"] = "hub"
    evidence: str = ""

    @property
    def languages(self) -> tuple[str, ...]:
        """Every language the dataset has data for (withheld subsets left out)."""
        seen: dict[str, None] = {}
        for sub in _table(self).values():
            if sub.name not in self.withheld:
                seen.update(dict.fromkeys(sub.languages))
        return tuple(seen)


# --- the datasets --------------------------------------------------------------------------


def _code(iso639_3: str) -> str:
    """The registry code of a dataset's ISO 639-3 language code."""
    return registry.resolve(iso639_3).code


def _pairs_table(configs: Sequence[str], **kwargs) -> dict[str, Subset]:
    """Subsets of a dataset whose configs are ``l1-l2`` in registry codes (STS17)."""
    table = {}
    for config in configs:
        l1, l2 = config.split("-")
        name = l1 if l1 == l2 else config
        table[name] = Subset(name, l1, l2, configs=(config,), **kwargs)
    return table


def _mono_table(configs: Mapping[str, str], **kwargs) -> dict[str, Subset]:
    """Monolingual subsets from ``{config: registry code}``."""
    return {code: Subset(code, code, configs=(config,), **kwargs) for config, code in configs.items()}


def _hub_layout(*patterns: str) -> tuple[str, ...]:
    """The file names ``push_to_hub`` writes, then the given ones."""
    return ("{config}/{split}-*.parquet", "data/{split}-*.parquet", *patterns)


STS17_CONFIGS = ("ar-ar", "en-ar", "en-de", "en-en", "en-tr", "es-en", "es-es", "fr-en", "it-en",
                 "ko-ko", "nl-en")

STS17 = EvalDataset(
    name="sts17",
    kind="pairs",
    task="sts",
    hub_id="mteb/sts17-crosslingual-sts",
    description="SemEval-2017 Task 1 STS: monolingual (ar, en, es, ko) and cross-lingual "
                "(en-ar, en-de, en-tr, es-en, fr-en, it-en, nl-en) test pairs, scores 0-5.",
    subset_table=_pairs_table(STS17_CONFIGS),
    columns=({"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"},),
    local_files=("test/{config}.jsonl.gz", "test/{config}.jsonl", "{config}/test.jsonl.gz",
                 "{config}/test.jsonl", *_hub_layout(), "{config}.jsonl.gz", "{config}.jsonl",
                 "{config}.parquet"),
    score_range=(0.0, 5.0),
    lang_column="lang",
    check_script_order=True,
    evidence=(
        "MTEB task STS17 (mteb/tasks/STS/multilingual/STS17CrosslingualSTS.py): path "
        "mteb/sts17-crosslingual-sts, the 11 configs above, eval split test, sentence1 in the "
        "first language of the config name. Repository at faeb762 ('fast loading'): "
        "test/<config>.jsonl.gz with sentence1, sentence2, score, lang; earlier revisions "
        "<config>/test.jsonl.gz read by a loading script. The paper's code loads "
        "load_dataset('mteb/sts17-crosslingual-sts', <config>)['test']. Not verified: the card's "
        "configs list at the current main (a config missing there is read from the default "
        "config by its 'lang' column), and the sentence order of en-ar (checked by script at "
        "load time)."
    ),
)

STSB_MULTI_MT_LANGUAGES = ("de", "en", "es", "fr", "it", "nl", "pl", "pt", "ru", "zh")

STSB_MULTI_MT = EvalDataset(
    name="stsb_multi_mt",
    kind="pairs",
    task="sts",
    hub_id="PhilipMay/stsb_multi_mt",
    description="STS Benchmark test set (1,379 pairs) machine-translated with DeepL into 9 "
                "languages, plus the English original; scores 0-5; row i is the same pair in "
                "every language.",
    multi_parallel=True,
    subset_table=_mono_table({code: code for code in STSB_MULTI_MT_LANGUAGES}),
    columns=({"sentence1": "sentence1", "sentence2": "sentence2", "score": "similarity_score"},),
    local_files=(*_hub_layout(), "data/stsb-{config}-{split}.csv", "stsb-{config}-{split}.csv"),
    csv_names=("sentence1", "sentence2", "similarity_score"),
    score_range=(0.0, 5.0),
    evidence=(
        "Card of PhilipMay/stsb_multi_mt: configs de en es fr it nl pl pt ru zh, splits train/"
        "test/dev (5749/1379/1500 in every config), features sentence1, sentence2, "
        "similarity_score (float32); converted to parquet (commit 'Convert dataset to Parquet "
        "(#4)': <lang>/test-00000-of-00001.parquet). Alignment: the GitHub release's convert.py "
        "(PhilipMay/stsb-multi-mt) builds every language's rows from one shared score file in "
        "one order, so row i is the same pair everywhere; its data/stsb-<lang>-test.csv files "
        "have no header (sentence1, sentence2, similarity_score)."
    ),
)

KARDES_FOLDERS = {"az": "azeri", "kk": "kazakh", "ky": "kyrgyz", "ug": "uyghur", "uz": "uzbek"}
_KARDES_TRANSLATION = ({"pair_id": "Unnamed: 0", "sentence1": "s1_translation",
                        "sentence2": "s2_translation", "score": "score"},)
_KARDES_ENGLISH = ({"pair_id": "Unnamed: 0", "sentence1": "sentence1", "sentence2": "sentence2",
                    "score": "score"},)


def _kardes_table() -> dict[str, Subset]:
    def files(code: str) -> tuple[str, ...]:
        folder = KARDES_FOLDERS[code]
        return (f"Data/{folder}/sts.test.{code}.csv", f"{folder}/sts.test.{code}.csv",
                f"sts.test.{code}.csv")

    table = {code: Subset(code, code, configs=(), on_hub=False, local=files(code),
                          columns=_KARDES_TRANSLATION) for code in KARDES_FOLDERS}
    # English: the STS-B originals that every language's file carries (the paper reads them
    # from the Azerbaijani file).
    table["en"] = Subset("en", "en", configs=(), on_hub=False, local=files("az"),
                         columns=_KARDES_ENGLISH)
    return dict(sorted(table.items()))


KARDES_STS = EvalDataset(
    name="kardes_sts",
    kind="pairs",
    task="sts",
    hub_id=None,
    description="Kardeş-NLU STS: STS-B test pairs translated by humans into Azerbaijani, "
                "Kazakh, Kyrgyz, Uyghur and Uzbek (with the English originals); scores 0-5; "
                "aligned by the STS-B row number in the files' first column.",
    multi_parallel=True,
    subset_table=_kardes_table(),
    score_range=(0.0, 5.0),
    transliterate={"ug": ("UCS", "UAS")},
    evidence=(
        "Not on the Hub in a loadable form: the only Hub loader found is a loading script that "
        "reads raw.githubusercontent.com/lksenel/Kardes-NLU/main/Data/{lang}/{task}.{split}."
        "{code}.csv (and maps NLI columns only). Local files as in the GitHub repository "
        "lksenel/Kardes-NLU: Data/<azeri|kazakh|kyrgyz|uyghur|uzbek>/sts.test.<az|kk|ky|ug|uz>"
        ".csv with columns '' (the STS-B row number), sentence1, sentence2, score, "
        "s1_translation, s2_translation; the same row numbers and English sentences in every "
        "file. The Uyghur file is in Cyrillic script; the registry's ug (FLORES uig_Arab) is "
        "Arabic script, so it is transliterated with the umsc package (UCS -> UAS), as the "
        "paper's code (eval_data_utils.load_kardes_data) does."
    ),
)

KORSTS = EvalDataset(
    name="korsts",
    kind="pairs",
    task="sts",
    hub_id=None,
    description="KorSTS: the STS-B test set translated into Korean by professional translators "
                "(1,379 pairs), scores 0-5.",
    subset_table={"ko": Subset("ko", "ko", configs=(), on_hub=False,
                               local=("KorSTS/sts-test.tsv", "sts-test.tsv"))},
    columns=({"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"},),
    score_range=(0.0, 5.0),
    evidence=(
        "The Hub's kakaobrain/kor_nlu ('sts' config: genre, filename, year, id, score, "
        "sentence1, sentence2) is a loading script, which datasets >= 4 does not run; the "
        "parquet copies found (dkoterwa/kor-sts, supark/ko-stsb) are third-party re-uploads "
        "with unverified edits (ko-stsb's test has 1,378 rows). Local files: KorSTS/sts-test.tsv "
        "of github.com/kakaobrain/kor-nlu-datasets (header genre, filename, year, id, score, "
        "sentence1, sentence2; tab-separated, unquoted)."
    ),
)

def _kardes_korsts_table() -> dict[str, Subset]:
    """Kardeş-NLU's subsets and KorSTS's Korean, each also found one folder down (a folder
    holding clones of both repositories)."""
    table = {code: dataclasses.replace(sub, local=sub.local + tuple(f"*/{pattern}" for pattern in sub.local[:1]))
             for code, sub in _kardes_table().items()}
    # no pair_id column: the row number, which is the STS-B test row number (see the evidence)
    table["ko"] = Subset("ko", "ko", configs=(), on_hub=False,
                         local=("KorSTS/sts-test.tsv", "*/KorSTS/sts-test.tsv"),
                         columns=({"sentence1": "sentence1", "sentence2": "sentence2", "score": "score"},))
    return dict(sorted(table.items()))


STSB_KARDES_KORSTS = EvalDataset(
    name="stsb_kardes_korsts",
    kind="pairs",
    task="sts",
    hub_id=None,
    description="The STS-B test set in the human translations paper 000 joins: Kardeş-NLU's "
                "Azerbaijani, Kazakh, Kyrgyz, Uyghur and Uzbek (800 pairs, with the English "
                "originals) and KorSTS's Korean (all 1,379), aligned by STS-B row, so that "
                "cross-lingual pairs such as ko-uz are scored on the 800 pairs all share.",
    multi_parallel=True,
    subset_table=_kardes_korsts_table(),
    score_range=(0.0, 5.0),
    transliterate={"ug": ("UCS", "UAS")},
    evidence=(
        "Paper 000: 'the STS datasets for Turkic languages in Kardeş-NLU and the Korean STS "
        "dataset ... all translated from the English STS-Benchmark ... effectively "
        "multi-parallel STS data for cross-lingual evaluation ... e.g. Korean-Uzbek'. Files as "
        "kardes_sts's and korsts's, from clones of lksenel/Kardes-NLU and "
        "kakaobrain/kor-nlu-datasets (in one folder, or KorSTS/ inside the Kardeş-NLU clone). "
        "Alignment: Kardeş-NLU's first column is the STS-B test row number (5 ... 1375; 800 "
        "rows); KorSTS's sts-test.tsv holds the 1,379 STS-B test rows in STS-B's order, so its "
        "0-based row number is that row number: in the repositories' files all 800 Kardeş-NLU "
        "rows, in each of the five languages, have KorSTS's score at that row (checked with this loader)."
    ),
)

_SICK_COLUMNS = ({"pair_id": "pair_ID", "sentence1": "sentence_A", "sentence2": "sentence_B",
                  "score": "relatedness_score"},)
# Per language, so that a folder of one release is never read as another language's.
_SICK_ORIGINAL = ("SICK.txt", "SICK_test_annotated.txt")

SICK = EvalDataset(
    name="sick",
    kind="pairs",
    task="sts",
    hub_id=None,
    description="SICK relatedness (SemEval-2014 test set, 4,906 pairs, scores 1-5) in English "
                "and its translations: Dutch (SICK-NL), Polish (SICK-PL), Spanish; aligned by "
                "the original SICK pair_ID.",
    multi_parallel=True,
    subset_table={
        "en": Subset("en", "en", configs=(), on_hub=False, local=_SICK_ORIGINAL),
        "es": Subset("es", "es", configs=(), on_hub=False,
                     local=(*_SICK_ORIGINAL, "test.jsonl", "data/test-*.parquet")),
        "nl": Subset("nl", "nl", hub_id="maximedb/sick_nl", local=("data/test-*.parquet",)),
        "pl": Subset("pl", "pl", hub_id="sdadas/sick_pl", local=("test.jsonl",)),
    },
    columns=_SICK_COLUMNS,
    row_filter=("SemEval_set", "TEST"),
    score_range=(1.0, 5.0),
    evidence=(
        "nl: maximedb/sick_nl (card: features pair_ID int64, sentence_A, sentence_B, "
        "entailment_label, relatedness_score float64, ...; splits train/validation/test "
        "4439/495/4906, files pushed with push_to_hub: data/test-*.parquet, default config). "
        "pl: sdadas/sick_pl (card: pair_ID string, sentence_A, sentence_B, relatedness_score "
        "float32, entailment_judgment; files test.jsonl, train.jsonl, validation.jsonl, split "
        "inferred from the file names; 4439/495/4906). en: the Hub's 'sick' (RobZamp/sick) is a "
        "loading script, and mteb/sickr-sts has no pair ids, so English is read from the "
        "original release: SICK.txt of SICK.zip (Zenodo 2787612; tab-separated pair_ID, "
        "sentence_A, sentence_B, entailment_label, relatedness_score, ..., SemEval_set; the "
        "rows with SemEval_set TEST are kept) or SemEval-2014's SICK_test_annotated.txt. es: no "
        "Hub copy could be verified; local files in one of the layouts above. Alignment across "
        "languages rests on the translations keeping the original pair_ID (the test sizes "
        "match: 4,906)."
    ),
)

# SemEval-2024 Task 1 Track A (supervised) languages, as SemRel2024 names its configs.
STR2024_CONFIGS = ("amh", "arq", "ary", "eng", "esp", "hau", "kin", "mar", "tel")
STR2024_LANGUAGE_CODES = {"esp": "spa"}  # 'esp' is the task's own name for Spanish, not ISO


def _str2024_table() -> dict[str, Subset]:
    table = {}
    for config in STR2024_CONFIGS:
        try:
            code = _code(STR2024_LANGUAGE_CODES.get(config, config))
        except registry.UnknownLanguageError:
            continue  # e.g. arq (Algerian Arabic): not a FLORES-200 language, so unavailable
        table[code] = Subset(code, code, configs=(config,),
                             local=(f"Track A/{config}/{config}_test_with_labels.csv",
                                    f"{config}/{config}_test_with_labels.csv",
                                    f"{config}_test_with_labels.csv"))
    return dict(sorted(table.items()))


STR2024 = EvalDataset(
    name="str2024",
    kind="pairs",
    task="str",
    hub_id="SemRel/SemRel2024",
    description="SemEval-2024 Task 1 (SemRel2024) Track A semantic textual relatedness test "
                "sets, scores 0-1. Algerian Arabic (arq) is not a registered language; the "
                "Spanish test labels are withheld by the organisers.",
    subset_table=_str2024_table(),
    columns=({"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"},
             {"pair_id": "PairID", "pair_text": "Text", "score": "Score"}),
    local_files=_hub_layout(),
    score_range=(0.0, 1.0),
    withheld={"es": "the Hub's Spanish test labels are all -1 (the organisers kept the gold "
                    "labels; the card refers to the CodaLab competition)"},
    evidence=(
        "Card of SemRel/SemRel2024: configs afr amh arb arq ary eng esp hau hin ind kin mar pan "
        "tel, features sentence1, sentence2 (string), label (float64), splits train (Track A "
        "languages) / dev / test at <config>/<split>-*; 'Spanish test labels are all -1'. The "
        "MTEB task SemRel24STS renames label to score (0-1). Track A languages: amh arq ary eng "
        "esp hau kin mar tel. Local: the Hub layout, or the task repository's "
        "'Track A/<lang>/<lang>_test_with_labels.csv' (PairID, Text = the two sentences "
        "separated by a line break, Score), which the paper's code reads."
    ),
)


def _registry_table(candidates) -> dict[str, Subset]:
    """One subset per registered language, with the Hub configs ``candidates(lang)``."""
    return {code: Subset(code, code, configs=candidates(registry.get(code)))
            for code in registry.codes()}


# FLORES+ renamed the Chinese configs (cmn_Hans, cmn_Hant) relative to FLORES-200 (zho_Hans,
# zho_Hant); both are tried, the FLORES-200 name first.
FLORES_PLUS_RENAMES = {"zho_Hans": ("cmn_Hans",), "zho_Hant": ("cmn_Hant",)}

FLORES = EvalDataset(
    name="flores",
    kind="parallel",
    task="bitext",
    hub_id="openlanguagedata/flores_plus",
    description="FLORES-200 devtest (FLORES+): 1,012 sentences translated from English into "
                "about 200 languages, aligned by id.",
    multi_parallel=True,
    split="devtest",
    subset_table=_registry_table(
        lambda lang: (lang.flores, *FLORES_PLUS_RENAMES.get(lang.flores, ()))),
    columns=({"id": "id", "text": "text"},),
    local_files=("{split}/{config}.parquet", "{split}/{config}.jsonl", "{config}/{split}.parquet",
                 *_hub_layout(), "{split}/{config}.{split}", "{config}.{split}"),
    evidence=(
        "Card of openlanguagedata/flores_plus: gated (accept the conditions on the Hub and log "
        "in, e.g. HF_TOKEN); per-language configs named like eng_Latn plus 'default'; splits "
        "dev (997) and devtest (1012); columns include id, iso_639_3, iso_15924, glottocode, "
        "text. Not verified: the file names inside the repository (devtest/<config>.parquet or "
        ".jsonl are both accepted locally) and whether every FLORES-200 code is a config "
        "(FLORES+ renamed some; zho_* are also tried as cmn_*). Local files may also be the "
        "original FLORES-200 release (devtest/<code>.devtest, one sentence a line; id = line "
        "number): do not mix the two releases, their ids differ."
    ),
)

SIB200 = EvalDataset(
    name="sib200",
    kind="classification",
    task="classification",
    hub_id="Davlan/sib200",
    description="SIB-200 topic classification (7 topics) over FLORES-200 sentences in 205 "
                "languages, splits train/dev/test (701/99/204).",
    multi_parallel=True,
    split=None,
    subset_table=_registry_table(lambda lang: (lang.flores,)),
    columns=({"id": "index_id", "text": "text", "label": "category"},),
    local_files=("{config}/{split}-*.parquet", "data/{config}/{split}.tsv", "{config}/{split}.tsv",
                 "sib200/{split}/{config}.parquet", "{config}/{split}.jsonl"),
    evidence=(
        "Davlan/sib200: configs named by FLORES-200 code (eng_Latn, ...), splits train / "
        "validation / test, columns index_id, category, text (the MTEB task SIB200Classification "
        "reads it with load_dataset('Davlan/sib200', <code>) at revision 38977a6 and renames "
        "category to label). Its main branch serves parquet configs since commit 2c66472 ('Add "
        "all configs'), no loading script; mteb/sib200 is a parquet mirror with the same configs "
        "and columns (<split>/<config>.parquet; its 'dev' split was renamed 'validation' in "
        "a74d735) that 'hf:mteb/sib200' selects. The Hub's split 'validation' (or 'dev') becomes "
        "'dev', and local files are looked for under either name."
    ),
)

# The 112 configs of the MTEB Tatoeba task, X-eng with X an ISO 639-3 code.
TATOEBA_CONFIGS = tuple(
    f"{code}-eng" for code in (
        "sqi fry kur tur deu nld ron ang ido jav isl slv cym kaz est heb gla mar lat bel pms gle "
        "pes nob bul cbk hun uig rus spa hye tel afr mon arz hrv nov gsw nds ukr uzb lit ina lfn "
        "zsm ita cmn lvs glg ceb bre ben swg arq kab fra por tat oci pol war aze vie nno cha mhr "
        "dan ell amh pam hsb srp epo kzj awa fao mal ile bos cor cat eus yue swe dtp kat jpn csb "
        "xho orv ind tuk max swh hin dsb ber tam slk tgl ast mkd khm ces tzl urd ara kor yid fin "
        "tha wuu"
    ).split()
)
# Tatoeba's Mandarin (MTEB: cmn-Hans) is the registry's zh; ISO 639-3 'cmn' is not an alias of
# any registered code because FLORES files Chinese under the macrolanguage 'zho'.
TATOEBA_LANGUAGE_CODES = {"cmn": "zh"}


def _tatoeba_table() -> dict[str, Subset]:
    table = {}
    for config in TATOEBA_CONFIGS:
        iso = config.split("-")[0]
        try:
            code = TATOEBA_LANGUAGE_CODES.get(iso) or _code(iso)
        except registry.UnknownLanguageError:
            continue  # Tatoeba has languages FLORES-200 lacks (ang, lat, ido, ...)
        assert code not in table, f"two Tatoeba configs map to {code}"
        table[code] = Subset(code, code, "en", configs=(config,))
    return dict(sorted(table.items()))


TATOEBA = EvalDataset(
    name="tatoeba",
    kind="bitext_pairs",
    task="bitext",
    hub_id="mteb/tatoeba-bitext-mining",
    description="Tatoeba bitext mining (LASER test sets): up to 1,000 English-aligned "
                "sentence pairs per language.",
    subset_table=_tatoeba_table(),
    columns=({"sentence1": "sentence1", "sentence2": "sentence2"},),
    local_files=("test/{config}.jsonl.gz", "test/{config}.jsonl", "{config}/test.jsonl.gz",
                 "{config}/test.jsonl", *_hub_layout(), "{config}.jsonl.gz", "{config}.jsonl",
                 "{config}.parquet"),
    lang_column="lang",
    evidence=(
        "MTEB task Tatoeba (mteb/tasks/BitextMining/multilingual/TatoebaBitextMining.py): path "
        "mteb/tatoeba-bitext-mining, 112 configs '<iso639-3>-eng', eval split test, sentence1 "
        "in the language X and sentence2 in English; the dataset viewer lists a 'default' "
        "config and one per language. Languages outside the registry (ang, lat, ido, ...) are "
        "unavailable; cmn is the registry's zh."
    ),
)

BUILTIN_PARALLEL = EvalDataset(
    name="builtin_parallel",
    kind="parallel",
    task="bitext",
    hub_id=None,
    description="The offline demo's held-out aligned sentences (UI messages and names from "
                "translation catalogs): resources/eval/parallel/{lang}.parquet.",
    multi_parallel=True,
    source="builtin",
    evidence="modsent.sources.builtin.builtin_parallel_eval via prepare_builtin_eval.",
)

BUILTIN_TOPICS = EvalDataset(
    name="builtin_topics",
    kind="classification",
    task="classification",
    hub_id=None,
    description="The offline demo's held-out labelled names and messages (country, language, "
                "currency, timezone, interface), splits train/test.",
    multi_parallel=True,
    split=None,
    source="builtin",
    evidence="modsent.sources.builtin.builtin_classification via prepare_builtin_eval.",
)

BUILTIN_PARAPHRASE = EvalDataset(
    name="builtin_paraphrase",
    kind="paraphrase",
    task="paraphrase",
    hub_id=None,
    description="The offline demo's held-out monolingual paraphrase pairs of each language: two "
                "names of one country, language, currency or script, or two projects' "
                "translations of one message (paraphrase mining inside the language).",
    source="builtin",
    evidence="modsent.sources.builtin.builtin_paraphrase_eval via prepare_builtin_eval.",
)

DATASETS: Mapping[str, EvalDataset] = MappingProxyType(
    {d.name: d for d in (STS17, STSB_MULTI_MT, KARDES_STS, KORSTS, STSB_KARDES_KORSTS, SICK, STR2024, SIB200, FLORES,
                         TATOEBA, BUILTIN_PARALLEL, BUILTIN_TOPICS, BUILTIN_PARAPHRASE)}
)

_BUILTIN_TASKS = {"builtin_parallel": "parallel", "builtin_topics": "classification",
                  "builtin_paraphrase": "paraphrase"}


def get(name: str) -> EvalDataset:
    """The dataset called ``name``; :class:`InputError` listing the known ones otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise InputError(
            f"unknown evaluation dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}"
        ) from None


def _table(dataset: EvalDataset) -> Mapping[str, Subset]:
    if dataset.source == "builtin":
        from modsent.sources.builtin import available_languages

        return {code: Subset(code, code, configs=(), on_hub=False) for code in available_languages()}
    return dataset.subset_table


def _subset(dataset: EvalDataset, name: str) -> Subset:
    table = _table(dataset)
    if name not in table:
        known = ", ".join(table)
        raise InputError(f"evaluation dataset {dataset.name!r} has no subset {name!r}; "
                         f"its subsets: {known}")
    return table[name]


# --- subsets for a configuration -------------------------------------------------------------


def subsets(name: str, languages: list[str], source: str | Mapping | None = None) -> tuple[list[str], list[str]]:
    """The subsets of dataset ``name`` available for the configured languages, and the
    configured languages the dataset has no data for (for the report; not an error).

    A subset is available when all its languages are configured (both, for a cross-lingual
    ``l1-l2`` subset or a Tatoeba X-English one). For multi-parallel ``pairs`` datasets the
    subsets are monolingual; cross-lingual combinations are built at scoring time from
    ``pair_id``. Withheld subsets (no gold labels) are never available, and with a Hub
    ``source`` (the default) neither are subsets that have no loadable Hub copy (SICK en/es):
    their languages count as missing unless the source is local files.
    """
    dataset = get(name)
    configured = list(dict.fromkeys(languages))
    for code in configured:
        if not registry.is_registered(code):
            raise InputError(f"{name}: {registry.unknown_message(code)}")
    table = list(_table(dataset).values())
    if (source is not None or _has_hub(dataset)) and check_source(name, source) == ("hf", None, None):
        table = [sub for sub in table if sub.on_hub]  # the Hub copy only
    chosen = set(configured)
    available = [sub.name for sub in table if sub.name not in dataset.withheld and set(sub.languages) <= chosen]
    have = {lang for sub in table if sub.name not in dataset.withheld for lang in sub.languages}
    return available, [code for code in configured if code not in have]


# --- sources ---------------------------------------------------------------------------------


class ResolvedSource(NamedTuple):
    kind: Literal["hf", "local", "builtin"]
    location: str | None  # Hub repository override or local path
    revision: str | None = None

    def describe(self, dataset: EvalDataset) -> str:
        if self.kind == "local":
            return f"local:{self.location}"
        if self.kind == "hf":
            return f"hf:{self.location or dataset.hub_id}"
        return "builtin"


def check_source(name: str, source: str | Mapping | None) -> ResolvedSource:
    """Validate a config entry before any expensive work and return it resolved.

    Raises :class:`InputError` for an unknown dataset (listing the known ones), a source kind
    the dataset cannot use (``builtin`` for a Hub dataset, the Hub for a dataset without a
    loadable Hub copy or for a built-in one) and a local path that does not exist.
    """
    dataset = get(name)
    key = f"evaluation dataset {name!r}"
    if source is None or source == "hf":
        resolved = ResolvedSource("builtin" if dataset.source == "builtin" else "hf", None)
    else:
        from modsent.sources.prepare import parse_source

        parsed = parse_source(source, key=f"{key} source")
        if parsed.kind == "builtin":
            if parsed.name is not None:
                raise InputError(f"{key}: write 'builtin', not {parsed.describe()!r}")
            resolved = ResolvedSource("builtin", None)
        elif parsed.kind == "local":
            resolved = ResolvedSource("local", parsed.path)
        else:
            repo = parsed.name if parsed.name is not None else str(parsed.options["hf"])
            resolved = ResolvedSource("hf", repo, parsed.options.get("revision"))
    if dataset.source == "builtin" and resolved.kind != "builtin":
        raise InputError(f"{key} is the built-in demo data: its source is 'builtin', "
                         f"not {resolved.describe(dataset)!r}")
    if dataset.source != "builtin" and resolved.kind == "builtin":
        raise InputError(f"{key} has no built-in data; use the Hub (no source) or 'local:PATH'")
    if resolved.kind == "hf" and resolved.location is None and not _has_hub(dataset):
        raise InputError(f"{key} has no loadable Hub copy (see DATASETS[{name!r}].evidence); "
                         "give its files with source 'local:PATH'")
    if resolved.kind == "local":
        _check_local_path(resolved.location, key)
    return resolved


def _has_hub(dataset: EvalDataset) -> bool:
    return any(sub.on_hub and (sub.hub_id or dataset.hub_id) for sub in dataset.subset_table.values())


def _check_local_path(path: str, key: str) -> None:
    """The path must exist; with a placeholder, the folder before the placeholder must."""
    if "{" not in path:
        if not Path(path).exists():
            raise InputError(f"{key}: local path {path!r} does not exist")
        return
    fixed = path.split("{", 1)[0]
    folder = Path(fixed) if fixed.endswith(("/", os.sep)) or not fixed else Path(fixed).parent
    if not folder.is_dir():
        raise InputError(f"{key}: local path {path!r}: folder {str(folder)!r} does not exist")


# --- preparing a subset ----------------------------------------------------------------------


def prepare_subset(name: str, subset: str, out_path: str | os.PathLike,
                   source: str | Mapping | None = None, revision: str | None = None) -> int:
    """Load one subset, normalise it into its kind's schema, validate it and write it
    atomically to ``out_path`` (parquet). Returns the number of rows.

    ``source``: see the module docstring (``None`` = the dataset's Hub repository);
    ``revision`` pins the Hub commit (default: the dataset's own, normally the main branch).
    Raises :class:`InputError` naming the file (or Hub repository/config) and the column for
    missing columns, empty data, empty or missing text and non-numeric or out-of-range scores.
    """
    dataset = get(name)
    resolved = check_source(name, source)
    sub = _subset(dataset, subset)
    if resolved.kind == "builtin":
        return _prepare_builtin(dataset, sub, out_path)
    if resolved.kind == "hf":
        frame = _normalise_hub(dataset, sub, resolved.location,
                               revision or resolved.revision or dataset.revision)
    else:
        frame = _normalise_local(dataset, sub, resolved.location)
    write_parquet(frame, out_path)
    log.info("%s/%s from %s: %d rows", name, subset, resolved.describe(dataset), len(frame))
    return len(frame)


def _prepare_builtin(dataset: EvalDataset, sub: Subset, out_path) -> int:
    from modsent.sources.prepare import prepare_builtin_eval

    prepare_builtin_eval(_BUILTIN_TASKS[dataset.name], sub.name, out_path)
    try:
        return len(read_subset(out_path))
    except InputError:
        Path(out_path).unlink(missing_ok=True)
        raise


# --- reading local files ---------------------------------------------------------------------


def _local_candidates(dataset: EvalDataset, sub: Subset, split: str | None) -> list[str]:
    patterns = []
    for pattern in (*sub.local, *dataset.local_files):
        for config in [c for c in sub.configs if c is not None] or [sub.name]:
            filled = pattern.format(config=config, subset=sub.name, split=split or "test")
            if filled not in patterns:
                patterns.append(filled)
    return patterns


def _find_local(dataset: EvalDataset, sub: Subset, location: str,
                split: str | None = None) -> list[Path]:
    """The local files of one subset (several parquet shards are read together)."""
    path = location.replace("{subset}", sub.name)
    if "{lang}" in path:
        if sub.lang2 not in (None, sub.lang1):
            raise InputError(f"{dataset.name}/{sub.name}: '{{lang}}' in {location!r} is ambiguous "
                             "for a cross-lingual subset; write '{subset}'")
        path = path.replace("{lang}", sub.lang1)
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise InputError(f"{dataset.name}/{sub.name}: {root} is neither a file nor a directory")
    tried = _local_candidates(dataset, sub, split)
    for base in (root / sub.name, root):
        for pattern in tried:
            found = sorted(Path(p) for p in glob.glob(str(base / pattern)) if Path(p).is_file())
            if found:
                return found
    raise InputError(
        f"{dataset.name}/{sub.name}: no data file in {root / sub.name} nor in {root}; looked "
        f"for {', '.join(tried)}")


def _read_table(path: Path, csv_names: tuple[str, ...] | None = None) -> pd.DataFrame:
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            frame = pd.read_parquet(path)
        elif re.search(r"\.jsonl?(\.gz)?$", name):
            frame = pd.read_json(path, lines=True, dtype=False, compression="infer")
        elif name.endswith(".csv"):
            frame = pd.read_csv(path, dtype=str, keep_default_na=False,
                                header=None if csv_names else 0, names=csv_names)
        elif name.endswith((".tsv", ".txt")):
            with warnings.catch_warnings(record=True) as caught:  # rows longer than the header
                warnings.simplefilter("always", pd.errors.ParserWarning)
                frame = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str,
                                    keep_default_na=False, index_col=False)
            if caught:
                _check_extra_fields(path)
        elif name.endswith((".devtest", ".dev")):
            lines = path.read_text(encoding="utf-8").splitlines()
            frame = pd.DataFrame({"id": [str(i) for i in range(1, len(lines) + 1)], "text": lines})
        else:
            raise InputError(f"{path}: unknown file format; expected .parquet, .jsonl(.gz), .csv, "
                             ".tsv, .txt or .devtest")
    except InputError:
        raise
    except UnicodeDecodeError as err:
        if path.suffix not in (".gz", ".parquet"):
            for _ in iter_utf8_lines(path):  # raises naming the line and the byte in it
                pass
        raise InputError(f"{path}: invalid UTF-8 at byte {err.start}; the file must be UTF-8") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the file is empty") from None
    except Exception as err:  # pyarrow, json and csv parsers raise many kinds
        raise InputError(f"{path}: not a readable {path.suffix or 'data'} file "
                         f"({type(err).__name__}: {err})") from None
    if frame.empty:
        raise InputError(f"{path}: the file holds no rows")
    return frame


def _check_extra_fields(path: Path) -> None:
    """A tab-separated row with more fields than the header is an InputError naming its line,
    unless the extra fields are empty (a trailing tab, which pandas would otherwise read as a
    shifted row with the first column as its index)."""
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().rstrip("\r\n").split("\t")
        for number, line in enumerate(handle, start=2):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) > len(header) and any(field.strip() for field in fields[len(header):]):
                raise InputError(f"{path}: line {number}: {len(fields)} tab-separated fields, but the header "
                                 f"has {len(header)} ({', '.join(header)})")


def _read_files(paths: list[Path], csv_names) -> pd.DataFrame:
    frames = [_read_table(p, csv_names) for p in paths]
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _where(paths: list[Path]) -> str:
    return str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more shards)"


def _normalise_local(dataset: EvalDataset, sub: Subset, location: str) -> pd.DataFrame:
    if dataset.kind == "classification":
        if Path(location.replace("{subset}", sub.name).replace("{lang}", sub.lang1)).is_file():
            raise InputError(f"{dataset.name}/{sub.name}: {location!r} is a file; a "
                             "classification dataset needs the folder holding its splits")
        parts, where = [], None
        for split, names in (("train", ("train",)), ("dev", ("validation", "dev")),
                             ("test", ("test",))):
            for source_split in names:
                try:
                    paths = _find_local(dataset, sub, location, source_split)
                except InputError:
                    if split == "test" and source_split == names[-1]:
                        raise
                    continue
                raw = _read_files(paths, dataset.csv_names)
                where = where or _where(paths)
                parts.append(_columns(dataset, sub, raw, _where(paths)).assign(split=split))
                break
        frame = pd.concat(parts, ignore_index=True)
        frame.attrs["sources"] = parts[0].attrs.get("sources", {})
        return _finish(dataset, sub, frame, where)
    paths = _find_local(dataset, sub, location, dataset.split)
    raw = _read_files(paths, dataset.csv_names)
    return _finish(dataset, sub, _columns(dataset, sub, raw, _where(paths)), _where(paths))


# --- reading the Hub -------------------------------------------------------------------------


def _hub_frame(data) -> pd.DataFrame:
    """A ``datasets.Dataset`` as a DataFrame, class labels as their names."""
    import datasets

    frame = data.to_pandas()
    for column, feature in (data.features or {}).items():
        if isinstance(feature, datasets.ClassLabel):
            frame[column] = [feature.int2str(int(v)) if v is not None and v >= 0 else None
                             for v in frame[column]]
    return frame


def _load(repo: str, config: str | None, split: str | None, revision: str | None):
    import datasets

    return datasets.load_dataset(repo, config, split=split, revision=revision)


def _hub_load(dataset: EvalDataset, sub: Subset, repo: str, revision: str | None):
    """``(data, where)`` for the first of the subset's configs the repository has."""
    from datasets.exceptions import DatasetNotFoundError

    missing = []
    for config in sub.configs:
        where = f"hf:{repo} (config {config or 'default'}, split {dataset.split or 'all'})"
        try:
            return _load(repo, config, dataset.split, revision), where
        except DatasetNotFoundError as err:
            raise InputError(
                f"{where}: {err} (a gated dataset needs its conditions accepted on the Hub and a "
                "token: HF_TOKEN or `hf auth login`; offline, use 'local:PATH')") from None
        except ValueError as err:
            if "BuilderConfig" not in str(err):
                raise InputError(f"{where}: {err}") from None  # e.g. an unknown split
            missing.append(config)
    if dataset.lang_column and missing:
        # Repositories laid out for MTEB's fast loading have one default config whose rows
        # name their subset in a column.
        where = (f"hf:{repo} (default config, split {dataset.split}, rows with "
                 f"{dataset.lang_column} == {missing[0]!r})")
        try:
            data = _load(repo, None, dataset.split, revision)
        except DatasetNotFoundError as err:
            raise InputError(f"{where}: {err}") from None
        if dataset.lang_column in data.column_names:
            frame = _hub_frame(data)
            frame = frame[frame[dataset.lang_column] == missing[0]].reset_index(drop=True)
            if not frame.empty:
                return frame, where
    raise InputError(
        f"{dataset.name}/{sub.name}: hf:{repo} has none of the configs "
        f"{', '.join(repr(c) for c in sub.configs)}; give the files with 'local:PATH'")


def _normalise_hub(dataset: EvalDataset, sub: Subset, repo_override: str | None,
                   revision: str | None) -> pd.DataFrame:
    repo = repo_override or sub.hub_id or dataset.hub_id
    if not repo or (not sub.on_hub and repo_override is None):
        raise InputError(
            f"{dataset.name}/{sub.name} has no loadable Hub copy (see "
            f"DATASETS[{dataset.name!r}].evidence); give its files with 'local:PATH'")
    data, where = _hub_load(dataset, sub, repo, revision)
    if dataset.kind == "classification":
        if not hasattr(data, "keys"):
            raise InputError(f"{where}: expected the dataset's splits, got one split")
        names = {"train": "train", "validation": "dev", "dev": "dev", "test": "test"}
        parts = []
        for split_name in data.keys():
            if split_name not in names:
                continue
            raw = _hub_frame(data[split_name])
            parts.append(_columns(dataset, sub, raw, f"{where}[{split_name}]")
                         .assign(split=names[split_name]))
        if not parts or "test" not in {p["split"].iloc[0] for p in parts if len(p)}:
            raise InputError(f"{where}: no test split among {', '.join(data.keys())}")
        frame = pd.concat(parts, ignore_index=True)
        frame.attrs["sources"] = parts[0].attrs.get("sources", {})
        return _finish(dataset, sub, frame, where)
    raw = data if isinstance(data, pd.DataFrame) else _hub_frame(data)
    return _finish(dataset, sub, _columns(dataset, sub, raw, where), where)


# --- normalising -----------------------------------------------------------------------------


def _columns(dataset: EvalDataset, sub: Subset, raw: pd.DataFrame, where: str) -> pd.DataFrame:
    """Project a source frame onto the normalised names (without ids, languages and split).

    The frame's ``attrs["sources"]`` maps each normalised name to its source column, for
    error messages."""
    if dataset.row_filter and dataset.row_filter[0] in raw.columns:
        column, value = dataset.row_filter
        raw = raw[raw[column].astype(str) == value].reset_index(drop=True)
        if raw.empty:
            raise InputError(f"{where}: no rows with {column} == {value!r}")
    mappings = sub.columns or dataset.columns
    for mapping in mappings:
        if all(source in raw.columns for source in mapping.values()):
            break
    else:
        wanted = mappings[0].values()
        missing = [c for c in wanted if c not in raw.columns]
        alternatives = ""
        if len(mappings) > 1:
            alternatives = " (or " + "; or ".join(", ".join(m.values()) for m in mappings[1:]) + ")"
        raise InputError(
            f"{where}: missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(c) for c in missing)}{alternatives}; columns found: "
            f"{', '.join(repr(str(c)) for c in raw.columns)}")
    out = pd.DataFrame({target: raw[source].to_numpy() for target, source in mapping.items()})
    if "pair_text" in out.columns:
        out = _split_pair_text(out, where)
    out.attrs["sources"] = dict(mapping)
    return out


def _split_pair_text(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    firsts, seconds = [], []
    for number, text in enumerate(frame.pop("pair_text"), start=1):
        parts = str(text).split("\n") if isinstance(text, str) else []
        if len(parts) != 2:
            parts = str(text).split("\t") if isinstance(text, str) else []
        if len(parts) != 2:
            raise InputError(f"{where}: row {number}: column 'Text' must hold two sentences "
                             f"separated by a line break, got {str(text)[:80]!r}")
        firsts.append(parts[0])
        seconds.append(parts[1])
    frame.insert(0, "sentence1", firsts)
    frame.insert(1, "sentence2", seconds)
    return frame


def _as_id(values: pd.Series) -> list[str]:
    out = []
    for value in values:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        out.append(None if value is None or (isinstance(value, float) and math.isnan(value))
                   else str(value))
    return out


def _finish(dataset: EvalDataset, sub: Subset, frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """Add ids and languages, apply the dataset's fixes and validate the kind's schema."""
    sources = dict(frame.attrs.get("sources") or {})
    frame = frame.reset_index(drop=True)
    id_column = "pair_id" if dataset.kind == "pairs" else "id"
    if id_column in frame.columns:
        frame[id_column] = _as_id(frame[id_column])
    else:
        frame.insert(0, id_column, [str(i) for i in range(len(frame))])
    if dataset.kind in ("pairs", "bitext_pairs"):
        frame["lang1"] = sub.lang1
        frame["lang2"] = sub.lang2 or sub.lang1
    if dataset.kind == "pairs" and "score" in frame.columns:
        frame["score"] = _scores(frame["score"], where, sources.get("score"))
    if dataset.check_script_order:
        frame = _orient_by_script(frame, sub, where)
    if sub.lang1 in dataset.transliterate:
        frame = _transliterate(frame, sub.lang1, *dataset.transliterate[sub.lang1], where)
    frame = frame[list(KIND_COLUMNS[dataset.kind])]
    _validate(frame, dataset.kind, where, dataset.score_range, sources)
    return frame


def _name(column: str, sources: Mapping[str, str] | None) -> str:
    """``'score'``, or ``'label' (normalised to 'score')`` where the source calls it otherwise."""
    source = (sources or {}).get(column)
    return f"{column!r}" if source in (None, column) else f"{source!r} (normalised to {column!r})"


def _scores(values: pd.Series, where: str, source: str | None = None) -> list[float]:
    numeric = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce")
    bad = [i for i, num in enumerate(numeric) if pd.isna(num) or not math.isfinite(num)]
    if bad:
        raise InputError(f"{where}: column {_name('score', {'score': source} if source else None)}"
                         f": row {bad[0] + 1} is not a number ({list(values)[bad[0]]!r}); "
                         f"{len(bad)} such row(s)")
    return [float(v) for v in numeric]


# --- scripts ---------------------------------------------------------------------------------

# ISO 15924 -> the first word of the Unicode names of its letters.
_SCRIPT_NAMES = {"Latn": "LATIN", "Arab": "ARABIC", "Cyrl": "CYRILLIC", "Hang": "HANGUL",
                 "Grek": "GREEK", "Hebr": "HEBREW", "Deva": "DEVANAGARI", "Ethi": "ETHIOPIC",
                 "Telu": "TELUGU", "Thai": "THAI", "Geor": "GEORGIAN", "Armn": "ARMENIAN",
                 "Hans": "CJK", "Hant": "CJK"}


def _script_share(texts, script: str) -> float:
    """The share of the letters of ``texts`` that belong to ``script`` (ISO 15924)."""
    prefix = _SCRIPT_NAMES[script]
    total = hits = 0
    for text in texts:
        for ch in str(text):
            if ch.isalpha():
                total += 1
                hits += unicodedata.name(ch, "").startswith(prefix)
    return hits / total if total else 0.0


def _orient_by_script(frame: pd.DataFrame, sub: Subset, where: str) -> pd.DataFrame:
    """Swap sentence1/sentence2 when their scripts show they are in the other order."""
    if sub.lang2 in (None, sub.lang1):
        return frame
    s1, s2 = registry.get(sub.lang1).script, registry.get(sub.lang2).script
    if s1 == s2 or s1 not in _SCRIPT_NAMES or s2 not in _SCRIPT_NAMES:
        return frame
    sample = frame.head(200)
    if (_script_share(sample["sentence1"], s1) < 0.5 and _script_share(sample["sentence1"], s2) > 0.5
            and _script_share(sample["sentence2"], s1) > 0.5):
        log.warning("%s: sentence1 is in %s, sentence2 in %s: swapped to match the subset name",
                    where, sub.lang2, sub.lang1)
        frame = frame.rename(columns={"sentence1": "sentence2", "sentence2": "sentence1"})
    return frame


def _transliterate(frame: pd.DataFrame, lang: str, source: str, target: str,
                   where: str) -> pd.DataFrame:
    """Convert text in another script into the registry's script for ``lang`` (Uyghur)."""
    script = registry.get(lang).script
    columns = list(TEXT_COLUMNS["pairs"])
    if _script_share(pd.concat([frame[c] for c in columns]).head(400), script) > 0.5:
        return frame  # already in the registry's script
    try:
        from umsc import UgMultiScriptConverter
    except ImportError:
        raise InputError(
            f"{where}: the {lang!r} text is not in {script} script (the registry's script for "
            f"{lang}); converting {source} to {target} needs the umsc package "
            "(pip install umsc), or give files already in that script") from None
    convert = UgMultiScriptConverter(source, target)
    frame = frame.copy()
    for column in columns:
        frame[column] = [convert(str(text)) for text in frame[column]]
    return frame


# --- validation ------------------------------------------------------------------------------


def _validate(frame: pd.DataFrame, kind: str, where: str,
              score_range: tuple[float, float] | None = None,
              sources: Mapping[str, str] | None = None) -> None:
    expected = KIND_COLUMNS[kind]
    missing = [c for c in expected if c not in frame.columns]
    if missing:
        raise InputError(f"{where}: missing column(s) {', '.join(map(repr, missing))} of the "
                         f"{kind} schema ({', '.join(expected)}); columns found: "
                         f"{', '.join(map(repr, map(str, frame.columns)))}")
    if frame.empty:
        raise InputError(f"{where}: no rows")
    id_column = "pair_id" if kind == "pairs" else "id"
    for column in (id_column, *TEXT_COLUMNS[kind]):
        values = frame[column]
        bad = [i for i, v in enumerate(values)
               if not isinstance(v, str) or (column != id_column and not v.strip())]
        if bad:
            raise InputError(f"{where}: column {_name(column, sources)}: row {bad[0] + 1} is "
                             f"empty or not text "
                             f"({values.iloc[bad[0]]!r}); {len(bad)} such row(s)")
    duplicated = frame[id_column][frame[id_column].duplicated()]
    if not duplicated.empty:
        raise InputError(f"{where}: column {_name(id_column, sources)}: duplicate id "
                         f"{duplicated.iloc[0]!r}")
    for column in ("lang1", "lang2"):
        if column in frame.columns:
            for code in frame[column].unique():
                if not registry.is_registered(str(code)):
                    raise InputError(f"{where}: column {column!r}: "
                                     f"{registry.unknown_message(code)}")
    if kind == "pairs":
        scores = frame["score"]
        if not pd.api.types.is_numeric_dtype(scores) or not scores.map(
                lambda v: isinstance(v, (int, float)) and math.isfinite(v)).all():
            raise InputError(f"{where}: column {_name('score', sources)} must hold finite numbers")
        if score_range is not None:
            low, high = score_range
            outside = scores[(scores < low) | (scores > high)]
            if not outside.empty:
                raise InputError(
                    f"{where}: column {_name('score', sources)}: {len(outside)} score(s) outside "
                    f"the dataset's "
                    f"range [{low:g}, {high:g}], e.g. {outside.iloc[0]:g} (row "
                    f"{outside.index[0] + 1}); are the gold labels withheld?")
    if kind == "paraphrase":
        seen: dict[str, tuple[str, int]] = {}
        for column in ("anchor", "positive"):
            for row, text in enumerate(frame[column], start=1):
                if text in seen:
                    first_column, first_row = seen[text]
                    raise InputError(
                        f"{where}: column {_name(column, sources)}: row {row}: {text!r} is also in "
                        f"column {_name(first_column, sources)}, row {first_row}; paraphrase mining "
                        "needs every sentence once (one right partner)")
                seen[text] = (column, row)
    if kind == "classification":
        odd = sorted(set(frame["split"]) - set(CLASSIFICATION_SPLITS))
        if odd:
            raise InputError(f"{where}: column 'split': unknown split(s) {odd}; expected "
                             f"{', '.join(CLASSIFICATION_SPLITS)}")


def read_subset(path: str | os.PathLike) -> pd.DataFrame:
    """Read a normalised subset file and validate it against its kind's schema.

    The kind is told by the columns (:data:`KIND_COLUMNS`); :class:`InputError` names the
    file and the column when the file is missing, unreadable, of no known schema or invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:
        raise InputError(f"{path}: not a readable parquet file ({err})") from None
    columns = tuple(frame.columns)
    kinds = [kind for kind, expected in KIND_COLUMNS.items() if set(expected) == set(columns)]
    if not kinds:
        schemas = "; ".join(f"{k}: {', '.join(v)}" for k, v in KIND_COLUMNS.items())
        raise InputError(f"{path}: columns {', '.join(columns)} match no evaluation schema "
                         f"({schemas})")
    kind = kinds[0]
    frame = frame[list(KIND_COLUMNS[kind])]
    _validate(frame, kind, str(path))
    frame.attrs["kind"] = kind
    return frame
