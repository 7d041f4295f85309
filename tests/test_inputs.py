"""The input rules' functions: config source specs → files in the design's contracts."""

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from modsent.io import InputError
from modsent.sources import (parse_source, prepare_builtin_eval, prepare_corpus,
                             prepare_paraphrase_dataset, prepare_translations)
from modsent.sources.builtin import builtin_paraphrases
from modsent.sources.paraphrase import PAIR_COLUMNS, make_pair_id

FIXTURES = Path(__file__).parent / "fixtures" / "hub"
SETTINGS = {"source": "builtin", "max_sentences": 300, "min_chars": 3, "max_chars": 200,
            "split_documents": "auto"}


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("spec,kind", [("builtin", "builtin"), ("builtin:x", "builtin"),
                                       ("hf:cc100", "hf"), ("local:/d/{lang}.txt", "local"),
                                       ({"hf": "a/b", "split": "train"}, "hf"),
                                       ({"local": "x.tsv"}, "local")])
def test_parse_source(spec, kind):
    assert parse_source(spec).kind == kind


@pytest.mark.parametrize("spec", ["", "s3://x", "hf:", {"path": "x"}, None])
def test_parse_source_rejects(spec):
    with pytest.raises(InputError, match="source"):
        parse_source(spec, key="corpora.source")


def test_builtin_corpus(tmp_path):
    out = tmp_path / "corpora" / "ky.txt"
    count = prepare_corpus("ky", SETTINGS, out)
    lines = out.read_text("utf-8").splitlines()
    assert count == len(lines) == 300
    assert len(set(lines)) == len(lines)
    assert all(3 <= len(line) <= 200 for line in lines)
    assert any("\u0400" <= ch <= "\u04ff" for ch in "".join(lines))  # Kyrgyz is Cyrillic
    with pytest.raises(InputError, match="'builtin:nosuch': the built-in corpus has no named sets"):
        prepare_corpus("ky", {**SETTINGS, "source": "builtin:nosuch"}, tmp_path / "never.txt")
    assert not (tmp_path / "never.txt").exists()


def test_local_corpus_with_lang_template(tmp_path):
    source = tmp_path / "text.de.txt"
    source.write_text("Erster Satz hier.\nErster Satz hier.\nkurz\nZweiter Satz dort.\n", "utf-8")
    out = tmp_path / "de.txt"
    settings = {**SETTINGS, "source": f"local:{tmp_path}/text.{{lang}}.txt", "min_chars": 5}
    assert prepare_corpus("de", settings, out) == 2
    assert out.read_text("utf-8") == "Erster Satz hier.\nZweiter Satz dort.\n"


def test_invalid_utf8_names_file_and_line_and_writes_nothing(tmp_path):
    source = tmp_path / "bad.txt"
    source.write_bytes("gut\n".encode() + b"schlecht \xff\n")
    out = tmp_path / "out" / "de.txt"
    with pytest.raises(InputError, match=r"bad\.txt: line 2: invalid UTF-8"):
        prepare_corpus("de", {**SETTINGS, "source": f"local:{source}"}, out)
    assert not out.exists()
    assert not out.parent.exists() or leftovers(out.parent) == []


def test_empty_source_fails_and_writes_nothing(tmp_path):
    source = tmp_path / "empty.txt"
    source.write_text("", "utf-8")
    out = tmp_path / "de.txt"
    with pytest.raises(InputError, match="empty"):
        prepare_corpus("de", {**SETTINGS, "source": f"local:{source}"}, out)
    assert not out.exists()


def test_hub_mapping_source_on_a_local_repo_mirror(tmp_path):
    # the mapping form loads any Hub repository; here a local mirror laid out like MADLAD-400
    spec = {"hf": str(FIXTURES / "allenai-MADLAD-400"), "data_files": "data/{lang}/{lang}_clean_*.jsonl.gz",
            "columns": {"text": "text"}}
    out = tmp_path / "de.txt"
    count = prepare_corpus("de", {**SETTINGS, "source": spec, "split_documents": True}, out)
    lines = out.read_text("utf-8").splitlines()
    assert count == len(lines) > 0
    with gzip.open(FIXTURES / "allenai-MADLAD-400/data/de/de_clean_0000.jsonl.gz", "rt") as handle:
        documents = [json.loads(line)["text"] for line in handle]
    assert len(lines) > len(documents)  # documents were split into sentences
    assert lines[0] in documents[0].replace("\\n", "\n")


def test_language_missing_from_a_hub_mirror_fails_before_writing(tmp_path):
    spec = {"hf": str(FIXTURES / "allenai-MADLAD-400"), "data_files": "data/{lang}/{lang}_clean_*.jsonl.gz"}
    out = tmp_path / "ky.txt"
    with pytest.raises(InputError, match="'ky'"):
        prepare_corpus("ky", {**SETTINGS, "source": spec}, out)
    assert not out.exists()


def test_named_hub_source_for_a_language_it_lacks():
    # Maltese is not in CC-100: the error comes before any download is attempted
    with pytest.raises(InputError, match="'mt'.*'cc100'|'cc100'.*'mt'"):
        prepare_corpus("mt", {**SETTINGS, "source": "hf:cc100"}, "/nonexistent/never-written.txt")


def test_a_list_of_sources_is_one_corpus_of_both_interleaved(tmp_path):
    # a local file and a Hub mirror laid out like MADLAD-400 (documents, split into sentences)
    local = tmp_path / "de.txt"
    local.write_text("Erster Satz hier.\nZweiter Satz dort.\nDritter Satz da.\n", "utf-8")
    madlad = {"hf": str(FIXTURES / "allenai-MADLAD-400"), "data_files": "data/{lang}/{lang}_clean_*.jsonl.gz"}
    settings = {**SETTINGS, "source": [f"local:{tmp_path}/{{lang}}.txt", madlad], "split_documents": True}
    out = tmp_path / "out" / "de.txt"
    count = prepare_corpus("de", settings, out)
    lines = out.read_text("utf-8").splitlines()
    # each source on its own, then one line of each in turn
    alone = []
    for spec in settings["source"]:
        prepare_corpus("de", {**settings, "source": spec}, tmp_path / "alone.txt")
        alone.append((tmp_path / "alone.txt").read_text("utf-8").splitlines())
    assert len(alone[1]) > len(alone[0]) == 3
    expected = [line for pair in zip(alone[0], alone[1]) for line in pair] + alone[1][3:]
    assert count == len(lines) == len(expected) and lines == expected
    # the cap counts both sources, and takes from both alike
    assert prepare_corpus("de", {**settings, "max_sentences": 4}, out) == 4
    assert out.read_text("utf-8").splitlines() == expected[:4]
    # a list of one source is that source
    prepare_corpus("de", {**settings, "source": [madlad]}, out)
    assert out.read_text("utf-8").splitlines() == alone[1]


def test_a_bad_second_source_writes_nothing(tmp_path):
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("Erster Satz hier.\nZweiter Satz dort.\n", "utf-8")
    bad.write_bytes("gut genug\n".encode() + b"schlecht \xff\n")
    out = tmp_path / "out" / "de.txt"
    with pytest.raises(InputError, match=r"bad\.txt: line 2: invalid UTF-8"):
        prepare_corpus("de", {**SETTINGS, "source": [f"local:{good}", f"local:{bad}"]}, out)
    assert not out.exists()
    # the error names the language's job, as with one source
    records = tmp_path / "records.jsonl"
    records.write_text('{"body": "Kein Text hier."}\n', "utf-8")
    with pytest.raises(InputError, match=r"\(de\): .*records\.jsonl: line 1: no 'text' field"):
        prepare_corpus("de", {**SETTINGS, "source": [f"local:{good}", {"local": str(records)}]}, out)
    assert not out.exists()
    # one file named twice, in the two spellings: read twice, kept once
    assert prepare_corpus("de", {**SETTINGS, "source": [f"local:{good}", {"local": str(good)}]}, out) == 2
    assert out.read_text("utf-8") == good.read_text("utf-8")


@pytest.mark.workflow
def test_the_corpus_rule_combines_a_list_of_sources_and_reruns_only_for_what_changed(tmp_path):
    """The workflow end to end: a language whose corpus lists a built-in and a local source gets
    both, interleaved; a list of one source plans nothing new; editing the local file reruns
    only the language that reads it."""
    import subprocess
    import sys

    import yaml
    from conftest import REPO, snakemake_exe

    beside = Path(sys.executable).parent / "snakemake"
    exe = str(beside) if beside.exists() else snakemake_exe()
    (tmp_path / "extra").mkdir()
    extra = tmp_path / "extra" / "de.txt"
    extra.write_text("Ein Satz aus der eigenen Datei.\nNoch ein Satz aus der eigenen Datei.\n", "utf-8")
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["corpora"]["per_language"] = {"de": {"source": [config["corpora"].get("source", "builtin"),
                                                           f"local:{tmp_path}/extra/{{lang}}.txt"]}}
    path = tmp_path / "config.yaml"

    def snakemake(*args):
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.run([exe, "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                               "--configfile", str(path), "--cores", "1", *args,
                               "resources/corpora/de.txt", "resources/corpora/ky.txt"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    snakemake()
    lines = (tmp_path / "resources" / "corpora" / "de.txt").read_text("utf-8").splitlines()
    assert lines[1] == "Ein Satz aus der eigenen Datei." and lines[3] == "Noch ein Satz aus der eigenen Datei."
    prepare_corpus("de", {**SETTINGS, **config["corpora"], "source": "builtin"}, tmp_path / "alone.txt")
    builtin = (tmp_path / "alone.txt").read_text("utf-8").splitlines()
    assert lines[::2][:2] == builtin[:2] and lines[4:] == builtin[2:len(lines) - 2]
    assert "Nothing to be done" in snakemake("-n")
    config["corpora"]["per_language"]["ky"] = {"source": [config["corpora"].get("source", "builtin")]}
    assert "Nothing to be done" in snakemake("-n")  # a list of one source is that source
    extra.write_text("Ein anderer Satz.\n", "utf-8")
    planned = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: lang=(\S+)$", snakemake("-n"), flags=re.M)
    assert planned == [("corpus", "de")]


def test_builtin_paraphrases_contract(tmp_path):
    out = tmp_path / "builtin.parquet"
    count = prepare_paraphrase_dataset("builtin", {"source": "builtin", "max_pairs": None}, out)
    pairs = pd.read_parquet(out)
    assert list(pairs.columns) == list(PAIR_COLUMNS)
    assert count == len(pairs) == len(builtin_paraphrases())
    assert pairs["pair_id"].is_unique
    row = pairs.iloc[0]
    negative = None if pd.isna(row["negative"]) else row["negative"]
    assert row["pair_id"] == make_pair_id(row["dataset"], row["anchor"], row["positive"], negative)
    assert set(pairs["dataset"]) <= set(builtin_paraphrases()["dataset"])


def test_paraphrase_cap_is_a_stable_subset(tmp_path):
    small, large = tmp_path / "s.parquet", tmp_path / "l.parquet"
    prepare_paraphrase_dataset("builtin", {"source": "builtin", "max_pairs": 20}, small)
    prepare_paraphrase_dataset("builtin", {"source": "builtin", "max_pairs": 60}, large)
    small_ids = set(pd.read_parquet(small)["pair_id"])
    assert len(small_ids) == 20
    assert small_ids <= set(pd.read_parquet(large)["pair_id"])


def test_local_paraphrases_with_column_mapping(tmp_path):
    source = tmp_path / "pairs.tsv"
    source.write_text("q\tp\nHow are you?\tHow do you do?\nGood night.\tSleep well.\n", "utf-8")
    out = tmp_path / "mine.parquet"
    spec = {"source": {"local": str(source), "columns": {"anchor": "q", "positive": "p"}}, "max_pairs": None}
    assert prepare_paraphrase_dataset("mine", spec, out) == 2
    pairs = pd.read_parquet(out)
    assert pairs["dataset"].tolist() == ["mine", "mine"]
    assert pairs["negative"].isna().all()


def test_local_paraphrases_missing_column(tmp_path):
    source = tmp_path / "pairs.jsonl"
    source.write_text(json.dumps({"a": "x", "b": "y"}) + "\n", "utf-8")
    with pytest.raises(InputError, match="anchor"):
        prepare_paraphrase_dataset("mine", {"source": f"local:{source}"}, tmp_path / "o.parquet")


def test_unknown_builtin_subset(tmp_path):
    with pytest.raises(InputError, match="builtin-countries"):
        prepare_paraphrase_dataset("x", {"source": "builtin:nope"}, tmp_path / "o.parquet")


def test_provided_translations_cover_the_paraphrases(tmp_path):
    pairs = builtin_paraphrases()
    needed = set(pairs["anchor"]) | set(pairs["positive"]) | set(pairs["negative"].dropna())
    for lang in ["de", "zh", "ky"]:
        out = tmp_path / f"{lang}.parquet"
        prepare_translations("builtin", lang, out)
        frame = pd.read_parquet(out)
        assert list(frame.columns) == ["english", "translation"]
        assert frame["english"].is_unique
        assert needed <= set(frame["english"])


def test_provided_translations_from_a_local_file(tmp_path):
    source = tmp_path / "de.tsv"
    source.write_text("en\tde\nHello\tHallo\nHello\tGrüß Gott\nBye\t\n", "utf-8")
    out = tmp_path / "out.parquet"
    spec = {"local": str(tmp_path / "{lang}.tsv"), "columns": {"english": "en", "translation": "de"}}
    assert prepare_translations(spec, "de", out) == 1  # first translation kept, empty dropped
    assert pd.read_parquet(out).values.tolist() == [["Hello", "Hallo"]]
    jsonl = tmp_path / "ky.jsonl"
    jsonl.write_text('{"english": "Hello", "translation": "Салам"}\n{"english": "Bye", "translation": 5}\n', "utf-8")
    with pytest.raises(InputError, match=r"ky\.jsonl: record 2: 'translation' is 5, not a text"):
        prepare_translations("local:" + str(tmp_path / "{lang}.jsonl"), "ky", tmp_path / "ky.parquet")
    assert not (tmp_path / "ky.parquet").exists()


def test_builtin_eval_files_align_by_id(tmp_path):
    frames = {}
    for lang in ["en", "de", "ky"]:
        out = tmp_path / f"{lang}.parquet"
        prepare_builtin_eval("parallel", lang, out)
        frames[lang] = pd.read_parquet(out).set_index("id")["text"]
    shared = frames["en"].index.intersection(frames["de"].index).intersection(frames["ky"].index)
    assert len(shared) > 100
    # a file does not depend on which other languages are configured
    prepare_builtin_eval("parallel", "de", tmp_path / "again.parquet")
    assert pd.read_parquet(tmp_path / "again.parquet").set_index("id")["text"].equals(frames["de"])
    classification = tmp_path / "cls.parquet"
    prepare_builtin_eval("classification", "ky", classification)
    frame = pd.read_parquet(classification)
    assert {"text", "label", "split"} <= set(frame.columns)
    assert set(frame["split"]) == {"train", "test"}


def test_xnli_as_provided_translations(tmp_path):
    # a local mirror laid out like facebook/xnli: the same load_dataset(repo, lang, split) calls
    out = tmp_path / "de.parquet"
    count = prepare_translations({"hf": str(FIXTURES / "facebook-xnli")}, "de", out)
    frame = pd.read_parquet(out)
    en = pd.read_parquet(FIXTURES / "facebook-xnli/en/validation-00000-of-00001.parquet")
    de = pd.read_parquet(FIXTURES / "facebook-xnli/de/validation-00000-of-00001.parquet")
    table = dict(zip(frame["english"], frame["translation"]))
    assert count == 12
    assert table[en.loc[0, "premise"]] == de.loc[0, "premise"]
    assert table[en.loc[2, "hypothesis"]] == de.loc[2, "hypothesis"]


def test_xnli_lacks_a_language(tmp_path):
    with pytest.raises(InputError, match="'ky' is not in XNLI"):
        prepare_translations("hf:xnli", "ky", tmp_path / "x.parquet")


def test_local_triplets_keep_their_negative_without_a_mapping(tmp_path):
    source = tmp_path / "triplets.jsonl"
    source.write_text(json.dumps({"anchor": "Save", "positive": "Save changes", "negative": "Delete"}) + "\n",
                      "utf-8")
    out = tmp_path / "t.parquet"
    prepare_paraphrase_dataset("mine", {"source": f"local:{source}"}, out)
    assert pd.read_parquet(out)["negative"].tolist() == ["Delete"]


def test_a_local_source_edited_in_place_reruns_the_rule_that_reads_it(tmp_path):
    """local: corpora, paraphrases and base models are the rules' inputs: a prepared corpus is
    up to date until its local file changes, and then exactly that corpus is planned again."""
    import os
    import subprocess

    import yaml

    from conftest import REPO, snakemake_exe

    texts = tmp_path / "texts"
    texts.mkdir()
    for lang in ("en", "de", "ky"):
        (texts / f"{lang}.txt").write_text("".join(f"{lang} sentence number {i}\n" for i in range(50)))
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["corpora"]["source"] = f"local:{texts}/{{lang}}.txt"
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config))

    def snakemake(*args):
        proc = subprocess.run([snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory",
                               str(tmp_path), "--configfile", str(path), "--cores", "1", *args],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    targets = [f"resources/corpora/{lang}.txt" for lang in ("en", "de", "ky")]
    snakemake(*targets)
    assert "Nothing to be done" in snakemake("-n", *targets)
    with open(texts / "de.txt", "a", encoding="utf-8") as f:
        f.write("one more German line\n")
    later = (tmp_path / "resources" / "corpora" / "de.txt").stat().st_mtime + 5
    os.utime(texts / "de.txt", (later, later))
    planned = snakemake("-n", *targets)
    assert planned.count("rule corpus:") == 1 and "reason: Updated input files:" in planned, planned[-2000:]
    assert "output: resources/corpora/de.txt" in planned, planned[-2000:]
