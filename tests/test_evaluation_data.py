"""Tests of modsent.sources.evaluation: the evaluation datasets, read from fixtures in each source's
own layout (tests/fixtures/eval/, rows written for the tests) and through a stand-in for
``datasets.load_dataset``."""

from __future__ import annotations

import gzip
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets  # noqa: E402

from modsent.sources import evaluation as ev  # noqa: E402
from modsent import languages  # noqa: E402
from modsent.io import InputError  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "eval"

# (dataset, subset, local folder, rows, lang1, lang2)
LOCAL_CASES = [
    ("sts17", "en-de", "mteb-sts17-crosslingual-sts", 3, "en", "de"),
    ("sts17", "en-ar", "mteb-sts17-crosslingual-sts", 3, "en", "ar"),
    ("sts17", "ko", "mteb-sts17-crosslingual-sts", 3, "ko", "ko"),
    ("stsb_multi_mt", "de", "PhilipMay-stsb_multi_mt", 3, "de", "de"),
    ("stsb_multi_mt", "en", "PhilipMay-stsb_multi_mt", 3, "en", "en"),
    ("stsb_multi_mt", "nl", "stsb-multi-mt", 3, "nl", "nl"),
    ("kardes_sts", "az", "Kardes-NLU", 3, "az", "az"),
    ("kardes_sts", "en", "Kardes-NLU", 3, "en", "en"),
    ("korsts", "ko", "kor-nlu-datasets", 3, "ko", "ko"),
    ("sick", "en", "SICK", 3, "en", "en"),
    ("sick", "nl", "maximedb-sick_nl", 3, "nl", "nl"),
    ("sick", "pl", "sdadas-sick_pl", 3, "pl", "pl"),
    ("str2024", "en", "SemRel-SemRel2024", 3, "en", "en"),
    ("str2024", "ha", "Semantic_Relatedness_SemEval2024", 2, "ha", "ha"),
    ("sib200", "de", "Davlan-sib200", 5, None, None),
    ("flores", "de", "openlanguagedata-flores_plus", 4, None, None),
    ("tatoeba", "de", "mteb-tatoeba-bitext-mining", 4, "de", "en"),
    ("tatoeba", "zh", "mteb-tatoeba-bitext-mining", 4, "zh", "en"),
]


def prepare_local(tmp_path, name, subset, folder) -> pd.DataFrame:
    out = tmp_path / f"{name}-{subset}.parquet"
    count = ev.prepare_subset(name, subset, out, f"local:{FIXTURES / folder}")
    frame = ev.read_subset(out)
    assert count == len(frame)
    return frame


def test_kardes_and_korsts_join_by_sts_b_row_into_one_multi_parallel_set(tmp_path):
    """Paper 000's STSB: Kardeş-NLU's Turkic translations and KorSTS's Korean of the same STS-B
    test pairs. KorSTS has no row-number column: its 0-based row is the STS-B row, the number
    Kardeş-NLU's first column holds, so ko-az pairs are scored on the rows both have."""
    from modsent.evaluation import tasks

    name, folder = "stsb_kardes_korsts", "stsb-kardes-korsts"  # clones of both repositories in one folder
    assert ev.subsets(name, ["en", "ko", "az", "de"], f"local:{FIXTURES / folder}") == (["az", "en", "ko"], ["de"])
    frames = {code: prepare_local(tmp_path, name, code, folder) for code in ("az", "en", "ko")}
    assert list(frames["ko"]["pair_id"]) == [str(i) for i in range(9)]
    assert list(frames["az"]["pair_id"]) == list(frames["en"]["pair_id"]) == ["5", "6", "8"]
    ko = frames["ko"].set_index("pair_id").loc[["5", "6", "8"]]
    assert list(ko["score"]) == list(frames["az"]["score"])  # the same pairs, as the fixture's rows are
    # scored: ko-az on the three pairs all languages have. Each sentence's vector is its English
    # sentence's (Korean and Azerbaijani by pair_id and column), so every cross-lingual score
    # equals the English one
    to_english = {}
    for code in ("az", "ko"):
        aligned = frames[code].set_index("pair_id").loc[list(frames["en"]["pair_id"])]
        for column in ("sentence1", "sentence2"):
            to_english.update(zip(aligned[column], frames["en"][column]))
    english = sorted(set(frames["en"]["sentence1"]) | set(frames["en"]["sentence2"]))
    basis = dict(zip(english, np.random.default_rng(0).normal(size=(len(english), 16))))
    embeddings = {code: (lambda texts: np.stack([basis[to_english.get(t, t)] for t in texts]))
                  for code in ("en", "ko", "az")}
    scores = tasks.score_pairs(tasks.Scoring(ev.get(name), frames, embeddings, ["en", "ko", "az"]))
    assert scores["language_bias"]["pairs"] == 3 and scores["language_bias"]["languages"] == ["en", "ko", "az"]
    cross = scores["cross"]["values"]
    assert len(cross) == 3 and {round(v, 9) for v in cross.values()} == {round(scores["mono"]["values"]["en"], 9)}
    assert set(scores["mono"]["values"]) == {"en", "ko", "az"}


# --- the registry of datasets ------------------------------------------------------------


def test_every_dataset_is_well_formed():
    assert set(ev.DATASETS) == {"sts17", "stsb_multi_mt", "kardes_sts", "korsts", "stsb_kardes_korsts", "sick",
                                "str2024", "sib200", "flores", "tatoeba", "builtin_parallel",
                                "builtin_topics", "builtin_paraphrase"}
    for name, dataset in ev.DATASETS.items():
        assert dataset.name == name
        assert dataset.kind in ev.KIND_COLUMNS
        assert dataset.task in ("sts", "str", "bitext", "classification", "paraphrase")
        assert dataset.description and dataset.evidence
        for key, sub in dataset.subset_table.items():
            assert key == sub.name
            assert all(languages.is_registered(code) for code in sub.languages), (name, key)
            if dataset.kind == "pairs" and dataset.multi_parallel:
                assert sub.lang2 in (None, sub.lang1)  # multi-parallel: monolingual subsets
        assert set(dataset.withheld) <= set(dataset.subset_table)


def test_hub_ids_configs_and_splits_as_the_cards_say():
    assert ev.get("sts17").hub_id == "mteb/sts17-crosslingual-sts"
    assert ev.get("sts17").subset_table["en-de"].configs == ("en-de",)
    assert ev.get("sts17").subset_table["ko"].configs == ("ko-ko",)
    assert ev.get("stsb_multi_mt").hub_id == "PhilipMay/stsb_multi_mt"
    assert ev.get("str2024").hub_id == "SemRel/SemRel2024"
    assert ev.get("str2024").subset_table["en"].configs == ("eng",)
    assert ev.get("str2024").subset_table["es"].configs == ("esp",)
    assert ev.get("str2024").subset_table["ary"].configs == ("ary",)
    assert "arq" not in ev.get("str2024").subset_table  # Algerian Arabic is not registered
    assert ev.get("sib200").hub_id == "Davlan/sib200"
    assert ev.get("sib200").subset_table["de"].configs == ("deu_Latn",)
    assert ev.get("flores").hub_id == "openlanguagedata/flores_plus"
    assert ev.get("flores").split == "devtest"
    assert ev.get("flores").subset_table["zh"].configs == ("zho_Hans", "cmn_Hans")
    assert ev.get("tatoeba").hub_id == "mteb/tatoeba-bitext-mining"
    assert ev.get("tatoeba").subset_table["de"].configs == ("deu-eng",)
    assert ev.get("tatoeba").subset_table["zh"].configs == ("cmn-eng",)
    assert ev.get("sick").subset_table["nl"].hub_id == "maximedb/sick_nl"
    assert ev.get("sick").subset_table["pl"].hub_id == "sdadas/sick_pl"
    for name in ("kardes_sts", "korsts"):
        assert ev.get(name).hub_id is None
    assert all(d.revision is None for d in ev.DATASETS.values())


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(InputError, match=r"unknown evaluation dataset 'sts99'; known datasets: "
                                         r"builtin_parallel, .*tatoeba"):
        ev.get("sts99")
    for call in (lambda: ev.subsets("sts99", ["en"]),
                 lambda: ev.check_source("sts99", None),
                 lambda: ev.prepare_subset("sts99", "en", "x.parquet")):
        with pytest.raises(InputError, match="unknown evaluation dataset 'sts99'"):
            call()


# --- subsets for the configured languages --------------------------------------------------


def test_subsets_cross_lingual_needs_both_languages():
    available, missing = ev.subsets("sts17", ["de", "en", "ko", "sw"])
    assert sorted(available) == ["en", "en-de", "ko"]
    assert missing == ["sw"]
    available, missing = ev.subsets("sts17", ["de", "ko"])  # no English: no en-de
    assert available == ["ko"] and missing == []


def test_subsets_multi_parallel_are_monolingual():
    assert ev.subsets("stsb_multi_mt", ["de", "en", "ky"]) == (["de", "en"], ["ky"])
    assert ev.subsets("kardes_sts", ["ky", "ug", "en", "tr"]) == (["en", "ky", "ug"], ["tr"])
    assert ev.subsets("sick", ["pl", "nl", "de"]) == (["nl", "pl"], ["de"])


def test_subsets_withheld_and_unregistered_languages_are_missing():
    # Spanish test labels are withheld; Algerian Arabic (arq) is not in the registry at all.
    assert ev.subsets("str2024", ["en", "es", "ha", "ar"]) == (["en", "ha"], ["es", "ar"])
    assert ev.subsets("str2024", ["ary", "rw"]) == (["ary", "rw"], [])


def test_subsets_bitext_and_registry_wide_datasets():
    assert ev.subsets("tatoeba", ["de", "en", "zh"]) == (["de", "zh"], [])
    assert ev.subsets("tatoeba", ["de", "zh"]) == ([], [])  # every subset needs English
    assert ev.subsets("tatoeba", ["de", "en", "ckb"]) == (["de"], ["ckb"])
    assert ev.subsets("flores", ["ckb", "zh-Hant"]) == (["ckb", "zh-Hant"], [])
    assert ev.subsets("sib200", ["de", "ky"]) == (["de", "ky"], [])


def test_subsets_unregistered_code_is_an_input_error():
    with pytest.raises(InputError, match=r"'deu' is not a modsent language code; write 'de'"):
        ev.subsets("flores", ["deu"])


def test_subsets_builtin_languages():
    available, missing = ev.subsets("builtin_parallel", ["de", "ky", "ckb"])
    assert available == ["de", "ky"] and missing == ["ckb"]


# --- every dataset from local files in its own layout ----------------------------------------


@pytest.mark.parametrize("name,subset,folder,rows,lang1,lang2", LOCAL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in LOCAL_CASES])
def test_local_files_normalise_to_the_schema(tmp_path, name, subset, folder, rows, lang1, lang2):
    frame = prepare_local(tmp_path, name, subset, folder)
    kind = ev.get(name).kind
    assert tuple(frame.columns) == ev.KIND_COLUMNS[kind]
    assert frame.attrs["kind"] == kind
    assert len(frame) == rows
    if lang1 is not None:
        assert set(frame["lang1"]) == {lang1} and set(frame["lang2"]) == {lang2}
    if kind == "pairs":
        assert frame["score"].dtype == "float64"
        low, high = ev.get(name).score_range
        assert frame["score"].between(low, high).all()
    id_column = "pair_id" if kind == "pairs" else "id"
    assert all(isinstance(v, str) for v in frame[id_column])
    assert frame[id_column].is_unique


def test_local_values(tmp_path):
    sts = prepare_local(tmp_path, "sts17", "en-de", "mteb-sts17-crosslingual-sts")
    assert sts.iloc[0].to_dict() == {"pair_id": "0", "lang1": "en", "lang2": "de",
                                     "sentence1": "The cat is sleeping.",
                                     "sentence2": "Der Hund schläft.", "score": 2.5}
    semrel = prepare_local(tmp_path, "str2024", "ha", "Semantic_Relatedness_SemEval2024")
    assert semrel.iloc[0][["pair_id", "sentence1", "sentence2", "score"]].tolist() == [
        "hau_test_00001", "Kyanwa tana barci.", "Kare yana barci.", 0.6]
    sick = prepare_local(tmp_path, "sick", "en", "SICK")
    assert sick["pair_id"].tolist() == ["1", "2", "3"]  # the TRAIN row is dropped
    assert sick["score"].tolist() == [3.5, 1.2, 2.0]
    sib = prepare_local(tmp_path, "sib200", "de", "Davlan-sib200")
    assert sib["split"].tolist() == ["train", "train", "dev", "test", "test"]
    assert sib["label"].tolist() == ["science/technology", "travel", "sports", "health", "travel"]
    assert sib["id"].tolist() == ["1", "2", "3", "4", "5"]
    flores = prepare_local(tmp_path, "flores", "de", "openlanguagedata-flores_plus")
    assert flores.iloc[0].to_dict() == {"id": "1", "text": "Die Katze schläft."}
    tatoeba = prepare_local(tmp_path, "tatoeba", "zh", "mteb-tatoeba-bitext-mining")
    assert tatoeba.iloc[0][["sentence1", "sentence2"]].tolist() == ["猫在睡觉。", "The cat is sleeping."]


@pytest.mark.parametrize("name,subsets_,folders", [
    ("stsb_multi_mt", ("de", "en"), ("PhilipMay-stsb_multi_mt",) * 2),
    ("kardes_sts", ("az", "en"), ("Kardes-NLU",) * 2),
    ("sick", ("en", "nl", "pl"), ("SICK", "maximedb-sick_nl", "sdadas-sick_pl")),
])
def test_multi_parallel_pair_ids_align_across_languages(tmp_path, name, subsets_, folders):
    assert ev.get(name).multi_parallel
    frames = [prepare_local(tmp_path, name, s, f).set_index("pair_id")
              for s, f in zip(subsets_, folders)]
    first = frames[0]
    for other in frames[1:]:
        assert list(other.index) == list(first.index)
        assert (other["score"] == first["score"]).all()
        assert (other["sentence1"] != first["sentence1"]).all()  # other language, same pair


def test_parallel_and_classification_ids_align(tmp_path):
    de = prepare_local(tmp_path, "flores", "de", "openlanguagedata-flores_plus")
    en = prepare_local(tmp_path, "flores", "en", "openlanguagedata-flores_plus")
    assert de["id"].tolist() == en["id"].tolist()
    sib_de = prepare_local(tmp_path, "sib200", "de", "Davlan-sib200")
    sib_en = prepare_local(tmp_path, "sib200", "en", "Davlan-sib200")
    assert sib_de[["id", "label", "split"]].equals(sib_en[["id", "label", "split"]])


def test_local_file_and_placeholders(tmp_path):
    one_file = FIXTURES / "kor-nlu-datasets" / "KorSTS" / "sts-test.tsv"
    assert ev.prepare_subset("korsts", "ko", tmp_path / "a.parquet", f"local:{one_file}") == 3
    template = FIXTURES / "PhilipMay-stsb_multi_mt" / "{lang}" / "test-00000-of-00001.parquet"
    assert ev.prepare_subset("stsb_multi_mt", "de", tmp_path / "b.parquet", f"local:{template}") == 3
    # a folder per subset: <root>/<subset>/... is searched first
    root = tmp_path / "sick"
    (root / "pl").mkdir(parents=True)
    (root / "pl" / "test.jsonl").write_bytes((FIXTURES / "sdadas-sick_pl" / "test.jsonl").read_bytes())
    assert ev.prepare_subset("sick", "pl", tmp_path / "c.parquet", f"local:{root}") == 3


def test_sick_folder_of_one_language_is_not_read_as_another(tmp_path):
    with pytest.raises(InputError, match=r"sick/nl: no data file .*data/test-\*\.parquet"):
        ev.prepare_subset("sick", "nl", tmp_path / "x.parquet", f"local:{FIXTURES / 'SICK'}")


def test_sts17_sentence_order_is_checked_by_script(tmp_path):
    rows = [{"sentence1": "القطة نائمة.", "sentence2": "The cat is sleeping.", "score": 4.0,
             "lang": "en-ar"},
            {"sentence1": "كلب يركض.", "sentence2": "A man plays the guitar.", "score": 0.4,
             "lang": "en-ar"}]
    path = tmp_path / "test" / "en-ar.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    ev.prepare_subset("sts17", "en-ar", tmp_path / "out.parquet", f"local:{tmp_path}")
    frame = ev.read_subset(tmp_path / "out.parquet")
    assert frame["sentence1"].tolist() == ["The cat is sleeping.", "A man plays the guitar."]
    assert frame["sentence2"].tolist() == ["القطة نائمة.", "كلب يركض."]
    assert frame["score"].tolist() == [4.0, 0.4]


def test_uyghur_cyrillic_needs_umsc(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "umsc", None)  # import fails
    with pytest.raises(InputError, match=r"sts\.test\.ug\.csv: the 'ug' text is not in Arab "
                                         r"script .*umsc"):
        ev.prepare_subset("kardes_sts", "ug", tmp_path / "ug.parquet",
                          f"local:{FIXTURES / 'Kardes-NLU'}")
    assert not (tmp_path / "ug.parquet").exists()


def test_uyghur_cyrillic_is_transliterated(tmp_path, monkeypatch):
    calls = []

    class Converter:  # stands in for umsc.UgMultiScriptConverter
        def __init__(self, source, target):
            calls.append((source, target))

        def __call__(self, text):
            return "تېكىست"  # any Arabic-script text

    monkeypatch.setitem(sys.modules, "umsc", types.SimpleNamespace(UgMultiScriptConverter=Converter))
    frame = prepare_local(tmp_path, "kardes_sts", "ug", "Kardes-NLU")
    assert calls == [("UCS", "UAS")]
    assert set(frame["sentence1"]) == {"تېكىست"} and set(frame["lang1"]) == {"ug"}
    az = prepare_local(tmp_path, "kardes_sts", "az", "Kardes-NLU")
    assert frame["pair_id"].tolist() == az["pair_id"].tolist() == ["5", "6", "8"]


def test_uyghur_cyrillic_is_transliterated_by_umsc(tmp_path):
    """The real converter: every letter of the prepared text is in the Arabic block."""
    pytest.importorskip("umsc")
    frame = prepare_local(tmp_path, "kardes_sts", "ug", "Kardes-NLU")
    letters = [c for text in frame["sentence1"].tolist() + frame["sentence2"].tolist() for c in text if c.isalpha()]
    assert letters and all(0x0600 <= ord(c) <= 0x06FF or 0xFB50 <= ord(c) <= 0xFEFF for c in letters)


# --- bad inputs --------------------------------------------------------------------------------


def test_withheld_labels_name_file_and_column(tmp_path):
    with pytest.raises(InputError, match=r"esp/test-00000-of-00001\.parquet: column 'label' "
                                         r"\(normalised to 'score'\): 2 score\(s\) outside the "
                                         r"dataset's range \[0, 1\]"):
        ev.prepare_subset("str2024", "es", tmp_path / "es.parquet",
                          f"local:{FIXTURES / 'SemRel-SemRel2024'}")
    assert not (tmp_path / "es.parquet").exists()


def test_missing_column_names_file_and_column(tmp_path):
    folder = tmp_path / "de"
    folder.mkdir()
    pd.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]}).to_parquet(
        folder / "test-00000-of-00001.parquet")
    with pytest.raises(InputError, match=r"de/test-00000-of-00001\.parquet: missing column "
                                         r"'similarity_score'; columns found: 'sentence1', "
                                         r"'sentence2', 'score'"):
        ev.prepare_subset("stsb_multi_mt", "de", tmp_path / "out.parquet", f"local:{tmp_path}")


def test_missing_column_lists_alternative_layouts(tmp_path):
    path = tmp_path / "hau_test_with_labels.csv"
    path.write_text("PairID,Sentences,Score\nx,a,0.5\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"missing columns 'sentence1', 'sentence2', 'label' "
                                         r"\(or PairID, Text, Score\)"):
        ev.prepare_subset("str2024", "ha", tmp_path / "out.parquet", f"local:{path}")


@pytest.mark.parametrize("name,content", [("test.jsonl", ""), ("sts-test.tsv", ""),
                                          ("sts-test.tsv", "genre\tfilename\tyear\tid\tscore\t"
                                                           "sentence1\tsentence2\n")])
def test_empty_file_is_an_input_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    dataset = "sick" if name.endswith("jsonl") else "korsts"
    subset = "pl" if dataset == "sick" else "ko"
    with pytest.raises(InputError, match=rf"{name}: the file (is empty|holds no rows)"):
        ev.prepare_subset(dataset, subset, tmp_path / "out.parquet", f"local:{path}")


def test_bad_scores_and_empty_text_name_the_column(tmp_path):
    path = tmp_path / "sts-test.tsv"
    header = "genre\tfilename\tyear\tid\tscore\tsentence1\tsentence2\n"
    path.write_text(header + "g\tf\t2012\t1\tabc\tx\ty\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"sts-test\.tsv: column 'score': row 1 is not a number "
                                         r"\('abc'\)"):
        ev.prepare_subset("korsts", "ko", tmp_path / "out.parquet", f"local:{path}")
    path.write_text(header + "g\tf\t2012\t1\t2.0\tx\t \n", encoding="utf-8")
    with pytest.raises(InputError, match=r"sts-test\.tsv: column 'sentence2': row 1 is empty"):
        ev.prepare_subset("korsts", "ko", tmp_path / "out.parquet", f"local:{path}")
    path.write_text(header + "g\tf\t2012\t1\t7.5\tx\ty\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"outside the dataset's range \[0, 5\]"):
        ev.prepare_subset("korsts", "ko", tmp_path / "out.parquet", f"local:{path}")


def test_trailing_tabs_are_read_and_extra_fields_and_bad_bytes_are_named_by_line(tmp_path):
    """A trailing tab on every row read as a field made pandas take the first column for the index
    (every column shifted: 'score' held the first sentence); an extra field that holds text, or a
    byte that is not UTF-8, is named with its line."""
    path = tmp_path / "sts-test.tsv"
    header = "genre\tfilename\tyear\tid\tscore\tsentence1\tsentence2\n"
    path.write_text(header + "g\tf\t2012\t1\t2.5\t안녕하세요\t반갑습니다\t\ng\tf\t2012\t2\t4.0\tx\ty\t\n",
                    encoding="utf-8")
    ev.prepare_subset("korsts", "ko", tmp_path / "out.parquet", f"local:{path}")
    frame = pd.read_parquet(tmp_path / "out.parquet")
    assert frame["score"].tolist() == [2.5, 4.0] and frame["sentence1"].tolist()[0] == "안녕하세요"
    path.write_text(header + "g\tf\t2012\t1\t2.5\tx\ty\t\n" + "g\tf\t2012\t2\t4.0\tx\ty\tz\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"sts-test\.tsv: line 3: 8 tab-separated fields, but the header has 7"):
        ev.prepare_subset("korsts", "ko", tmp_path / "out2.parquet", f"local:{path}")
    path.write_bytes(header.encode() + "g\tf\t2012\t1\t2.5\tx\ty\n".encode() + b"g\tf\t2012\t2\t4.0\tca\xe9\ty\n")
    with pytest.raises(InputError, match=r"sts-test\.tsv: line 3: invalid UTF-8 at byte 17 of the line"):
        ev.prepare_subset("korsts", "ko", tmp_path / "out3.parquet", f"local:{path}")


def test_null_text_and_duplicate_ids(tmp_path):
    pd.DataFrame({"pair_ID": ["1", "2"], "sentence_A": ["a", None], "sentence_B": ["b", "c"],
                  "relatedness_score": [1.0, 2.0]}).to_json(tmp_path / "test.jsonl",
                                                            orient="records", lines=True)
    with pytest.raises(InputError, match=r"test\.jsonl: column 'sentence_A' \(normalised to "
                                         r"'sentence1'\): row 2 is empty or not text"):
        ev.prepare_subset("sick", "pl", tmp_path / "out.parquet", f"local:{tmp_path}")
    pd.DataFrame({"pair_ID": ["1", "1"], "sentence_A": ["a", "b"], "sentence_B": ["b", "c"],
                  "relatedness_score": [1.0, 2.0]}).to_json(tmp_path / "test.jsonl",
                                                            orient="records", lines=True)
    with pytest.raises(InputError, match=r"column 'pair_ID' \(normalised to 'pair_id'\): "
                                         r"duplicate id '1'"):
        ev.prepare_subset("sick", "pl", tmp_path / "out.parquet", f"local:{tmp_path}")


def test_no_data_file_lists_the_patterns(tmp_path):
    with pytest.raises(InputError, match=r"tatoeba/de: no data file in .* looked for "
                                         r"test/deu-eng\.jsonl\.gz"):
        ev.prepare_subset("tatoeba", "de", tmp_path / "out.parquet", f"local:{tmp_path}")


def test_unknown_subset_lists_the_subsets(tmp_path):
    with pytest.raises(InputError, match=r"'sts17' has no subset 'de-en'; its subsets: ar, en-ar"):
        ev.prepare_subset("sts17", "de-en", tmp_path / "x.parquet",
                          f"local:{FIXTURES / 'mteb-sts17-crosslingual-sts'}")


# --- sources -------------------------------------------------------------------------------


def test_check_source(tmp_path):
    assert ev.check_source("sts17", None) == ev.ResolvedSource("hf", None)
    assert ev.check_source("sts17", "hf:someone/sts17-mirror").location == "someone/sts17-mirror"
    pinned = ev.check_source("sts17", {"hf": "mteb/sts17-crosslingual-sts", "revision": "abc"})
    assert pinned.revision == "abc"
    assert ev.check_source("korsts", f"local:{tmp_path}").kind == "local"
    assert ev.check_source("sick", f"local:{tmp_path}/{{subset}}").kind == "local"
    assert ev.check_source("builtin_topics", "builtin").kind == "builtin"
    assert ev.check_source("builtin_topics", None).kind == "builtin"


@pytest.mark.parametrize("name,source,message", [
    ("sts17", "builtin", r"'sts17' has no built-in data"),
    ("builtin_parallel", "hf:x/y", r"is the built-in demo data"),
    ("kardes_sts", None, r"'kardes_sts' has no loadable Hub copy .*'local:PATH'"),
    ("korsts", "local:/nonexistent/korsts", r"local path '/nonexistent/korsts' does not exist"),
    ("sick", "local:/nonexistent/sick/{subset}", r"folder '/nonexistent/sick' does not exist"),
    ("sts17", "ftp:x", r"is not a source"),
])
def test_check_source_rejects(name, source, message):
    with pytest.raises(InputError, match=message):
        ev.check_source(name, source)


def test_subset_without_hub_copy_needs_local_files(tmp_path):
    with pytest.raises(InputError, match=r"sick/en has no loadable Hub copy"):
        ev.prepare_subset("sick", "en", tmp_path / "x.parquet")


# --- the Hub path, with load_dataset replaced --------------------------------------------------


class FakeHub:
    """Records load_dataset calls; answers from a dict {(repo, config): Dataset or DatasetDict}."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, path, name=None, **kwargs):
        self.calls.append({"path": path, "name": name, **kwargs})
        if (path, name) not in self.answers:
            raise ValueError(f"BuilderConfig '{name}' not found. Available: ['default']")
        answer = self.answers[(path, name)]
        if isinstance(answer, Exception):
            raise answer
        return answer


def from_file(path: Path) -> datasets.Dataset:
    """The Dataset load_dataset would give for a fixture file (JSON strings stay strings)."""
    if path.suffix == ".parquet":
        return datasets.Dataset.from_parquet(str(path))
    return datasets.Dataset.from_pandas(pd.read_json(path, lines=True, dtype=False),
                                        preserve_index=False)


def install(monkeypatch, answers) -> FakeHub:
    fake = FakeHub(answers)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    return fake


def test_hub_sts17_config_split_and_revision(tmp_path, monkeypatch):
    data = from_file(FIXTURES / "mteb-sts17-crosslingual-sts" / "test" / "en-de.jsonl.gz")
    fake = install(monkeypatch, {("mteb/sts17-crosslingual-sts", "en-de"): data})
    assert ev.prepare_subset("sts17", "en-de", tmp_path / "o.parquet", revision="faeb762") == 3
    assert fake.calls == [{"path": "mteb/sts17-crosslingual-sts", "name": "en-de",
                           "split": "test", "revision": "faeb762"}]
    local = prepare_local(tmp_path, "sts17", "en-de", "mteb-sts17-crosslingual-sts")
    pd.testing.assert_frame_equal(ev.read_subset(tmp_path / "o.parquet"), local)


def test_hub_default_config_filtered_by_lang_column(tmp_path, monkeypatch):
    frames = [pd.read_json(FIXTURES / "mteb-sts17-crosslingual-sts" / "test" / f"{c}.jsonl.gz",
                           lines=True) for c in ("en-de", "ko-ko")]
    merged = datasets.Dataset.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False)
    fake = install(monkeypatch, {("mteb/sts17-crosslingual-sts", None): merged})
    assert ev.prepare_subset("sts17", "ko", tmp_path / "o.parquet") == 3
    assert [c["name"] for c in fake.calls] == ["ko-ko", None]
    assert set(ev.read_subset(tmp_path / "o.parquet")["lang1"]) == {"ko"}


@pytest.mark.parametrize("name,subset,repo,config,split,fixture", [
    ("stsb_multi_mt", "de", "PhilipMay/stsb_multi_mt", "de", "test",
     "PhilipMay-stsb_multi_mt/de/test-00000-of-00001.parquet"),
    ("str2024", "en", "SemRel/SemRel2024", "eng", "test",
     "SemRel-SemRel2024/eng/test-00000-of-00001.parquet"),
    ("sick", "nl", "maximedb/sick_nl", None, "test",
     "maximedb-sick_nl/data/test-00000-of-00001.parquet"),
    ("sick", "pl", "sdadas/sick_pl", None, "test", "sdadas-sick_pl/test.jsonl"),
    ("tatoeba", "de", "mteb/tatoeba-bitext-mining", "deu-eng", "test",
     "mteb-tatoeba-bitext-mining/test/deu-eng.jsonl.gz"),
    ("flores", "de", "openlanguagedata/flores_plus", "deu_Latn", "devtest",
     "openlanguagedata-flores_plus/devtest/deu_Latn.parquet"),
])
def test_hub_loads_each_dataset(tmp_path, monkeypatch, name, subset, repo, config, split, fixture):
    fake = install(monkeypatch, {(repo, config): from_file(FIXTURES / fixture)})
    rows = ev.prepare_subset(name, subset, tmp_path / "hub.parquet")
    assert fake.calls == [{"path": repo, "name": config, "split": split, "revision": None}]
    assert all("trust_remote_code" not in call for call in fake.calls)
    folder = fixture.split("/")[0]
    local = prepare_local(tmp_path, name, subset, folder)
    assert rows == len(local)
    hub = ev.read_subset(tmp_path / "hub.parquet")
    pd.testing.assert_frame_equal(hub, local)


def test_hub_classification_reads_every_split(tmp_path, monkeypatch):
    root = FIXTURES / "Davlan-sib200" / "deu_Latn"
    splits = datasets.DatasetDict({s: from_file(root / f"{s}-00000-of-00001.parquet")
                                   for s in ("train", "validation", "test")})
    fake = install(monkeypatch, {("Davlan/sib200", "deu_Latn"): splits})
    assert ev.prepare_subset("sib200", "de", tmp_path / "hub.parquet") == 5
    assert fake.calls == [{"path": "Davlan/sib200", "name": "deu_Latn", "split": None,
                           "revision": None}]
    hub = ev.read_subset(tmp_path / "hub.parquet")
    pd.testing.assert_frame_equal(hub, prepare_local(tmp_path, "sib200", "de", "Davlan-sib200"))


def test_hub_class_labels_become_names(tmp_path, monkeypatch):
    features = datasets.Features({"index_id": datasets.Value("int64"), "text": datasets.Value("string"),
                                  "category": datasets.ClassLabel(names=["health", "travel"])})
    part = datasets.Dataset.from_dict({"index_id": [1, 2], "text": ["Kot śpi.", "Pies śpi."],
                                       "category": [1, 0]}, features=features)
    install(monkeypatch, {("mteb/sib200", "pol_Latn"): datasets.DatasetDict(
        {"train": part, "dev": part.map(lambda r: {"index_id": r["index_id"] + 10}),
         "test": part.map(lambda r: {"index_id": r["index_id"] + 20})})})
    ev.prepare_subset("sib200", "pl", tmp_path / "o.parquet", "hf:mteb/sib200")
    frame = ev.read_subset(tmp_path / "o.parquet")
    assert frame["label"].tolist() == ["travel", "health"] * 3
    assert frame["split"].tolist() == ["train"] * 2 + ["dev"] * 2 + ["test"] * 2


def test_hub_tries_the_next_config(tmp_path, monkeypatch):
    data = from_file(FIXTURES / "openlanguagedata-flores_plus" / "devtest" / "deu_Latn.parquet")
    fake = install(monkeypatch, {("openlanguagedata/flores_plus", "cmn_Hans"): data})
    ev.prepare_subset("flores", "zh", tmp_path / "o.parquet")
    assert [c["name"] for c in fake.calls] == ["zho_Hans", "cmn_Hans"]


def test_hub_missing_config_and_gated_dataset(tmp_path, monkeypatch):
    from datasets.exceptions import DatasetNotFoundError

    install(monkeypatch, {})
    with pytest.raises(InputError, match=r"hf:openlanguagedata/flores_plus has none of the "
                                         r"configs 'zho_Hans', 'cmn_Hans'"):
        ev.prepare_subset("flores", "zh", tmp_path / "o.parquet")
    gated = DatasetNotFoundError("Dataset 'openlanguagedata/flores_plus' is a gated dataset")
    install(monkeypatch, {("openlanguagedata/flores_plus", "deu_Latn"): gated})
    with pytest.raises(InputError, match=r"gated dataset .*HF_TOKEN"):
        ev.prepare_subset("flores", "de", tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists()


def test_hub_withheld_spanish_labels(tmp_path, monkeypatch):
    data = from_file(FIXTURES / "SemRel-SemRel2024" / "esp" / "test-00000-of-00001.parquet")
    install(monkeypatch, {("SemRel/SemRel2024", "esp"): data})
    with pytest.raises(InputError, match=r"hf:SemRel/SemRel2024 \(config esp, split test\): "
                                         r"column 'label' \(normalised to 'score'\)"):
        ev.prepare_subset("str2024", "es", tmp_path / "o.parquet")


# --- built-in datasets and read_subset -----------------------------------------------------


def test_builtin_datasets_match_the_builtin_rules(tmp_path):
    from modsent.sources import prepare_builtin_eval

    for name, task in (("builtin_parallel", "parallel"), ("builtin_topics", "classification"),
                       ("builtin_paraphrase", "paraphrase")):
        count = ev.prepare_subset(name, "de", tmp_path / f"{name}.parquet", "builtin")
        prepare_builtin_eval(task, "de", tmp_path / f"{task}-rule.parquet")
        ours = ev.read_subset(tmp_path / f"{name}.parquet")
        rule = pd.read_parquet(tmp_path / f"{task}-rule.parquet")
        assert count == len(rule) > 0
        assert tuple(ours.columns) == ev.KIND_COLUMNS[ev.get(name).kind]
        pd.testing.assert_frame_equal(ours, rule, check_dtype=False)


def test_read_subset_rejects_unknown_schemas_and_bad_rows(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        ev.read_subset(tmp_path / "missing.parquet")
    pd.DataFrame({"id": ["1"], "sentence": ["x"]}).to_parquet(tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"a\.parquet: columns id, sentence match no evaluation "
                                         r"schema \(pairs: pair_id"):
        ev.read_subset(tmp_path / "a.parquet")
    pd.DataFrame({"id": ["1", "2"], "text": ["x", ""]}).to_parquet(tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"b\.parquet: column 'text': row 2 is empty"):
        ev.read_subset(tmp_path / "b.parquet")
    pd.DataFrame({"id": ["1"], "text": ["x"], "label": ["y"], "split": ["validation"]}).to_parquet(
        tmp_path / "c.parquet")
    with pytest.raises(InputError, match=r"c\.parquet: column 'split': unknown split"):
        ev.read_subset(tmp_path / "c.parquet")
    pd.DataFrame({"pair_id": ["1"], "lang1": ["xx"], "lang2": ["en"], "sentence1": ["a"],
                  "sentence2": ["b"], "score": [1.0]}).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(InputError, match=r"d\.parquet: column 'lang1': 'xx' is not"):
        ev.read_subset(tmp_path / "d.parquet")
    (tmp_path / "e.parquet").write_text("not parquet")
    with pytest.raises(InputError, match=r"e\.parquet: not a readable parquet file"):
        ev.read_subset(tmp_path / "e.parquet")


def test_output_is_written_atomically(tmp_path):
    out = tmp_path / "deep" / "sts17" / "en-de.parquet"
    ev.prepare_subset("sts17", "en-de", out, f"local:{FIXTURES / 'mteb-sts17-crosslingual-sts'}")
    assert [p.name for p in out.parent.iterdir()] == ["en-de.parquet"]


def test_subsets_without_a_hub_copy_count_as_missing_unless_local(tmp_path):
    """SICK en/es have no loadable Hub copy: from the Hub they are missing languages; with
    local files they are subsets like the others."""
    assert ev.subsets("sick", ["en", "es", "nl", "pl"]) == (["nl", "pl"], ["en", "es"])
    local, missing = ev.subsets("sick", ["en", "es", "nl", "pl"], f"local:{tmp_path}")
    assert sorted(local) == ["en", "es", "nl", "pl"] and missing == []
