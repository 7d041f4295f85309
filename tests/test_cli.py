"""modsent encode's input reading: strict, and every error names the input, line and fix."""

import io
import json
import sys
from types import SimpleNamespace

import pandas as pd
import pytest

from modsent import cli
from modsent.io import InputError


def args(**kw):
    return SimpleNamespace(**{"input": None, "input_format": "txt", "column": "text", **kw})


def with_stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_text_and_invalid_utf8(monkeypatch):
    with_stdin(monkeypatch, "eins\nzwei drei\r\n".encode())
    assert cli._read_sentences(args()) == ["eins", "zwei drei"]
    with_stdin(monkeypatch, b"ok\nbad \xff byte\n")
    with pytest.raises(InputError, match=r"stdin: line 2: invalid UTF-8 at byte 4"):
        cli._read_sentences(args())


def test_jsonl_and_parquet_name_the_missing_column(monkeypatch, tmp_path):
    with_stdin(monkeypatch, b'{"text": "a"}\n\n{"text": "b"}\n')
    assert cli._read_sentences(args(input_format="jsonl")) == ["a", "b"]
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"sentence": "b", "id": 1}) + "\n")
    with pytest.raises(InputError, match=r"in.jsonl: line 2: no 'text' field \(found: sentence, id\)"):
        cli._read_sentences(args(input=str(path), input_format="jsonl"))
    path.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(InputError, match=r"in.jsonl: line 2: not JSON"):
        cli._read_sentences(args(input=str(path), input_format="jsonl"))
    parquet = tmp_path / "in.parquet"
    pd.DataFrame({"sentence": ["x"]}).to_parquet(parquet)
    with pytest.raises(InputError, match=r"no column 'text' \(columns: sentence\)"):
        cli._read_sentences(args(input=str(parquet), input_format="parquet"))
    assert cli._read_sentences(args(input=str(parquet), input_format="parquet", column="sentence")) == ["x"]


def test_parquet_input_that_is_no_parquet_or_holds_a_null_is_named(tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("eins\n")
    with pytest.raises(InputError, match=r"in.txt: not a parquet file .*--input-format says which"):
        cli._read_sentences(args(input=str(text), input_format="parquet"))
    parquet = tmp_path / "in.parquet"
    pd.DataFrame({"text": ["a", None, "c", None]}).to_parquet(parquet)
    with pytest.raises(InputError, match=r"in.parquet: column 'text', row 2 \(of 2 such rows\): null, not a sentence"):
        cli._read_sentences(args(input=str(parquet), input_format="parquet"))


def test_encode_checks_what_it_reads_and_writes_before_reading_a_sentence(tmp_path, monkeypatch, capsys):
    """No model is loaded and stdin is not read when the model, the input or the output cannot work."""
    monkeypatch.setattr(cli, "load_encoder", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr(cli, "_read_sentences", lambda *a, **k: pytest.fail("the input was read"))
    model = tmp_path / "model"
    model.mkdir()
    for argv, said in (
            (["--model", str(tmp_path / "nope")], f"--model {tmp_path / 'nope'}: no such directory"),
            (["--model", str(model), "--input", str(tmp_path / "none.txt")], "none.txt: no such file"),
            (["--model", str(model), "--input-format", "parquet"], "--input-format parquet needs --input FILE"),
            (["--model", str(model), "--output-format", "parquet"], "--output-format parquet needs --output FILE"),
            (["--model", str(model), "--output", str(tmp_path / "no" / "x.npy")], f"no directory {tmp_path / 'no'}"),
            (["--model", str(model), "--output", str(model)], "a directory; name the file to write"),
            (["--model", str(model), "--batch-size", "0"], "--batch-size 0: must be at least 1"),
            (["--model", str(model), "--batch-size", "-3"], "--batch-size -3: must be at least 1"),
            (["--model", str(model), "--lang", "DE"], "--lang DE: 'DE' is not a modsent language code; write 'de'"),
            (["--model", str(model), "--lang", "../x"], "--lang ../x: '../x' is not a language code"),
            (["--model", str(model), "--fallback-lang", "xx"], "--fallback-lang xx: 'xx' is not a registered")):
        assert cli.main(["encode", *argv]) == 2
        assert said in capsys.readouterr().err


def test_encode_and_export_say_what_their_model_directory_is_not(tmp_path, monkeypatch, capsys):
    """A directory that is neither a sentence-transformers model nor a results tree is named as
    such (not as a missing base model); --variant and --merge-weight pick a system of a results
    tree, so with one system's directory they are errors, not ignored; export checks its tree
    and --lang before loading anything."""
    from sentence_transformers import SentenceTransformer

    monkeypatch.setattr(SentenceTransformer, "__init__", lambda *a, **k: pytest.fail("a model was loaded"))
    other, system = tmp_path / "other", tmp_path / "system"
    other.mkdir()
    (other / "notes.txt").write_text("not a model")
    system.mkdir()
    (system / "modules.json").write_text("[]")
    with pytest.raises(InputError, match=r"--model .*other: neither a sentence-transformers directory \(no "
                                         r"modules.json\) nor a results tree of the workflow"):
        cli.load_encoder(str(other), "de", None, None, "cpu")
    with pytest.raises(InputError, match=r"--variant Full_m: .*system is one system \(an export or a method's "
                                         r"directory\); --variant picks a system of a results tree"):
        cli.load_encoder(str(system), None, None, "Full_m", "cpu")
    with pytest.raises(InputError, match=r"--merge-weight 0.5: .*system is a sentence-transformers directory"):
        cli.load_encoder(str(system), None, None, None, "cpu", merge_weight=0.5)
    results = tmp_path / "results" / "tiny"
    (results / "sentence_adapters").mkdir(parents=True)
    for argv, said in (
            (["--model", str(tmp_path / "results" / "nosuch")], "nosuch: no such directory (results/BASE of a run)"),
            (["--model", str(other)], "other: neither a sentence-transformers directory"),
            (["--model", str(results), "--lang", "DE"], "--lang DE: 'DE' is not a modsent language code; write 'de'")):
        assert cli.main(["export", "--lang", "de", *argv, "--out", str(tmp_path / "out")]) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_push_checks_the_repository_id_before_creating_anything(tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "create_repo", lambda *a, **k: pytest.fail("a repository was created"))
    (tmp_path / "modules.json").write_text("[]")
    (tmp_path / "README.md").write_text("---\nlanguage: [de]\n---\n")
    assert cli.main(["push", str(tmp_path), "--repo-id", "my org/model!"]) == 2
    assert "--repo-id 'my org/model!': Repo id must use alphanumeric chars" in capsys.readouterr().err


def test_encode_writes_its_output_whole_or_not_at_all(tmp_path, monkeypatch):
    """An output file appears only complete (written aside, then renamed): a failure while
    writing leaves no file that a later step would take for the result."""
    import numpy as np

    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    for fmt in ("npy", "jsonl", "parquet"):
        out = tmp_path / f"out.{fmt}"
        cli._write_embeddings(args(output=str(out), output_format=fmt), ["a", "b", "c"], vectors, ["de"] * 3, None)
        if fmt == "npy":
            assert np.array_equal(np.load(out), vectors)
        elif fmt == "jsonl":
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            assert [r["embedding"] for r in rows] == vectors.tolist() and rows[0]["lang"] == "de"
        else:
            assert np.array_equal(np.stack(pd.read_parquet(out)["embedding"]), vectors)

    cli._write_embeddings(args(output=str(tmp_path / "named"), output_format="npy"), ["a"], vectors[:1], ["de"], None)
    assert np.array_equal(np.load(tmp_path / "named.npy"), vectors[:1])  # np.save's ".npy", as before
    (tmp_path / "named.npy").unlink()
    for fmt in ("npy", "jsonl", "parquet"):  # a device is written in place (no temporary beside it in /dev)
        cli._write_embeddings(args(output="/dev/null", output_format=fmt), ["a"], vectors[:1], ["de"], None)

    def broken_save(handle, array):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        cli._write_embeddings(args(output=str(tmp_path / "new.npy"), output_format="npy"), ["a"], vectors[:1], ["de"], None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.npy", "out.parquet"]


def test_device_names_are_checked():
    assert cli.check_device(None) is None and cli.check_device("cpu") == "cpu"
    with pytest.raises(InputError, match=r"--device 'gpu0': not a device"):
        cli.check_device("gpu0")
    import torch

    if torch.cuda.device_count() < 8:
        with pytest.raises(InputError, match=r"--device cuda:7: this machine has \d CUDA device"):
            cli.check_device("cuda:7")


def test_export_takes_a_method_s_name_not_a_path(tmp_path, capsys):
    """--variant of a system outside the registry (a method of the config's method_modules) is
    a method's name whose directory the workflow wrote under results/{base}/methods, never a
    path to another directory."""
    root = tmp_path / "results" / "tiny"
    (root / "methods").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "modules.json").write_text("[]")
    for name in ("../../../outside", "Not-trained"):
        assert cli.main(["export", "--model", str(root), "--variant", name, "--out", str(tmp_path / "out")]) == 2
        assert f"unknown variant {name!r}" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_outputs_of_a_base_include_its_seed_replicates(tmp_path):
    """`modsent outputs --lang ky --base tiny` lists results/tiny@seed{r} too (config seeds), and
    no other base whose name merely starts the same."""
    from modsent.cli import language_outputs

    for base in ("tiny", "tiny@seed1", "tiny2"):
        (tmp_path / "results" / base / "tokenizers" / "ky").mkdir(parents=True)
    found = language_outputs(["ky"], str(tmp_path), base="tiny")
    assert found == ["results/tiny/tokenizers/ky", "results/tiny@seed1/tokenizers/ky"]
