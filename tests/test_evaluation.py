"""Evaluation orchestration: embeddings per language, scores per dataset, the summary tables.

Encoders here are lookup tables built so that the answer is known by construction; the metric
functions themselves are tested against independent computations in test_metrics.py."""

import json
import statistics

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from modsent.evaluation import suite as ev
from modsent.io import InputError, write_parquet

LANGS = ["en", "de", "ky"]
N = 40
rng = np.random.default_rng(0)
MEANINGS = rng.normal(size=(N, 16)).astype(np.float32)
MEANINGS[:, 0] += 4 * np.sign(MEANINGS[:, 0])  # the topic label: a wide margin on one axis


class TableEncoder:
    """Sentence ``"{lang}:{i}"`` (or ``"{lang}:{i}:b"``) → a fixed vector; ``offset`` adds a
    language-specific direction (a language bias); ``shuffle`` permutes a language's meanings."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors, self.calls = vectors, []

    def encode(self, sentences, lang, batch_size=32):
        self.calls.append((lang, len(sentences)))
        out = np.stack([self.vectors[s] for s in sentences]).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _parallel_vectors(offset=0.0, shuffle=None):
    vectors = {}
    directions = {lang: rng.normal(size=16) for lang in LANGS}
    for lang in LANGS:
        order = np.arange(N) if shuffle != lang else np.roll(np.arange(N), 1)
        for i in range(N):
            vectors[f"{lang}:{i}"] = MEANINGS[order[i]] + offset * directions[lang]
            vectors[f"{lang}:{i}:b"] = 0.6 * MEANINGS[order[i]] + 0.8 * MEANINGS[(order[i] + 1) % N] \
                + offset * directions[lang]
    return vectors


def _write_subsets(root):
    paths = {"flores": {}, "stsb_multi_mt": {}, "sib200": {}, "tatoeba": {}}
    gold = np.linspace(0, 5, N)
    for lang in LANGS:
        paths["flores"][lang] = root / "flores" / f"{lang}.parquet"
        write_parquet(pd.DataFrame({"id": [str(i) for i in range(N)], "text": [f"{lang}:{i}" for i in range(N)]}),
                      paths["flores"][lang])
        paths["stsb_multi_mt"][lang] = root / "stsb" / f"{lang}.parquet"
        write_parquet(pd.DataFrame({
            "pair_id": [str(i) for i in range(N)], "lang1": lang, "lang2": lang,
            "sentence1": [f"{lang}:{i}" for i in range(N)], "sentence2": [f"{lang}:{i}:b" for i in range(N)],
            "score": gold}), paths["stsb_multi_mt"][lang])
        paths["sib200"][lang] = root / "sib" / f"{lang}.parquet"
        labels = ["a" if MEANINGS[i, 0] > 0 else "b" for i in range(N)]
        write_parquet(pd.DataFrame({"id": [str(i) for i in range(N)], "text": [f"{lang}:{i}" for i in range(N)],
                                    "label": labels, "split": ["train"] * 24 + ["dev"] * 4 + ["test"] * 12}),
                      paths["sib200"][lang])
        if lang != "en":
            paths["tatoeba"][lang] = root / "tatoeba" / f"{lang}.parquet"
            write_parquet(pd.DataFrame({"id": [str(i) for i in range(N)], "lang1": lang, "lang2": "en",
                                        "sentence1": [f"{lang}:{i}" for i in range(N)],
                                        "sentence2": [f"en:{i}" for i in range(N)]}), paths["tatoeba"][lang])
    return paths


def _embed_all(encoder, paths, out_root):
    dirs = {}
    for lang in LANGS:
        datasets = {name: [p for subset, p in subsets.items() if subset == lang] for name, subsets in paths.items()}
        datasets["tatoeba"] = [paths["tatoeba"][lang]] if lang != "en" else list(paths["tatoeba"].values())
        datasets = {name: files for name, files in datasets.items() if files}
        ev.embed_language({"V": encoder}, lang, datasets, out_root / lang)
        dirs[lang] = out_root / lang / "V"
    return dirs


def _score(name, paths, dirs, variant="V"):
    return ev.score_dataset(name, paths[name], {lang: dirs[lang] / f"{name}.parquet" for lang in LANGS
                                                 if (dirs[lang] / f"{name}.parquet").is_file()},
                            LANGS, variant=variant, missing=["xx"] if name == "sib200" else [])


@pytest.fixture(scope="module")
def subsets(tmp_path_factory):
    return _write_subsets(tmp_path_factory.mktemp("subsets"))


def test_embeddings_are_encoded_once_per_language_and_reload(subsets, tmp_path):
    encoder = TableEncoder(_parallel_vectors())
    dirs = _embed_all(encoder, subsets, tmp_path)
    table = ev.read_embeddings(dirs["de"] / "stsb_multi_mt.parquet")
    assert len(table.texts) == 2 * N and len(set(table.texts)) == 2 * N  # sentence1 and sentence2, distinct
    expected = encoder.encode(["de:3", "de:7:b"], lang="de")
    assert np.allclose(table(["de:3", "de:7:b"]), expected)
    # English in tatoeba: one sentence list shared by every en↔X subset, encoded once
    english = ev.read_embeddings(dirs["en"] / "tatoeba.parquet")
    assert sorted(english.texts) == sorted(f"en:{i}" for i in range(N))
    with pytest.raises(InputError, match="no embedding for"):
        table(["de:unknown"])
    assert json.loads((dirs["ky"].parent / "counts.json").read_text())["V"]["flores"] == N


def test_scores_known_by_construction(subsets, tmp_path):
    dirs = _embed_all(TableEncoder(_parallel_vectors()), subsets, tmp_path)
    flores = _score("flores", subsets, dirs)["scores"]
    assert set(flores["xsim"]["values"]) == {f"{a}-{b}" for a in LANGS for b in LANGS if a != b}
    assert flores["xsim"]["average"] == 0.0  # translations embed identically: no mining error
    assert flores["rsim"]["average"] == pytest.approx(1.0)
    tatoeba = _score("tatoeba", subsets, dirs)["scores"]
    assert tatoeba["xsim"]["values"] == {"de": 0.0, "ky": 0.0}
    sts = _score("stsb_multi_mt", subsets, dirs)["scores"]
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in
           ((MEANINGS[i], 0.6 * MEANINGS[i] + 0.8 * MEANINGS[(i + 1) % N]) for i in range(N))]
    expected = 100 * spearmanr(cos, np.linspace(0, 5, N)).statistic
    assert sts["mono"]["values"]["de"] == pytest.approx(expected, abs=1e-4)
    assert set(sts["cross"]["values"]) == {"de-en", "en-ky", "de-ky"}  # symmetric pairs averaged
    assert sts["cross"]["average"] == pytest.approx(expected, abs=1e-4)  # language-agnostic encoder
    assert sts["language_bias"]["average"] == pytest.approx(0.0, abs=1e-4)
    sib = _score("sib200", subsets, dirs)
    assert sib["missing_languages"] == ["xx"]
    assert set(sib["scores"]["zero_shot"]["values"]) == {"de", "ky"}
    assert sib["scores"]["mono"]["average"] > 80  # the label is a linear function of the meaning


def test_scores_move_the_right_way(subsets, tmp_path):
    good = _embed_all(TableEncoder(_parallel_vectors()), subsets, tmp_path / "good")
    biased = _embed_all(TableEncoder(_parallel_vectors(offset=3.0)), subsets, tmp_path / "biased")
    shuffled = _embed_all(TableEncoder(_parallel_vectors(shuffle="ky")), subsets, tmp_path / "shuffled")
    b_sts = _score("stsb_multi_mt", subsets, biased)["scores"]
    g_sts = _score("stsb_multi_mt", subsets, good)["scores"]
    assert b_sts["language_bias"]["average"] > g_sts["language_bias"]["average"] + 1
    flores = _score("flores", subsets, shuffled)["scores"]["xsim"]["values"]
    assert flores["de-ky"] == 100.0 and flores["ky-en"] == 100.0 and flores["de-en"] == 0.0


def test_summary_tables_and_plots(subsets, tmp_path):
    scores = []
    for variant, vectors in (("base", _parallel_vectors(offset=3.0)), ("Mod_m", _parallel_vectors())):
        dirs = _embed_all(TableEncoder(vectors), subsets, tmp_path / variant)
        for name in subsets:
            path = tmp_path / "scores" / variant / f"{name}.json"
            ev.write_scores(path, _score(name, subsets, dirs, variant))
            scores.append(path)
    out = tmp_path / "out"
    frame = ev.aggregate(scores, ["base", "Mod_m"], csv_path=out / "summary.csv", md_path=out / "summary.md",
                         plot_path=out / "summary.png", heatmap_path=out / "xsim.png",
                         per_language_dir=out / "per_language", base="tiny", html_path=out / "summary.html")
    table = pd.read_csv(out / "summary.csv", index_col=0)
    assert list(table.index) == ["base", "Mod_m"]
    assert table.loc["Mod_m", "BM flores xsim err ↓"] == 0.0
    assert table.loc["base", "STS stsb_multi_mt bias ↓"] > table.loc["Mod_m", "STS stsb_multi_mt bias ↓"]
    assert np.allclose(table.values, frame.values, atol=1e-4, equal_nan=True)
    md = (out / "summary.md").read_text()
    assert "| Mod_m |" in md and "sib200: xx" in md
    per_language = pd.read_csv(out / "per_language" / "flores_xsim.csv", index_col=0)
    assert per_language.shape == (2, 6)
    # the report's pages: the same tables as HTML, each saying its unit and which way is better
    page = (out / "summary.html").read_text()
    assert "<table>" in page and "<td>Mod_m</td>" in page and page.count("<tr>") == len(table) + 1
    per_language_page = (out / "per_language" / "flores_xsim.html").read_text()
    assert per_language_page.count("<tr>") == 3 and "lower is better" in per_language_page
    assert "lower is better" in (out / "per_language" / "flores_xsim.md").read_text()
    assert "higher is better" in (out / "per_language" / "sib200_mono.md").read_text()
    for png in ("summary.png", "xsim.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_summary_legend_follows_the_scores_and_lists_what_averages_leave_out(tmp_path):
    """The xsim legend names the margin and k the scores were computed with (not always the
    defaults); a language a task skipped for its size and a score that is not finite are listed
    under the table, outside the average; the pointer to the per-language tables resolves from
    the summary's own directory."""
    bitext = {"variant": "V", "dataset": "flores", "task": "bitext", "kind": "parallel",
              "languages": ["en", "de", "ky"], "missing_languages": [],
              "scores": {"xsim": {"average": 10.0, "values": {"en-de": 10.0, "de-en": float("nan")},
                                  "k": 2, "margin": "distance"},
                         "rsim": {"average": None, "values": {"de-en": None}}}}
    paraphrase = {"variant": "V", "dataset": "pairs", "task": "paraphrase", "kind": "paraphrase",
                  "languages": ["de", "ky"], "missing_languages": [],
                  "scores": {"error": {"average": 5.0, "values": {"de": 5.0}, "k": 2, "margin": "distance",
                                       "skipped_languages": {"ky": "2 pairs, k = 2"}}}}
    paths = []
    for result in (bitext, paraphrase):
        paths.append(tmp_path / "scores" / f"{result['dataset']}.json")
        ev.write_scores(paths[-1], result)
    out = tmp_path / "results"
    ev.aggregate(paths, ["V"], csv_path=out / "summary.csv", md_path=out / "summary.md",
                 plot_path=out / "eval" / "summary.png", heatmap_path=out / "eval" / "xsim.png",
                 per_language_dir=out / "eval" / "per_language")
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "distance margin, k = 2" in md and "k = 4" not in md
    assert "- V: BM flores xsim err ↓: no finite score for de-en" in md
    assert "- V: RSIM flores: no finite score for de-en" in md
    assert "- V: PM pairs err ↓: ky skipped (2 pairs, k = 2)" in md
    assert "`eval/per_language/flores_xsim.md`" in md
    assert (out / "eval/per_language/flores_xsim.md").is_file()
    for table in ("flores_xsim", "pairs_error"):
        note = (out / "eval" / "per_language" / f"{table}.md").read_text(encoding="utf-8")
        assert "distance margin, k = 2" in note and "k = 4" not in note
    assert ev.xsim_setting([{"k": 4, "margin": "absolute"}, {"k": 4, "margin": "ratio"}]) \
        == "plain cosine; ratio margin, k = 4"


def test_subset_names():
    assert ev.subset_languages("de") == ["de"]
    assert ev.subset_languages("en-de") == ["en", "de"]
    assert ev.subset_languages("en-zh-Hant") == ["en", "zh-Hant"]
    # a subset whose name is one language but whose pairs are two: Tatoeba's de is German-English
    assert ev.subset_languages("de", "tatoeba") == ["de", "en"]
    assert ev.subset_languages("en-de", "sts17") == ["en", "de"]
    with pytest.raises(InputError, match="'xx-yy': not a registered language"):
        ev.subset_languages("xx-yy")


def test_systems_with_equal_modules_encode_once(subsets, tmp_path):
    """Two systems behind one encoder and key (as English in Mod_m and Mod_mc) are encoded once
    and get identical files; a third with its own key is encoded separately."""
    from modsent.encoders.systems import KeyedEncoder

    table = TableEncoder(_parallel_vectors())
    shared = {"Mod_m": KeyedEncoder(table, "en", "en"), "Mod_mc-0.5": KeyedEncoder(table, "en", "en"),
              "base": KeyedEncoder(TableEncoder(_parallel_vectors(offset=1.0)), "en", "en")}
    ev.embed_language(shared, "en", {"flores": [subsets["flores"]["en"]]}, tmp_path / "en")
    assert len(table.calls) == 1
    one, two, other = (ev.read_embeddings(tmp_path / "en" / name / "flores.parquet")
                       for name in ("Mod_m", "Mod_mc-0.5", "base"))
    assert np.array_equal(one.embeddings, two.embeddings) and not np.allclose(one.embeddings, other.embeddings)


def test_a_sentence_shared_by_datasets_is_encoded_once(subsets, tmp_path):
    """FLORES and Tatoeba share the English sentences here (as SIB-200 is built on FLORES'): one
    encode call per system over the distinct sentences, and each dataset's file holds its own
    sentences' vectors."""
    table = TableEncoder(_parallel_vectors())
    datasets = {"flores": [subsets["flores"]["en"]], "tatoeba": list(subsets["tatoeba"].values())}
    ev.embed_language({"V": table}, "en", datasets, tmp_path / "en")
    flores, tatoeba = (ev.read_embeddings(tmp_path / "en" / "V" / f"{name}.parquet") for name in ("flores", "tatoeba"))
    assert set(flores.texts) & set(tatoeba.texts)  # the datasets overlap
    assert table.calls == [("en", len(set(flores.texts) | set(tatoeba.texts)))]
    for got in (flores, tatoeba):
        assert np.allclose(got.embeddings, table.encode(got.texts, lang="en"))


def test_every_dataset_kind_has_one_task_kind():
    """The task registry is the one place of a kind's columns, sentences and scorer: every
    catalogue dataset's kind is registered, the loaders' schemas are the registry's, and a
    kind's sentences of a language are exactly that language's texts, first seen first."""
    from modsent.evaluation import tasks
    from modsent.sources import evaluation as datasets

    assert {dataset.kind for dataset in datasets.DATASETS.values()} <= set(tasks.REGISTRY)
    assert dict(datasets.KIND_COLUMNS) == {name: kind.columns for name, kind in tasks.REGISTRY.items()}
    frame = pd.DataFrame({"pair_id": ["1", "2"], "lang1": ["en", "de"], "lang2": ["de", "en"],
                          "sentence1": ["a", "b"], "sentence2": ["c", "a"], "score": [1.0, 2.0]})
    assert tasks.get("pairs").sentences([frame], "en") == ["a"]
    assert tasks.get("pairs").sentences([frame], "de") == ["b", "c"]
    texts = pd.DataFrame({"id": ["1", "2", "3"], "text": ["x", "y", "x"]})
    assert tasks.get("parallel").sentences([texts], "de") == ["x", "y"]
    with pytest.raises(InputError, match="unknown evaluation task kind 'nope'; kinds: pairs"):
        tasks.get("nope")


def test_non_finite_embeddings_are_an_error_naming_the_system(subsets, tmp_path):
    """A corrupt module (NaN weights) makes NaN vectors: the embedding job fails, naming the
    system and language, instead of writing them (exit 0) for the scores to average."""

    class NaNEncoder:
        def encode(self, sentences, lang, batch_size=32):
            out = np.ones((len(sentences), 4), dtype=np.float32)
            out[1, 2] = np.nan
            return out

    datasets = {name: [p for subset, p in paths.items() if subset == "de"] for name, paths in subsets.items()}
    datasets = {name: files for name, files in datasets.items() if files}
    with pytest.raises(InputError, match=r"Mod_x de \(.*\): 1 of \d+ embeddings are not finite"):
        ev.embed_language({"Mod_x": NaNEncoder()}, "de", datasets, tmp_path / "emb")
    assert not (tmp_path / "emb").exists()


def test_seeds_summary_is_the_mean_and_sample_std_of_the_replicates(tmp_path):
    """config seeds: N — each cell of the seeds table is the mean ± sample std (ddof 1) of that
    cell over the replicates' summaries, a score one replicate lacks counts the others only."""
    rng = np.random.default_rng(3)
    columns = ["BM builtin_parallel xsim err ↓", "RSIM builtin_parallel", "TC builtin_topics mono"]
    paths, values = [], []
    for r in range(3):
        table = pd.DataFrame(rng.uniform(0, 100, (2, 3)), index=pd.Index(["base", "Mod_m"], name="variant"),
                             columns=columns)
        table.loc["Mod_m", columns[2]] = np.nan  # a score this system has in no replicate
        if r == 2:
            table.loc["Mod_m", columns[1]] = np.nan  # e.g. a score a replicate could not compute
        values.append(table)
        paths.append(tmp_path / f"summary{r}.csv")
        table.to_csv(paths[-1])
    mean, std = ev.seeds_summary(paths, csv_path=tmp_path / "seeds.csv", md_path=tmp_path / "seeds.md",
                                 html_path=tmp_path / "seeds.html", base="tiny")
    cell = [v.loc["base", columns[0]] for v in values]
    assert mean.loc["base", columns[0]] == pytest.approx(sum(cell) / 3)
    assert std.loc["base", columns[0]] == pytest.approx(statistics.stdev(cell))
    two = [v.loc["Mod_m", columns[1]] for v in values[:2]]
    assert mean.loc["Mod_m", columns[1]] == pytest.approx(sum(two) / 2)
    assert std.loc["Mod_m", columns[1]] == pytest.approx(statistics.stdev(two))
    saved = pd.read_csv(tmp_path / "seeds.csv", index_col=0)
    assert list(saved.columns) == [f"{c} {s}" for c in columns for s in ("mean", "std")] + ["replicates"]
    # the fewest replicates behind a measured score (not 0 for the score Mod_m never has)
    assert saved.loc["base", "replicates"] == 3 and saved.loc["Mod_m", "replicates"] == 2
    assert np.isnan(saved.loc["Mod_m", f"{columns[2]} mean"])
    text = (tmp_path / "seeds.md").read_text()
    assert f"| base | {mean.loc['base', columns[0]]:.1f} ± {std.loc['base', columns[0]]:.1f} |" in text
    assert "<table>" in (tmp_path / "seeds.html").read_text()
    with pytest.raises(InputError, match="at least two replicates"):
        ev.seeds_summary(paths[:1], csv_path=tmp_path / "x.csv", md_path=tmp_path / "x.md")


def test_paraphrase_mining_scores_known_by_construction(tmp_path):
    """Monolingual paraphrase mining: each anchor's partner among the language's positives and
    back. With the partners of the first half of the pairs swapped two by two, exactly those
    anchors (and positives) find a wrong partner: 50% error in each direction."""
    half = N // 2
    vectors, paths = {}, {}
    for lang in ("en", "de"):
        for i in range(N):
            vectors[f"{lang}:{i}"] = MEANINGS[i]
            partner = (i ^ 1) if (lang == "de" and i < half) else i
            vectors[f"{lang}:{i}:p"] = MEANINGS[partner] + 0.05 * rng.normal(size=16)
        paths[lang] = tmp_path / "subsets" / f"{lang}.parquet"
        write_parquet(pd.DataFrame({"id": [str(i) for i in range(N)],
                                    "anchor": [f"{lang}:{i}" for i in range(N)],
                                    "positive": [f"{lang}:{i}:p" for i in range(N)]}), paths[lang])
    encoder = TableEncoder(vectors)
    embeddings = {}
    for lang in ("en", "de"):
        ev.embed_language({"V": encoder}, lang, {"builtin_paraphrase": [paths[lang]]}, tmp_path / lang)
        embeddings[lang] = tmp_path / lang / "V" / "builtin_paraphrase.parquet"
        assert len(ev.read_embeddings(embeddings[lang]).texts) == 2 * N
    result = ev.score_dataset("builtin_paraphrase", paths, embeddings, ["en", "de"], variant="V")
    assert result["task"] == "paraphrase"
    assert result["scores"]["error"]["values"] == {"en": 0.0, "de": pytest.approx(50.0)}
    frame = ev.summary_frame([result], ["V"])
    assert frame.loc["V", "PM builtin_paraphrase err ↓"] == pytest.approx(25.0)
    # a language with no more pairs than k has no margin to compute: skipped and said so
    small = tmp_path / "subsets" / "ky.parquet"
    write_parquet(pd.DataFrame({"id": ["0", "1", "2"], "anchor": ["en:0", "en:1", "en:2"],
                                "positive": ["en:0:p", "en:1:p", "en:2:p"]}), small)
    result = ev.score_dataset("builtin_paraphrase", {**paths, "ky": small}, {**embeddings, "ky": embeddings["en"]},
                              ["en", "de", "ky"], variant="V")
    assert set(result["scores"]["error"]["values"]) == {"en", "de"}
    assert result["scores"]["error"]["skipped_languages"] == {"ky": "3 pairs, k = 4"}
    # a sentence in two pairs (either column), or paired with itself, has two right partners:
    # the file is refused, naming the column and the rows
    from modsent.sources.evaluation import read_subset
    bad = tmp_path / "bad.parquet"
    for rows, message in (((["a", "a"], ["b", "c"]), "column 'anchor': row 2: 'a' is also in column 'anchor', row 1"),
                          ((["a", "b"], ["b", "c"]), "column 'positive': row 1: 'b' is also in column 'anchor', row 2"),
                          ((["a", "b"], ["a", "c"]), "column 'positive': row 1: 'a' is also in column 'anchor', row 1")):
        write_parquet(pd.DataFrame({"id": ["1", "2"], "anchor": rows[0], "positive": rows[1]}), bad)
        with pytest.raises(InputError, match=message):
            read_subset(bad)
