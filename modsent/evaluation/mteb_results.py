"""Each evaluated system's scores as mteb result files, beside the paper's tables.

For every evaluation dataset that is also an mteb task, the ``mteb_results`` rule writes the
scores mteb would compute for that task from the same embeddings, in mteb's own files::

    results/{base}/mteb/results/modsent-{base}__{system}/no_revision_available/
        model_meta.json      name modsent-{base}/{system}, cosine similarity, languages
        STS17.json           one mteb TaskResult: {split: [{hf_subset, languages, main_score, ...}]}
        Tatoeba.json ...

so ``mteb.ResultCache("results/{base}/mteb").load_results(...)`` reads them next to published
results (``include_remote=False`` offline). The mteb package is not needed to write them: the
metrics follow mteb's definitions, which ``tests/test_mteb_results.py`` checks against mteb's own
evaluation of the same embeddings (the pinned mteb, :data:`MTEB_VERSION`):

* **STS** (``cosine_spearman`` the main score): Pearson and Spearman correlations of the gold
  scores with the cosine similarity, the negative Manhattan and Euclidean distances, and the
  model's similarity function (cosine, so ``pearson``/``spearman`` equal the cosine ones);
* **bitext mining** (``f1``): each sentence of the task's first column retrieves its nearest
  neighbour by cosine among the second column's sentences (Tatoeba: X → English); precision,
  recall and F1 weighted over the gold rows, and accuracy.

Mapped: ``sts17`` → STS17, ``stsb_multi_mt`` → STSBenchmarkMultilingualSTS (test split),
``str2024`` → SemRel24STS, ``korsts`` → KorSTS, ``sick`` nl → SICK-NL-STS and pl → SICK-R-PL,
``tatoeba`` → Tatoeba. Not mapped: ``flores`` (mteb's FloresBitextMining is FLORES-200's
``devtest`` split; modsent reads FLORES+), ``sib200`` (mteb's classification protocol samples
its training rows differently from the paper's), ``kardes_sts`` and the built-in sets (not mteb
tasks), SICK's en/es (the original release, not mteb's SICK-R).

A result is comparable with published ones only when the rows are mteb's: each file's
``dataset_revision`` is mteb's pinned revision when the dataset was read from mteb's repository
at that revision (``evaluation.datasets.NAME.revision``), and otherwise names the source that
was read (``PhilipMay/stsb_multi_mt@main``, ``local:...``), so a reader sees the difference.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from modsent import languages as registry
from modsent.io import InputError, atomic_path

MTEB_VERSION = "2.26.24"  # the mteb whose result format and metric definitions these follow
REVISION = "no_revision_available"  # mteb's revision of a model without one


@dataclass(frozen=True)
class MtebTask:
    """An mteb task that one of modsent's evaluation datasets (or some of its subsets) is."""

    name: str
    type: str  # "STS" or "BitextMining"
    path: str  # mteb's Hub repository for it
    revision: str  # the revision mteb pins
    split: str
    hf_subset: Callable[[object], str | None]  # modsent Subset -> mteb subset, None: not in the task
    macrolanguages: bool = False  # the task names languages by macrolanguage (ara, not arb)


def _config(sub) -> str:
    return sub.configs[0]


def _default(sub) -> str:
    return "default"


def _only(*codes: str) -> Callable[[object], str | None]:
    return lambda sub: "default" if sub.name in codes else None


# dataset name -> the mteb tasks it maps to (revisions and subset names: mteb's task metadata,
# checked by tests/test_mteb_results.py against the installed mteb)
TASKS: Mapping[str, tuple[MtebTask, ...]] = {
    "sts17": (MtebTask("STS17", "STS", "mteb/sts17-crosslingual-sts",
                       "faeb762787bd10488a50c8b5be4a3b82e411949c", "test", _config, True),),
    "stsb_multi_mt": (MtebTask("STSBenchmarkMultilingualSTS", "STS", "mteb/stsb_multi_mt",
                               "29afa2569dcedaaa2fe6a3dcfebab33d28b82e8c", "test", _config),),
    "str2024": (MtebTask("SemRel24STS", "STS", "mteb/SemRel24STS",
                         "f5146bf724c55899ca20502851dc98c5405b67f9", "test", _config),),
    "korsts": (MtebTask("KorSTS", "STS", "dkoterwa/kor-sts",
                        "016f35f9b961daaaa7a352e927084e3da662ac1f", "test", _default),),
    "sick": (MtebTask("SICK-NL-STS", "STS", "clips/mteb-nl-sick-sts-pr",
                      "7f88f003fc4e37ed8cd9ade84e390d871b032fef", "test", _only("nl")),
             MtebTask("SICK-R-PL", "STS", "PL-MTEB/sickr-pl-sts",
                      "fd5c2441b7eeff8676768036142af4cfa42c1339", "test", _only("pl"))),
    "tatoeba": (MtebTask("Tatoeba", "BitextMining", "mteb/tatoeba-bitext-mining",
                         "69e8f12da6e31d59addadda9a9c8a2e601a0e282", "test", _config, True),),
}


def mapped_datasets(names: Sequence[str]) -> list[str]:
    """The datasets among ``names`` that are mteb tasks."""
    return [name for name in names if name in TASKS]


def model_name(base: str, system: str) -> str:
    """The mteb model name of a system of config ``base`` (its directory: ``/`` → ``__``)."""
    return f"modsent-{base}/{system}"


# individual languages (FLORES' codes) that STS17 and Tatoeba name by their macrolanguage
# (tests/test_mteb_results.py checks every mapped subset's languages against mteb's metadata)
MACROLANGUAGES = {"arb": "ara", "azj": "aze", "kmr": "kur", "khk": "mon", "als": "sqi", "uzn": "uzb",
                  "ydd": "yid"}


def langscript(code: str, *, macrolanguages: bool = False) -> str:
    """mteb's language code of a registry language: ``de`` → ``deu-Latn``; Mandarin is
    ``cmn-Hans`` in mteb, ``zho_Hans`` in FLORES; with ``macrolanguages``, Standard Arabic is
    ``ara-Arab`` (STS17, Tatoeba), not ``arb-Arab`` (SemRel)."""
    flores = registry.get(code).flores
    language, script = flores.split("_")
    language = "cmn" if language == "zho" else language
    if macrolanguages:
        language = MACROLANGUAGES.get(language, language)
    return f"{language}-{script}"


def _describe(task: MtebTask, location: str | None, revision: str | None) -> str:
    """mteb's revision when the rows were read from mteb's repository at that revision, else
    the source that was read (see the module docstring)."""
    repo = location[3:] if location and location.startswith("hf:") else location
    if repo == task.path and revision == task.revision:
        return task.revision
    if repo is None:
        return "unknown"
    return repo if repo.startswith("local:") else f"{repo}@{revision or 'main'}"


# ---- the metrics, as mteb defines them ---------------------------------------------------------


def _correlations(gold: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
    from scipy.stats import pearsonr, spearmanr  # scipy: not while the workflow plans

    return float(pearsonr(gold, predicted)[0]), float(spearmanr(gold, predicted)[0])


def sts_scores(first: np.ndarray, second: np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """mteb's STS metrics of the pairs (``first[i]``, ``second[i]``) with gold scores ``gold``."""
    from modsent.evaluation import metrics

    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    cosine = metrics.cosine_rows(first, second)
    manhattan = -np.abs(first - second).sum(axis=1)
    euclidean = -np.sqrt(((first - second) ** 2).sum(axis=1))
    out = {}
    for name, values in (("cosine", cosine), ("manhattan", manhattan), ("euclidean", euclidean)):
        out[f"{name}_pearson"], out[f"{name}_spearman"] = _correlations(gold, values)
    out["pearson"], out["spearman"] = out["cosine_pearson"], out["cosine_spearman"]  # similarity: cosine
    out["main_score"] = out["cosine_spearman"]
    return out


def bitext_scores(queries: np.ndarray, corpus: np.ndarray) -> dict[str, float]:
    """mteb's bitext-mining metrics: query ``i``'s gold is corpus row ``i``; its prediction the
    corpus row of highest cosine similarity."""
    from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

    from modsent.evaluation.metrics import _normalise

    similarity = _normalise(np.asarray(queries), np.float64) @ _normalise(np.asarray(corpus), np.float64).T
    predictions = np.argmax(similarity, axis=1).tolist()
    labels = list(range(len(predictions)))
    out = {
        "precision": float(precision_score(labels, predictions, zero_division=0, average="weighted")),
        "recall": float(recall_score(labels, predictions, zero_division=0, average="weighted")),
        "f1": float(f1_score(labels, predictions, zero_division=0, average="weighted")),
        "accuracy": float(accuracy_score(labels, predictions)),
    }
    out["main_score"] = out["f1"]
    return out


def _side(frame: pd.DataFrame, text: str, lang: str, embeddings: Mapping) -> np.ndarray:
    """The embeddings of column ``text``, each row's from its own language's table."""
    langs = frame[lang].to_numpy()
    out = None
    for code in dict.fromkeys(langs):
        rows = np.flatnonzero(langs == code)
        vectors = embeddings[code](frame[text].iloc[rows].tolist())
        if out is None:
            out = np.zeros((len(frame), vectors.shape[1]), dtype=np.float64)
        out[rows] = vectors
    return out


def _subset_scores(task: MtebTask, frame: pd.DataFrame, embeddings: Mapping) -> tuple[dict, list[str]]:
    if task.type == "STS":
        first = _side(frame, "sentence1", "lang1", embeddings)
        second = _side(frame, "sentence2", "lang2", embeddings)
        scores = sts_scores(first, second, frame["score"].to_numpy())
        langs = list(dict.fromkeys([*frame["lang1"], *frame["lang2"]]))
    elif task.type == "BitextMining":
        # mteb's first column (Tatoeba: the language X) retrieves among its second (English)
        queries, corpus = ("sentence1", "lang1"), ("sentence2", "lang2")
        if (frame["lang1"] == "en").all() and (frame["lang2"] != "en").all():
            queries, corpus = corpus, queries
        scores = bitext_scores(_side(frame, *queries, embeddings), _side(frame, *corpus, embeddings))
        langs = [frame[queries[1]].iloc[0], frame[corpus[1]].iloc[0]]
    else:  # pragma: no cover - TASKS holds these two types only
        raise InputError(f"mteb task type {task.type!r} is not written by modsent")
    return scores, [langscript(lang, macrolanguages=task.macrolanguages) for lang in langs]


# ---- the files ---------------------------------------------------------------------------------


def task_results(dataset: str, frames: Mapping[str, pd.DataFrame], embeddings: Mapping,
                 source: Mapping | None = None) -> dict[str, dict]:
    """mteb TaskResult dicts (task name → dict) of one system on one dataset.

    ``frames``: subset name → its normalised rows; ``embeddings``: language → a text → vector
    lookup (:class:`modsent.evaluation.suite.EmbeddingTable`); ``source``: the dataset's
    configured ``source``/``revision`` (``evaluation.datasets.NAME``)."""
    from modsent.sources import evaluation as ed

    definition = ed.get(dataset)
    configured = (source or {}).get("source")
    configured = None if configured in (None, "hf") else configured
    revision = (source or {}).get("revision") or definition.revision
    out = {}
    for task in TASKS.get(dataset, ()):
        start = time.perf_counter()
        entries, locations = [], set()
        for subset, frame in frames.items():
            sub = ed._subset(definition, subset)
            hf_subset = task.hf_subset(sub)
            if hf_subset is None or not len(frame) or not all(
                    lang in embeddings for lang in set(frame.get("lang1", [])) | set(frame.get("lang2", []))):
                continue
            repo = sub.hub_id or definition.hub_id  # SICK: one repository per language
            locations.add(configured or (f"hf:{repo}" if repo else None))
            scores, languages = _subset_scores(task, frame, embeddings)
            scores = {k: None if math.isnan(v) else v for k, v in scores.items()}  # JSON has no NaN
            entries.append({**scores, "hf_subset": hf_subset, "languages": languages})
        if not entries:
            continue
        out[task.name] = {
            "dataset_revision": "; ".join(sorted(_describe(task, location, revision) for location in locations)),
            "task_name": task.name,
            "mteb_version": MTEB_VERSION,
            "scores": {task.split: sorted(entries, key=lambda entry: entry["hf_subset"])},
            "evaluation_time": time.perf_counter() - start,
            "kg_co2_emissions": None,
            "date": datetime.now(timezone.utc).isoformat(sep=" "),
        }
    return out


def model_meta(base: str, system: str, languages: Sequence[str]) -> dict:
    """The ``model_meta.json`` of a system's results (mteb's ModelMeta fields)."""
    return {
        "name": model_name(base, system),
        "revision": REVISION,
        "release_date": None,
        "languages": [langscript(lang) for lang in languages],
        "loader": None,
        "n_parameters": None,
        "memory_usage_mb": None,
        "max_tokens": None,
        "embed_dim": None,
        "license": None,
        "open_weights": True,
        "public_training_code": None,
        "public_training_data": None,
        "framework": ["PyTorch", "Sentence Transformers"],
        "reference": None,
        "similarity_fn_name": "cosine",
        "use_instructions": False,
        "training_datasets": None,
        "adapted_from": None,
        "superseded_by": None,
        "modalities": ["text"],
    }


def write_results(out_dir: str | Path, base: str, system: str, datasets: Mapping[str, Mapping],
                  languages: Sequence[str]) -> list[Path]:
    """Write a system's mteb result directory (atomically): ``datasets`` maps a dataset name to
    ``{"frames": ..., "embeddings": ..., "source": ...}`` (see :func:`task_results`).
    Returns the task files written."""
    written = []
    with atomic_path(out_dir, directory=True) as tmp:
        (tmp / "model_meta.json").write_text(json.dumps(model_meta(base, system, languages), indent=2), encoding="utf-8")
        for dataset, parts in datasets.items():
            for name, result in task_results(dataset, parts["frames"], parts["embeddings"], parts.get("source")).items():
                path = tmp / f"{name}.json"
                if path.exists():
                    raise InputError(f"two datasets map to the mteb task {name}")
                path.write_text(json.dumps(result, indent=2), encoding="utf-8")
                written.append(Path(out_dir) / path.name)
    return written
