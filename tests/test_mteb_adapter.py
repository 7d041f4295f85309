"""The mteb adapter: a ModularEncoder evaluated by mteb on small local tasks."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

mteb = pytest.importorskip("mteb")

from datasets import Dataset, DatasetDict  # noqa: E402
from mteb.abstasks.text.bitext_mining import AbsTaskBitextMining  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402

from modsent.io import InputError  # noqa: E402
from modsent.encoders.modular import ModularEncoder  # noqa: E402
from modsent.evaluation.mteb import MtebEncoder, modsent_code  # noqa: E402
from modsent.sources.builtin import builtin_corpus  # noqa: E402
from modsent.testing import make_tiny_xlmr, sample_texts  # noqa: E402

GERMAN = list(dict.fromkeys(builtin_corpus("de")[200:260]))[:12]  # distinct sentences: no tied neighbours
KYRGYZ = list(dict.fromkeys(builtin_corpus("ky")[200:260]))[:12]
GOLD = [float(x) for x in np.random.default_rng(0).uniform(0, 5, 6)]

COMMON = dict(
    description="a small local task of the modsent tests", reference="https://example.org/modsent-tests",
    dataset={"path": "local/modsent-tests", "revision": "1"}, category="t2t", eval_splits=["test"],
    date=("2024-01-01", "2024-01-02"), dialect=["Written"], domains=["Web"], task_subtypes=[],
    license="cc-by-4.0", annotations_creators="derived", modalities=["text"], sample_creation="found",
    bibtex_citation="")


class LocalSTS(AbsTaskSTS):
    metadata = TaskMetadata(type="STS", name="ModsentLocalSTS", main_score="cosine_spearman",
                            eval_langs={"de": ["deu-Latn"], "de-ky": ["deu-Latn", "kir-Cyrl"]}, **COMMON)
    min_score, max_score = 0, 5

    def load_data(self, **kwargs):
        self.dataset = {
            "de": DatasetDict({"test": Dataset.from_dict(
                {"sentence1": GERMAN[:6], "sentence2": GERMAN[6:], "score": GOLD})}),
            "de-ky": DatasetDict({"test": Dataset.from_dict(
                {"sentence1": GERMAN[:6], "sentence2": KYRGYZ[6:], "score": GOLD})}),
        }
        self.data_loaded = True


class LocalBitext(AbsTaskBitextMining):
    metadata = TaskMetadata(type="BitextMining", name="ModsentLocalBitext", main_score="f1",
                            eval_langs={"de-ky": ["deu-Latn", "kir-Cyrl"]}, **COMMON)

    def load_data(self, **kwargs):
        self.dataset = {"de-ky": DatasetDict({"test": Dataset.from_dict(
            {"sentence1": GERMAN, "sentence2": KYRGYZ})})}
        self.data_loaded = True


class Recording:
    """A modsent encoder that records the language of every sentence it encodes."""

    def __init__(self, encoder):
        self.encoder, self.calls = encoder, []

    def encode(self, sentences, lang, batch_size=32):
        self.calls.extend((s, lang) for s in sentences)
        return self.encoder.encode(sentences, lang=lang, batch_size=batch_size)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    base = make_tiny_xlmr(tmp_path_factory.mktemp("mteb") / "base", sample_texts(300))
    modular = ModularEncoder(base, device="cpu")
    for lang in ("de", "ky"):
        modular.add_language(lang)  # the base's own tokenizer and body: routing is what is tested
    yield modular
    torch.set_num_threads(threads)


def test_language_codes_from_mteb_metadata():
    assert modsent_code("deu-Latn") == "de"
    assert modsent_code("kir-Cyrl") == "ky"
    assert modsent_code("cmn-Hans") == "zh"
    assert modsent_code("eng") == "en"
    assert modsent_code("qqq-Latn") is None


def test_mteb_evaluates_a_modular_encoder_routing_by_task_language(encoder):
    recording = Recording(encoder)
    model = MtebEncoder(recording, ["de", "ky"], name="modsent/tiny")
    result = mteb.evaluate(model, [LocalSTS()], cache=None, show_progress_bar=False)
    scores = {s["hf_subset"]: s for s in result.task_results[0].scores["test"]}
    # every sentence went through its own language's modules: German ones as de, Kyrgyz as ky
    lang_of = dict(recording.calls)
    assert all(lang_of[s] == "de" for s in GERMAN) and all(lang_of[s] == "ky" for s in KYRGYZ[6:])
    # mteb's score equals Spearman of the cosine computed here, from the encoder directly
    for subset, second, lang2 in (("de", GERMAN[6:], "de"), ("de-ky", KYRGYZ[6:], "ky")):
        a = encoder.encode(GERMAN[:6], lang="de")
        b = encoder.encode(second, lang=lang2)
        expected = spearmanr(np.sum(a * b, axis=1), GOLD).statistic
        assert scores[subset]["cosine_spearman"] == pytest.approx(expected, abs=1e-6)


def test_mteb_bitext_mining_on_a_modular_encoder(encoder):
    recording = Recording(encoder)
    model = MtebEncoder(recording, ["de", "ky"], name="modsent/tiny")
    result = mteb.evaluate(model, [LocalBitext()], cache=None, show_progress_bar=False)
    assert sorted(recording.calls) == sorted([(s, "de") for s in GERMAN] + [(s, "ky") for s in KYRGYZ])
    score = result.task_results[0].scores["test"][0]
    a, b = encoder.encode(GERMAN, lang="de"), encoder.encode(KYRGYZ, lang="ky")
    similarity = a @ b.T
    gold = np.diag(similarity)
    # the tiny random model maps some sentences to equal vectors: count ties both ways
    surely = int(np.sum(gold > _others_max(similarity) + 1e-6))
    possibly = int(np.sum(gold >= _others_max(similarity) - 1e-6))
    assert surely <= round(score["accuracy"] * len(GERMAN)) <= possibly


def _others_max(similarity):
    masked = similarity.copy()
    np.fill_diagonal(masked, -np.inf)
    return masked.max(axis=1)


def test_a_task_language_without_modules_is_an_error(encoder):
    model = MtebEncoder(encoder, ["ky"], name="modsent/tiny")
    with pytest.raises(InputError, match="available: ky"):
        model.encode([{"text": GERMAN}], task_metadata=LocalSTS.metadata, hf_split="test", hf_subset="de")
    # one side of a cross-lingual subset without modules (as STS17 en-ar with English modules
    # only): an error too, not the other side's modules in silence
    with pytest.raises(InputError, match="subset 'de-ky': language\\(s\\) de have no modules here"):
        model.encode([{"text": KYRGYZ}], task_metadata=LocalSTS.metadata, hf_split="test", hf_subset="de-ky")


def test_an_explicit_fallback_encodes_a_language_without_modules_and_records_it(encoder):
    recording = Recording(encoder)
    model = MtebEncoder(recording, ["ky"], name="modsent/tiny", fallback="ky")
    model.encode([{"text": GERMAN[:6]}], task_metadata=LocalSTS.metadata, hf_split="test", hf_subset="de-ky")
    assert {lang for _, lang in recording.calls} == {"ky"}
    assert model.fallbacks == {("ModsentLocalSTS", "de-ky"): {"de": "ky"}}
    with pytest.raises(InputError, match="fallback 'de' is not among the languages"):
        MtebEncoder(encoder, ["ky"], fallback="de")


def test_the_readme_selection_holds_only_subsets_with_modules():
    """The README's example selects the subsets of English and Kyrgyz only (mteb reads task
    metadata offline), and the adapter accepts every one of them."""
    import re

    from conftest import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    call = re.search(r"mteb\.get_tasks\((.*?)\)\)\n", readme, flags=re.S).group(1)
    tasks = eval(f"mteb.get_tasks({call})", {"mteb": mteb})  # the README's own arguments
    model = MtebEncoder(object(), ["en", "ky"])
    subsets = [(task.metadata.name, subset) for task in tasks for subset in task.hf_subsets]
    assert any(name.startswith("SIB200") for name, _ in subsets)
    for task in tasks:
        for subset in task.hf_subsets:
            assert set(model.subset_languages(task.metadata, subset)) <= {"en", "ky"}
