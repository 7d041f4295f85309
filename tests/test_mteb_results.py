"""mteb result files (modsent.evaluation.mteb_results): mteb's own metrics on the same
embeddings, files mteb's loader reads, and a task mapping that matches mteb's metadata."""

import json

import numpy as np
import pandas as pd
import pytest

mteb = pytest.importorskip("mteb")

from datasets import Dataset, DatasetDict  # noqa: E402
from mteb.models.abs_encoder import AbsEncoder  # noqa: E402
from mteb.models.model_meta import ModelMeta, ScoringFunction  # noqa: E402

from modsent.evaluation import mteb_results  # noqa: E402
from modsent.evaluation.suite import EmbeddingTable  # noqa: E402
from modsent.sources import evaluation as ed  # noqa: E402
from modsent.sources.builtin import builtin_corpus  # noqa: E402

RNG = np.random.default_rng(7)
CORPORA = {lang: list(dict.fromkeys(builtin_corpus(lang)[100:300])) for lang in ("en", "de", "ky")}
# texts of one language only (the catalogs leave some strings untranslated): a lookup by text is exact
SENTENCES = {lang: [text for text in texts if not any(text in CORPORA[other] for other in CORPORA if other != lang)][:40]
             for lang, texts in CORPORA.items()}
# the same sentences' vectors for mteb (looked up by text) and for modsent (per language)
VECTORS = {lang: RNG.normal(size=(len(texts), 16)).astype(np.float32) for lang, texts in SENTENCES.items()}
TABLES = {lang: EmbeddingTable(SENTENCES[lang], VECTORS[lang]) for lang in SENTENCES}
BY_TEXT = {text: VECTORS[lang][i] for lang, texts in SENTENCES.items() for i, text in enumerate(texts)}


class Lookup(AbsEncoder):
    """An mteb encoder that returns the stored vector of each text."""

    def __init__(self):
        self.mteb_model_meta = ModelMeta.create_empty().model_copy(update={
            "name": "modsent-test/system", "revision": "r", "similarity_fn_name": ScoringFunction.COSINE})

    def encode(self, inputs, **kwargs):
        return np.stack([BY_TEXT[text] for batch in inputs for text in batch["text"]])


def sts_frame(lang1, lang2, n=30):
    gold = RNG.uniform(0, 5, n).round(2)
    return pd.DataFrame({"pair_id": [str(i) for i in range(n)], "lang1": lang1, "lang2": lang2,
                         "sentence1": SENTENCES[lang1][:n], "sentence2": SENTENCES[lang2][-n:], "score": gold})


def bitext_frame(lang, n=40):
    return pd.DataFrame({"id": [str(i) for i in range(n)], "lang1": lang, "lang2": "en",
                         "sentence1": SENTENCES[lang][:n], "sentence2": SENTENCES["en"][:n]})


def mteb_scores(name, split, data):
    """mteb's own evaluation of the real task ``name`` on the given rows, subset → scores."""
    task = mteb.get_task(name, eval_splits=[split], hf_subsets=list(data))
    task.dataset = {subset: DatasetDict({split: Dataset.from_pandas(frame, preserve_index=False)})
                    for subset, frame in data.items()}
    task.data_loaded = True
    result = mteb.evaluate(Lookup(), [task], cache=None, show_progress_bar=False)
    return {entry["hf_subset"]: entry for entry in result.task_results[0].scores[split]}


def test_sts_scores_equal_mteb_s_on_the_same_embeddings():
    frames = {"en-de": sts_frame("en", "de"), "en": sts_frame("en", "en")}
    ours = mteb_results.task_results("sts17", frames, TABLES)["STS17"]
    expected = mteb_scores("STS17", "test", {
        "en-de": frames["en-de"][["sentence1", "sentence2", "score"]],
        "en-en": frames["en"][["sentence1", "sentence2", "score"]]})
    entries = {entry["hf_subset"]: entry for entry in ours["scores"]["test"]}
    assert set(entries) == {"en-de", "en-en"}
    for subset, theirs in expected.items():
        assert entries[subset]["languages"] == theirs["languages"]
        metrics = set(theirs) - {"hf_subset", "languages", "mteb_version"}
        assert metrics == set(entries[subset]) - {"hf_subset", "languages"}
        for metric in metrics:
            assert entries[subset][metric] == pytest.approx(theirs[metric], abs=1e-6), metric  # float64 here, float32 there
    # and the main score is the Spearman ×1 of the cosine, as modsent's own table has it ×100
    assert ours["dataset_revision"] == "mteb/sts17-crosslingual-sts@main"  # not mteb's pinned rows


def test_bitext_scores_equal_mteb_s_whichever_way_the_rows_are_stored():
    frame = bitext_frame("de")
    ours = mteb_results.task_results("tatoeba", {"de": frame}, TABLES)["Tatoeba"]["scores"]["test"][0]
    # stored English-first, the same rows give the same result: mteb's direction is X -> English
    flipped = frame.rename(columns={"lang1": "lang2", "lang2": "lang1", "sentence1": "sentence2",
                                    "sentence2": "sentence1"})
    again = mteb_results.task_results("tatoeba", {"de": flipped}, TABLES)["Tatoeba"]["scores"]["test"][0]
    theirs = mteb_scores("Tatoeba", "test", {"deu-eng": frame[["sentence1", "sentence2"]]})["deu-eng"]
    assert ours["hf_subset"] == "deu-eng" and ours["languages"] == theirs["languages"] == ["deu-Latn", "eng-Latn"]
    for metric in ("precision", "recall", "f1", "accuracy", "main_score"):
        assert ours[metric] == pytest.approx(theirs[metric], abs=1e-12) == again[metric]
    assert 0 < ours["accuracy"] < 1  # random vectors: some found, most not (a test that can fail)


def test_files_are_read_by_mteb_s_result_cache(tmp_path):
    frames = {"en-de": sts_frame("en", "de")}
    cache = tmp_path / "mteb"
    out = cache / "results" / "modsent-tiny__Mod_m" / mteb_results.REVISION
    written = mteb_results.write_results(out, "tiny", "Mod_m", {
        "sts17": {"frames": frames, "embeddings": TABLES,
                  "source": {"source": "hf:mteb/sts17-crosslingual-sts",
                             "revision": "faeb762787bd10488a50c8b5be4a3b82e411949c"}},
        "tatoeba": {"frames": {"de": bitext_frame("de")}, "embeddings": TABLES},
        "sib200": {"frames": {}, "embeddings": TABLES}}, ["en", "de", "ky"])
    assert sorted(path.name for path in written) == ["STS17.json", "Tatoeba.json"]
    results = mteb.ResultCache(cache).load_results(include_remote=False)
    [model] = results.model_results
    assert model.model_name == "modsent-tiny/Mod_m"
    loaded = {task.task_name: task for task in model.task_results}
    assert set(loaded) == {"STS17", "Tatoeba"}
    stored = json.loads((out / "STS17.json").read_text())
    assert loaded["STS17"].get_score() == pytest.approx(stored["scores"]["test"][0]["cosine_spearman"])
    assert stored["dataset_revision"] == "faeb762787bd10488a50c8b5be4a3b82e411949c"  # read from mteb's rows
    meta = json.loads((out / "model_meta.json").read_text())
    assert meta["languages"] == ["eng-Latn", "deu-Latn", "kir-Cyrl"] and meta["similarity_fn_name"] == "cosine"


def test_every_mapped_subset_is_a_subset_of_the_mteb_task_with_its_languages():
    checked = 0
    for dataset, tasks in mteb_results.TASKS.items():
        definition = ed.get(dataset)
        for task in tasks:
            metadata = mteb.get_task(task.name).metadata
            assert (metadata.dataset["path"], metadata.dataset["revision"]) == (task.path, task.revision)
            assert metadata.type == task.type and task.split in metadata.eval_splits
            langs = metadata.eval_langs if isinstance(metadata.eval_langs, dict) else {"default": metadata.eval_langs}
            for subset in ed._table(definition).values():
                hf_subset = task.hf_subset(subset)
                if hf_subset is None or subset.name in definition.withheld:
                    continue
                assert hf_subset in langs, (dataset, subset.name, hf_subset)
                ours = [mteb_results.langscript(lang, macrolanguages=task.macrolanguages) for lang in subset.languages]
                assert sorted(ours) == sorted(langs[hf_subset]), \
                    (dataset, subset.name)
                checked += 1
    assert checked > 100  # STS17's 11, Tatoeba's, SemRel's, STSB's ...


def test_dataset_revision_names_the_repository_each_subset_was_read_from():
    """SICK keeps one repository per language (nl: maximedb/sick_nl): the file names it, not
    'unknown'; `source: hf` is the dataset's default repository."""
    tables = {"nl": EmbeddingTable(SENTENCES["de"], VECTORS["de"])}
    frame = sts_frame("de", "de").assign(lang1="nl", lang2="nl")
    for source in (None, {"source": "hf"}):
        result = mteb_results.task_results("sick", {"nl": frame}, tables, source)
        assert set(result) == {"SICK-NL-STS"}  # pl's task only with pl rows
        assert result["SICK-NL-STS"]["dataset_revision"] == "maximedb/sick_nl@main"
    pinned = mteb_results.task_results("sts17", {"en-de": sts_frame("en", "de")}, TABLES, {
        "source": "hf", "revision": "faeb762787bd10488a50c8b5be4a3b82e411949c"})
    assert pinned["STS17"]["dataset_revision"] == "faeb762787bd10488a50c8b5be4a3b82e411949c"
