"""Tests of modsent.sources: local files, the Hub catalog (on fixtures laid out like the Hub),
corpus cleaning and the paraphrase-pairs contract."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the fixtures are local; nothing may go online

from modsent.io import InputError  # noqa: E402
from modsent.sources import corpus, hub, local, paraphrase  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "hub"

LOCATIONS = {
    "cc100": "statmt-cc-100",
    "cc100-parquet-export": "statmt-cc100-refs-convert-parquet",
    "madlad-400": "allenai-MADLAD-400",
    "mnli": "nyu-mll-multi_nli",
    "snli": "stanfordnlp-snli",
    "sentence-compression": "sentence-transformers-embedding-training-data",
    "simple-wiki": "sentence-transformers-embedding-training-data",
    "altlex": "sentence-transformers-embedding-training-data",
    "quora-duplicates": "sentence-transformers-embedding-training-data",
    "quora-duplicates-triplets": "sentence-transformers-embedding-training-data",
    "st-sentence-compression": "sentence-transformers-sentence-compression",
    "st-simple-wiki": "sentence-transformers-simple-wiki",
    "st-altlex": "sentence-transformers-altlex",
    "st-quora-duplicates": "sentence-transformers-quora-duplicates",
    "st-quora-duplicates-triplets": "sentence-transformers-quora-duplicates",
}

# Real sentences, copied from Django 5.2's catalogs (BSD-3-Clause) and the Zen of Python.
DE_NO_FILE = "Es wurde keine Datei übertragen. Überprüfen Sie das Encoding des Formulars."
ZH_BAD_IMAGE = "请上传一张有效的图片。您所上传的文件不是图片或者是已损坏的图片。"
HI_NO_FILE = "कोई संचिका निवेदित नहीं हुई । कृपया कूटलेखन की जाँच करें ।"
UR_NO_FILE = "کوئی فائل پیش نہیں کی گئی۔ فارم پر اینکوڈنگ کی قسم چیک کریں۔"
HY_NO_HISTORY = "Այս օբյեկտը չունի փոփոխման պատմություն։ Այն հավանաբար ավելացված չէ ադմինիստրավորման էջից։"
AR_TWO = "أدخِل عنوان بريد إلكتروني صحيح. احذفه؟"  # two Django ar strings ("Enter a valid email address.", "Delete?")
JA_BAD_CHOICE = "正しく選択してください。選択したものは候補にありません。"
EL_TWO = "Εισάγετε έναν έγκυρο ακέραιο. Είστε σίγουρος;"  # Greek ';' is a question mark


def fixture(name: str) -> hub.HubDataset:
    return hub.with_location(hub.CATALOG[name], FIXTURES / LOCATIONS[name])


# --- local files ---------------------------------------------------------------------------


def test_local_txt_one_record_per_nonblank_line(tmp_path):
    path = tmp_path / "de.txt"
    path.write_text(f"{DE_NO_FILE}\n\n  \nZweite Zeile.\n", encoding="utf-8")
    assert list(local.iter_local_records(path)) == [{"text": DE_NO_FILE}, {"text": "Zweite Zeile."}]


def test_local_tsv_header_and_column_mapping(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("id\tcontent\tother\n1\tErrors should never pass silently.\tx\n2\tReadability counts.\ty\n")
    records = list(local.iter_local_records(path, columns={"text": "content"}))
    assert records == [{"text": "Errors should never pass silently."}, {"text": "Readability counts."}]
    whole = list(local.iter_local_records(path))
    assert whole[0] == {"id": "1", "content": "Errors should never pass silently.", "other": "x"}


def test_local_tsv_wrong_field_count_names_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a\tb\n1\t2\n3\n")
    with pytest.raises(InputError, match=r"bad\.tsv: line 3: 1 tab-separated fields"):
        list(local.iter_local_records(path))


def test_local_jsonl_and_jsonl_gz(tmp_path):
    rows = [{"content": "Beautiful is better than ugly.", "n": 1}, {"content": "Flat is better than nested.", "n": 2}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "a.jsonl").write_text(text)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(text)
    for name in ("a.jsonl", "a.jsonl.gz"):
        got = list(local.iter_local_records(tmp_path / name, columns={"text": "content"}))
        assert got == [{"text": r["content"]} for r in rows]


def test_local_parquet(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["Readability counts.", None], "n": [1, 2]}), path)
    assert list(local.iter_local_records(path, columns={"text": "content"})) == [
        {"text": "Readability counts."},
        {"text": None},
    ]
    assert list(local.iter_local_records(path))[0] == {"content": "Readability counts.", "n": 1}


def test_local_format_inference_and_override(tmp_path):
    assert local.infer_format("x/y.JSONL.GZ") == "jsonl.gz"
    assert local.infer_format("y.parquet") == "parquet"
    with pytest.raises(InputError, match="cannot tell the format"):
        local.infer_format("y.csv")
    path = tmp_path / "lines.data"
    path.write_text("Readability counts.\n")
    assert list(local.iter_local_records(path, format="txt")) == [{"text": "Readability counts."}]
    with pytest.raises(InputError, match="unknown format 'csv'"):
        list(local.iter_local_records(path, format="csv"))


@pytest.mark.parametrize(
    "name, content",
    [
        ("a.tsv", "id\tbody\n1\tx\n"),
        ("a.jsonl", '{"id": 1, "body": "x"}\n'),
        ("a.parquet", None),
        ("a.txt", "x\n"),
    ],
)
def test_local_missing_column_names_file_column_and_found(tmp_path, name, content):
    path = tmp_path / name
    if content is None:
        pq.write_table(pa.table({"id": [1], "body": ["x"]}), path)
    else:
        path.write_text(content)
    with pytest.raises(InputError) as err:
        list(local.iter_local_records(path, columns={"text": "content"}))
    message = str(err.value)
    assert str(path) in message and "'content'" in message and "columns found" in message
    assert ("'body'" in message) or ("'text'" in message)


@pytest.mark.parametrize("name", ["bad.txt", "bad.tsv", "bad.jsonl", "bad.jsonl.gz"])
def test_local_invalid_utf8_names_file_and_line(tmp_path, name):
    lines = [b'{"text": "fine"}\n', b'{"text": "caf\xe9"}\n'] if "jsonl" in name else [b"text\n", b"caf\xe9\n"]
    data = b"".join(lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(InputError, match=rf"{name}: line 2: invalid UTF-8"):
        list(local.iter_local_records(path))


@pytest.mark.parametrize(
    "name, content", [("e.txt", "\n \n"), ("e.tsv", "text\n"), ("e.jsonl", ""), ("e.jsonl.gz", b"")]
)
def test_local_empty_source_names_file(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(gzip.compress(content))
    else:
        path.write_text(content)
    with pytest.raises(InputError, match=rf"{name}: the file holds no records"):
        list(local.iter_local_records(path))


def test_local_bad_json_and_non_objects(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(InputError, match=r"x\.jsonl: line 2: invalid JSON"):
        list(local.iter_local_records(path))
    path.write_text('["a", "b"]\n')
    with pytest.raises(InputError, match=r"line 1: expected a JSON object"):
        list(local.iter_local_records(path))


def test_local_missing_file_and_bad_parquet(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        list(local.iter_local_records(tmp_path / "nope.txt"))
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(InputError, match="not a readable parquet file"):
        list(local.iter_local_records(path))


# --- the Hub catalog -----------------------------------------------------------------------


def test_every_catalog_entry_has_a_fixture():
    assert set(LOCATIONS) == set(hub.CATALOG)
    for name, definition in hub.CATALOG.items():
        assert definition.evidence, name
        assert (FIXTURES / LOCATIONS[name]).is_dir()


@pytest.mark.parametrize("name", sorted(hub.CATALOG))
def test_every_definition_loads_its_fixture(name):
    definition = fixture(name)
    lang = "de" if definition.per_language else None
    records = list(hub.iter_hub_records(definition, lang=lang))
    assert records, name
    expected = set(hub.KIND_COLUMNS[definition.kind])
    for record in records:
        assert set(record) == expected
        assert all(isinstance(value, str) and value for value in record.values())


@pytest.mark.parametrize("name", ["mnli", "snli", "st-quora-duplicates-triplets", "cc100", "madlad-400", "altlex"])
def test_non_streaming_load_gives_the_same_records(name, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    definition = fixture(name)
    lang = "de" if definition.per_language else None
    records = list(hub.iter_hub_records(definition, lang=lang, streaming=False))
    assert records and records == list(hub.iter_hub_records(definition, lang=lang))


def test_cc100_documents_and_language_codes():
    definition = fixture("cc100")
    assert hub.CC100.source_codes("zh") == ("zh-Hans",)
    assert hub.CC100.source_codes("zh-Hant") == ("zh-Hant",)
    assert hub.CC100.source_codes("nso") == ("ns",)
    docs = list(hub.iter_hub_records(definition, lang="de"))
    assert docs[0]["text"].split("\n")[0] == DE_NO_FILE  # paragraphs of a document: one a line
    assert len(docs) == 4  # documents are separated by blank lines
    zh = list(hub.iter_hub_records(definition, lang="zh"))
    assert ZH_BAD_IMAGE in zh[0]["text"].split("\n")
    assert len(list(hub.iter_hub_records(definition, lang="de", limit=2))) == 2


def test_cc100_parquet_export_rows_are_lines():
    rows = [r["text"] for r in hub.iter_hub_records(fixture("cc100-parquet-export"), lang="de")]
    assert rows[0] == DE_NO_FILE + "\n"
    assert "\n" in rows  # the document separator row


def test_missing_language_fails_before_any_work(monkeypatch):
    import datasets

    def no_loading(*args, **kwargs):
        raise AssertionError("load_dataset must not be called")

    monkeypatch.setattr(datasets, "load_dataset", no_loading)
    nowhere = hub.with_location(hub.CC100, "/nonexistent/cc-100")
    with pytest.raises(InputError, match=r"language 'mt' is not available in source 'cc100'"):
        hub.iter_hub_records(nowhere, lang="mt")  # raises at the call, not on iteration
    with pytest.raises(InputError, match="a language code is required"):
        hub.iter_hub_records(nowhere)
    with pytest.raises(InputError, match=r"language 'de' is not available in source 'altlex': it is English only"):
        hub.iter_hub_records(hub.CATALOG["altlex"], lang="de")


def test_madlad_reads_clean_shards_and_restores_line_breaks():
    docs = [r["text"] for r in hub.iter_hub_records(fixture("madlad-400"), lang="de")]
    assert docs[0] == DE_NO_FILE + "\nBitte ein gültiges Bild hochladen. Die hochgeladene Datei ist kein Bild oder ist defekt."
    assert not any("\\n" in d for d in docs)
    assert not any("gültiges Datum" in d for d in docs)  # that text is only in the noisy shard


def test_madlad_unknown_language_names_language_and_source():
    with pytest.raises(InputError, match=r"language 'xx' is not available in source 'madlad-400'.*'xx'"):
        list(hub.iter_hub_records(fixture("madlad-400"), lang="xx"))


def test_madlad_tries_each_candidate_code(tmp_path):
    # Hebrew may be 'he' or 'iw' in MADLAD-400's folders: the loader tries both.
    repo = tmp_path / "MADLAD-400"
    shutil.copytree(FIXTURES / "allenai-MADLAD-400", repo)
    (repo / "data" / "iw").mkdir()
    shard = repo / "data" / "de" / "de_clean_0000.jsonl.gz"
    shutil.copy(shard, repo / "data" / "iw" / "iw_clean_0000.jsonl.gz")
    docs = list(hub.iter_hub_records(hub.with_location(hub.MADLAD400, repo), lang="he"))
    assert docs and docs[0]["text"].startswith(DE_NO_FILE)


def test_mnli_one_triplet_per_premise_in_file_order():
    triplets = list(hub.iter_hub_records(fixture("mnli")))
    assert triplets == [
        {
            "anchor": "Errors should never pass silently.",
            "positive": "Explicit is better than implicit.",
            "negative": "Unless explicitly silenced.",
        },
        {
            "anchor": "Beautiful is better than ugly.",
            "positive": "Simple is better than complex.",
            "negative": "Flat is better than nested.",
        },
        {
            "anchor": "In the face of ambiguity, refuse the temptation to guess.",
            "positive": "There should be one-- and preferably only one --obvious way to do it.",
            "negative": "Although practicality beats purity.",
        },
    ]


def test_snli_one_triplet_per_premise_without_the_rows_of_no_gold_label():
    """stanfordnlp/snli's parquet layout (config plain_text): label -1 (no gold label) and neutral rows
    are skipped, a premise without a contradiction gives no triplet."""
    triplets = list(hub.iter_hub_records(fixture("snli")))
    assert triplets == [
        {
            "anchor": "Namespaces are one honking great idea -- let's do more of those!",
            "positive": "If the implementation is easy to explain, it may be a good idea.",
            "negative": "If the implementation is hard to explain, it's a bad idea.",
        },
        {
            "anchor": "Now is better than never.",
            "positive": "Complex is better than complicated.",
            "negative": "Although never is often better than *right* now.",
        },
    ]
    frame = paraphrase.read_hub_pairs(fixture("snli"))
    assert list(frame["dataset"]) == ["snli", "snli"] and frame["negative"].notna().all()


def test_missing_column_names_source_column_and_found():
    import dataclasses

    definition = dataclasses.replace(fixture("st-altlex"), columns={"anchor": "sentence1", "positive": "simplified"})
    expected = r"source 'st-altlex': missing column\(s\) 'sentence1'; columns found: 'text', 'simplified'"
    with pytest.raises(InputError, match=expected):
        list(hub.iter_hub_records(definition))


def test_catalog_lookup_and_hub_paths():
    assert hub.get_definition("mnli") is hub.MNLI
    with pytest.raises(InputError, match="unknown Hub source 'nope'; known sources:"):
        hub.get_definition("nope")
    assert hub._files_root(hub.MADLAD400, None) == "hf://datasets/allenai/MADLAD-400"
    assert (
        hub._files_root(hub.CC100_PARQUET_EXPORT, "refs/convert/parquet")
        == "hf://datasets/statmt/cc100@refs%2Fconvert%2Fparquet"
    )
    assert hub._files_root(hub.CC100, None) == "https://data.statmt.org/cc-100"
    for name in hub.PAPER_PARAPHRASE_DATASETS:
        assert hub.CATALOG[name].kind in ("pairs", "triplets")


def test_json_line_formats(tmp_path):
    # embedding-training-data also ships {"set": [...]} and {"query", "pos", "neg"} lines.
    repo = tmp_path / "etd"
    repo.mkdir()
    lines = [
        json.dumps({"set": ["Readability counts.", "Sparse is better than dense.", "Flat is better than nested."]}),
        json.dumps({"query": "Forgotten your login credentials?", "pos": ["Delete?"], "neg": ["Log out"]}),
    ]
    (repo / "x.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    import dataclasses

    pairs = dataclasses.replace(hub.ETD_ALTLEX, repo_id=str(repo), data_files="x.jsonl.gz")
    assert list(hub.iter_hub_records(pairs)) == [
        {"anchor": "Readability counts.", "positive": "Sparse is better than dense."},
        {"anchor": "Forgotten your login credentials?", "positive": "Delete?"},
    ]
    (repo / "bad.jsonl.gz").write_bytes(gzip.compress(b'["only one"]\n'))
    bad = dataclasses.replace(pairs, data_files="bad.jsonl.gz")
    with pytest.raises(InputError, match="line 1: expected"):
        list(hub.iter_hub_records(bad))


# --- corpus --------------------------------------------------------------------------------


def test_normalise_text():
    assert corpus.normalise_text("  Readability\u00a0\u00a0counts.\t\u3000 ") == "Readability counts."
    assert corpus.normalise_text("\ufeffe\u0301\x00") == "é"  # NFC, BOM and NUL removed
    assert corpus.normalise_text("می\u200cخواهم") == "می\u200cخواهم"  # ZWNJ kept


@pytest.mark.parametrize(
    "lang, text, expected",
    [
        ("en", "Dr. Smith arrived at 5 p.m. on Jan. 3. He left! Did he? Yes… really.",
         ["Dr. Smith arrived at 5 p.m. on Jan. 3.", "He left!", "Did he?", "Yes… really."]),
        ("en", "See e.g. the docs. J. R. R. Tolkien wrote it. Item No. 5 is here.",
         ["See e.g. the docs.", "J. R. R. Tolkien wrote it.", "Item No. 5 is here."]),
        ("en", "Version 3.14 is out. Visit example.com today.", ["Version 3.14 is out.", "Visit example.com today."]),
        ("en", 'He said "Go." Then he went...', ['He said "Go."', "Then he went..."]),
        ("de", DE_NO_FILE, ["Es wurde keine Datei übertragen.", "Überprüfen Sie das Encoding des Formulars."]),
        ("de", "Das ist z. B. am 3. Oktober so. Nr. 2 folgt.", ["Das ist z. B. am 3. Oktober so.", "Nr. 2 folgt."]),
        ("zh", ZH_BAD_IMAGE, ["请上传一张有效的图片。", "您所上传的文件不是图片或者是已损坏的图片。"]),
        ("ja", JA_BAD_CHOICE, ["正しく選択してください。", "選択したものは候補にありません。"]),
        ("hi", HI_NO_FILE, ["कोई संचिका निवेदित नहीं हुई ।", "कृपया कूटलेखन की जाँच करें ।"]),
        ("ur", UR_NO_FILE, ["کوئی فائل پیش نہیں کی گئی۔", "فارم پر اینکوڈنگ کی قسم چیک کریں۔"]),
        ("ar", AR_TWO, ["أدخِل عنوان بريد إلكتروني صحيح.", "احذفه؟"]),
        ("hy", HY_NO_HISTORY, ["Այս օբյեկտը չունի փոփոխման պատմություն։", "Այն հավանաբար ավելացված չէ ադմինիստրավորման էջից։"]),
        ("el", EL_TWO, ["Εισάγετε έναν έγκυρο ακέραιο.", "Είστε σίγουρος;"]),
        # The Ethiopic full stop (U+1362), after two Amharic weekday names from glibc's am_ET locale.
        ("am", "እሑድ። ሰኞ።", ["እሑድ።", "ሰኞ።"]),
        ("en", "No terminator here", ["No terminator here"]),
        ("en", "   ", []),
    ],
)
def test_split_sentences(lang, text, expected):
    assert corpus.split_sentences(text, lang) == expected


def test_build_corpus_cleans_dedups_filters_and_caps():
    records = [
        {"text": f"{DE_NO_FILE}\nIhr Passwort wurde zurückgesetzt. Sie können sich nun anmelden."},
        {"text": f"  Es  wurde keine Datei übertragen.\n{DE_NO_FILE}"},  # duplicates after normalising
        {"text": None},
        "Löschen?",
        {"text": "Erforderlich. 150 Zeichen oder weniger."},
    ]
    stats: dict = {}
    got = corpus.build_corpus(records, None, 14, 40, True, "de", stats=stats)
    assert got == [
        "Es wurde keine Datei übertragen.",
        "Ihr Passwort wurde zurückgesetzt.",
        "Sie können sich nun anmelden.",
        "150 Zeichen oder weniger.",
    ]
    # "Überprüfen Sie das Encoding des Formulars." is 42 characters: too long for max_chars=40
    assert stats["too_long"] == 2 and stats["too_short"] == 2 and stats["duplicates"] == 2
    assert stats["kept"] == 4 and stats["records"] == 5


def test_build_corpus_stops_reading_at_the_cap():
    consumed = []

    def records():
        for i, line in enumerate(["Beautiful is better than ugly.", "Flat is better than nested.", "Readability counts."]):
            consumed.append(i)
            yield line

    assert corpus.build_corpus(records(), 2, 1, 100, False, "en") == [
        "Beautiful is better than ugly.",
        "Flat is better than nested.",
    ]
    assert consumed == [0, 1]


def test_build_corpus_without_splitting_keeps_records_whole():
    got = corpus.build_corpus([f"{DE_NO_FILE}\n"], None, 1, 200, False, "de")
    assert got == [DE_NO_FILE]


def test_build_corpus_bad_input():
    with pytest.raises(InputError, match="record 1: no 'text' field"):
        corpus.build_corpus([{"body": "x"}], None, 1, 10, True, "en", source="s")
    with pytest.raises(InputError, match="'text' must be a string, got int"):
        corpus.build_corpus([{"text": 3}], None, 1, 10, True, "en")
    with pytest.raises(InputError, match="max_sentences"):
        corpus.build_corpus([], 0, 1, 10, True, "en")
    with pytest.raises(InputError, match="min_chars"):
        corpus.build_corpus([], None, 20, 10, True, "en")
    with pytest.raises(InputError, match="unknown sentence splitter"):
        corpus.build_corpus([], None, 1, 10, True, "en", splitter="nltk")


def test_several_sources_interleave_one_kept_sentence_each_in_turn_and_share_the_cap():
    read = {"a": 0, "b": 0}

    def records(name, items):
        for item in items:
            read[name] += 1
            yield item

    a = ["Beautiful is better than ugly. Explicit is better than implicit.", "Simple is better than complex."]
    b = ["Explicit is better than implicit.", "Flat is better than nested.", "Sparse is better than dense.",
         "Readability counts.", "Errors should never pass silently."]
    stats: dict = {}
    got = list(corpus.iter_corpus([(records("a", a), True, "a"), (records("b", b), False, "b")], 5, 1, 100, "en",
                                  stats=stats))
    # a's first document gives two sentences: its second, in a's second turn, is b's first, a
    # duplicate, so a reads on to its next kept sentence; the cap counts both sources
    assert got == ["Beautiful is better than ugly.", "Explicit is better than implicit.",
                   "Simple is better than complex.", "Flat is better than nested.", "Sparse is better than dense."]
    assert stats["duplicates"] == 1 and stats["kept"] == 5 and stats["candidates"] == 6
    assert stats["kept a"] == 2 and stats["kept b"] == 3
    assert read == {"a": 2, "b": 3}  # nothing read past the cap
    # once a runs out, b goes on alone
    rest = list(corpus.iter_corpus([(a, True, "a"), (b, False, "b")], None, 1, 100, "en"))
    assert rest[5:] == ["Readability counts.", "Errors should never pass silently."]
    # a candidate too short does not cost its source the turn either
    short = list(corpus.iter_corpus([(["Tiny.", "Now is better than never."], False, "a"),
                                     (["Namespaces are one honking great idea."], False, "b")], None, 10, 100, "en"))
    assert short == ["Now is better than never.", "Namespaces are one honking great idea."]


def test_one_source_in_the_list_form_is_build_corpus():
    records = [f"{DE_NO_FILE}\nIhr Passwort wurde zurückgesetzt. Sie können sich nun anmelden.", "Löschen?"]
    assert list(corpus.iter_corpus([(records, True, "s")], None, 5, 200, "de")) == \
        corpus.build_corpus(records, None, 5, 200, True, "de")


def test_sentencex_splitter_is_optional():
    try:
        import sentencex  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="needs the sentencex package"):
            corpus.build_corpus(["x"], None, 1, 10, True, "en", splitter="sentencex")
    else:
        got = corpus.build_corpus([ZH_BAD_IMAGE], None, 1, 100, True, "zh", splitter="sentencex")
        assert got == ["请上传一张有效的图片。", "您所上传的文件不是图片或者是已损坏的图片。"]


def test_corpus_from_hub_fixture_end_to_end(tmp_path):
    records = hub.iter_hub_records(fixture("cc100"), lang="de")
    sentences = corpus.build_corpus(records, 100, 5, 200, True, "de")
    assert sentences[:2] == ["Es wurde keine Datei übertragen.", "Überprüfen Sie das Encoding des Formulars."]
    assert len(sentences) == len(set(sentences))
    path = tmp_path / "resources" / "corpora" / "de.txt"
    assert corpus.write_corpus(sentences, path, source="cc100:de") == len(sentences)
    assert path.read_text(encoding="utf-8").splitlines() == sentences
    assert path.read_bytes().endswith(b".\n")


def test_write_corpus_empty_and_bad_sentences(tmp_path):
    path = tmp_path / "de.txt"
    with pytest.raises(InputError, match="madlad-400:de: no sentences survived cleaning"):
        corpus.write_corpus([], path, source="madlad-400:de")
    assert not path.exists() and not list(tmp_path.iterdir())  # no partial or temporary file left
    with pytest.raises(InputError, match="sentence 2 contains a line break"):
        corpus.write_corpus(["a", "b\nc"], path)
    assert not path.exists()


# --- paraphrase pairs ----------------------------------------------------------------------

ZEN_PAIRS = [
    {"anchor": "Errors should never pass silently.", "positive": "Unless explicitly silenced."},
    {"anchor": "Now is better than never.", "positive": "Although never is often better than *right* now."},
    {"anchor": "Beautiful is better than ugly.", "positive": "Simple is better than complex.",
     "negative": "Flat is better than nested."},
]


def test_pair_ids_are_stable_content_hashes():
    first = paraphrase.pairs_frame(ZEN_PAIRS, "altlex")
    again = paraphrase.pairs_frame(list(reversed(ZEN_PAIRS)), "altlex")
    assert dict(zip(first.anchor, first.pair_id)) == dict(zip(again.anchor, again.pair_id))
    assert first.pair_id.iloc[0] == paraphrase.make_pair_id(
        "altlex", "Errors should never pass silently.", "Unless explicitly silenced.", None
    )
    other = paraphrase.pairs_frame(ZEN_PAIRS, "simple-wiki")
    assert set(first.pair_id).isdisjoint(other.pair_id)  # the dataset is part of the id
    assert list(first.columns) == list(paraphrase.PAIR_COLUMNS)
    assert first.negative.isna().tolist() == [True, True, False]


def test_pairs_frame_drops_duplicates_empty_and_identical():
    records = ZEN_PAIRS + [
        {"anchor": " Errors  should never pass silently. ", "positive": "Unless explicitly silenced."},
        {"anchor": "Readability counts.", "positive": "Readability counts."},
        {"anchor": "", "positive": "Readability counts."},
    ]
    assert len(paraphrase.pairs_frame(records, "altlex")) == 3
    with pytest.raises(InputError, match="record 1: missing field"):
        paraphrase.pairs_frame([{"anchor": "x"}], "altlex")


def test_cap_pairs_is_seeded_and_order_independent():
    records = [{"anchor": f"{a} ({i})", "positive": b} for i in range(20)
               for a, b in [("Readability counts.", "Sparse is better than dense.")]]
    frame = paraphrase.pairs_frame(records, "altlex")
    shuffled = frame.sample(frac=1, random_state=7)
    small = paraphrase.cap_pairs(frame, 5, seed=1)
    assert set(small.pair_id) == set(paraphrase.cap_pairs(shuffled, 5, seed=1).pair_id)
    assert list(small.pair_id) == [p for p in frame.pair_id if p in set(small.pair_id)]  # input order kept
    assert set(small.pair_id) <= set(paraphrase.cap_pairs(frame, 8, seed=1).pair_id)
    assert set(small.pair_id) != set(paraphrase.cap_pairs(frame, 5, seed=2).pair_id)
    assert len(paraphrase.cap_pairs(frame, None)) == 20
    with pytest.raises(InputError, match="max_pairs"):
        paraphrase.cap_pairs(frame, -1)


def test_write_and_read_pairs(tmp_path):
    frame = paraphrase.pairs_frame(ZEN_PAIRS, "mnli")
    path = tmp_path / "en.parquet"
    assert paraphrase.write_pairs(frame, path) == 3
    schema = pq.read_schema(path)
    assert schema.names == list(paraphrase.PAIR_COLUMNS)
    assert all(field.type == pa.string() for field in schema)
    assert not schema.field("anchor").nullable and schema.field("negative").nullable
    back = paraphrase.read_pairs(path)
    pd.testing.assert_frame_equal(back, frame)
    with pytest.raises(InputError, match="no pairs to write"):
        paraphrase.write_pairs(frame.iloc[:0], tmp_path / "empty.parquet")
    with pytest.raises(InputError, match="appears more than once"):
        paraphrase.write_pairs(pd.concat([frame, frame]), tmp_path / "dup.parquet")
    with pytest.raises(InputError, match="lack column"):
        paraphrase.write_pairs(frame.drop(columns="negative"), tmp_path / "x.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["en.parquet"]


def test_paper_paraphrase_sets_from_fixtures(tmp_path):
    frames = [paraphrase.read_hub_pairs(fixture(name)) for name in hub.PAPER_PARAPHRASE_DATASETS]
    combined = paraphrase.combine_pairs(frames)
    assert combined.pair_id.is_unique
    counts = combined.dataset.value_counts().to_dict()
    assert counts == {"mnli": 3, "sentence-compression": 3, "simple-wiki": 3, "altlex": 3, "quora-duplicates": 2}
    assert combined[combined.dataset == "mnli"].negative.notna().all()
    assert combined[combined.dataset != "mnli"].negative.isna().all()
    capped = paraphrase.cap_pairs(combined, 10, seed=0)
    assert paraphrase.write_pairs(capped, tmp_path / "en.parquet") == 10


def test_both_mirrors_of_a_dataset_give_the_same_ids():
    old = paraphrase.read_hub_pairs(fixture("sentence-compression"))
    new = paraphrase.read_hub_pairs(fixture("st-sentence-compression"))
    assert list(old.pair_id) == list(new.pair_id)
    triplets_old = paraphrase.read_hub_pairs(fixture("quora-duplicates-triplets"))
    triplets_new = paraphrase.read_hub_pairs(fixture("st-quora-duplicates-triplets"))
    assert list(triplets_old.pair_id) == list(triplets_new.pair_id)


def test_read_hub_pairs_rejects_documents_and_local_pairs(tmp_path):
    with pytest.raises(InputError, match="holds documents, not pairs"):
        paraphrase.read_hub_pairs("cc100")
    path = tmp_path / "pairs.tsv"
    path.write_text("q1\tq2\nReadability counts.\tSparse is better than dense.\n")
    frame = paraphrase.read_local_pairs(path, "quora-duplicates", columns={"anchor": "q1", "positive": "q2"})
    assert frame.iloc[0].to_dict()["positive"] == "Sparse is better than dense."


def test_local_pairs_without_a_mapping_read_every_record_s_fields(tmp_path):
    """Without columns: a hard negative counts where any record has one (not only when the first
    does), and a record without a positive is an error naming it, as with a mapping."""
    path = tmp_path / "pairs.jsonl"
    rows = [{"anchor": "Flat is better.", "positive": "Nested is worse."},
            {"anchor": "Simple is better.", "positive": "Complex is worse.", "negative": "Errors pass silently."}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    frame = paraphrase.read_local_pairs(path, "mine")
    assert frame["negative"].tolist()[0] is None or pd.isna(frame["negative"].tolist()[0])
    assert frame["negative"].tolist()[1] == "Errors pass silently."
    with pytest.raises(InputError, match=rf"^{tmp_path}: a directory; expected a file \(txt, tsv, jsonl"):
        paraphrase.read_local_pairs(tmp_path, "mine")
    path.write_text(path.read_text() + "\n" + json.dumps({"anchor": "Now is better."}) + "\n")
    from modsent.sources.local import Record, record_location

    record = Record({}, path="p.jsonl", position="line 3")  # the same file, however the caller spells it
    assert [record_location(record, "./p.jsonl", 2), record_location(record, "corpus (de)", 2),
            record_location({}, "s", 2)] == ["./p.jsonl: line 3", "corpus (de): p.jsonl: line 3", "s: record 2"]
    # the file's line, 4 (a blank line is skipped), not the record's count, 3
    with pytest.raises(InputError, match=r"pairs\.jsonl: line 4: missing field\(s\) positive"):
        paraphrase.read_local_pairs(path, "mine")


def test_fixture_cc100_files_are_xz_text():
    # The statmt.org files are xz-compressed UTF-8, one paragraph a line, blank lines between documents.
    text = lzma.decompress((FIXTURES / "statmt-cc-100" / "de.txt.xz").read_bytes()).decode("utf-8")
    assert text.startswith(DE_NO_FILE + "\n") and "\n\n" in text


@pytest.mark.parametrize(
    "name, lang, expected_path, expected_name, expected_files",
    [
        ("cc100", "zh", "text", None, ["https://data.statmt.org/cc-100/zh-Hans.txt.xz"]),
        ("madlad-400", "de", "json", None, ["hf://datasets/allenai/MADLAD-400/data/de/de_clean_*.jsonl.gz"]),
        ("cc100-parquet-export", "de", "parquet", None,
         ["hf://datasets/statmt/cc100@refs%2Fconvert%2Fparquet/de/*train/*.parquet"]),
        ("sentence-compression", None, "text", None,
         ["hf://datasets/sentence-transformers/embedding-training-data/sentence-compression.jsonl.gz"]),
        ("simple-wiki", None, "text", None,
         ["hf://datasets/sentence-transformers/embedding-training-data/SimpleWiki.jsonl.gz"]),
        ("mnli", None, "nyu-mll/multi_nli", None, None),
        ("snli", None, "stanfordnlp/snli", "plain_text", None),
        ("st-altlex", None, "sentence-transformers/altlex", "pair", None),
        ("st-quora-duplicates-triplets", None, "sentence-transformers/quora-duplicates", "triplet", None),
    ],
)
def test_the_calls_made_against_the_hub(monkeypatch, name, lang, expected_path, expected_name, expected_files):
    """Without a fixture location, the loader asks datasets for the real repositories."""
    import datasets
    import datasets.data_files

    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return []

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(datasets.data_files, "resolve_pattern", lambda pattern, base_path: [pattern])
    assert list(hub.iter_hub_records(name, lang=lang)) == []
    (path, config, kwargs), = calls
    assert (path, config) == (expected_path, expected_name)
    assert kwargs["streaming"] is True and kwargs["split"] == "train"
    if expected_files is not None:
        assert kwargs["data_files"] == {"train": expected_files}
