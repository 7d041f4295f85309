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
