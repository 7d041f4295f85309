"""Machine translation engines on tiny random NLLB/M2M100 checkpoints built in the test.

The models are random (init_std=1.0, so that their noise depends on the input): translations
are noise, but tokens, language tokens, ordering, sharding, resumption and the CTranslate2
conversion are real. No download: tokenizers are learnt from real English (sample_texts).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import simulated_gpus
from modsent.data import translation as T
from modsent.io import InputError
from modsent import testing
from modsent.testing import sample_texts

REPO = Path(__file__).resolve().parent.parent
OPTIONS = dict(beam_size=1, max_length=8)  # greedy: transformers and CTranslate2 agree exactly


@pytest.fixture(scope="module", autouse=True)
def _threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads cost more than they bring on a shared CPU
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("translation")


@pytest.fixture(scope="module")
def nllb(root) -> Path:
    return testing.make_random_nllb(root / "nllb", sample_texts(300), vocab_size=600, init_std=1.0)


@pytest.fixture(scope="module")
def m2m100(root) -> Path:
    return testing.make_random_m2m100(root / "m2m100", sample_texts(300), vocab_size=600, init_std=1.0)


@pytest.fixture(scope="module")
def units(root) -> tuple[Path, pd.DataFrame]:
    """30 units of 5-40 words: lengths vary, so length sorting really reorders them."""
    frame = T.make_units(sample_texts(330)[300:])
    path = root / "units.parquet"
    frame.to_parquet(path, index=False)
    return path, frame


@pytest.fixture(scope="module")
def reference(root, nllb, units) -> pd.DataFrame:
    """An uninterrupted run: what every resumed run must equal."""
    out = T.translate_shard(units[0], root / "reference.parquet", engine="transformers", model=nllb,
                            tgt_lang="de", batch_size=4, checkpoint_every=2, **OPTIONS)
    return pd.read_parquet(out)


@pytest.fixture(scope="module")
def ct2(root, nllb, m2m100) -> dict[str, Path]:
    pytest.importorskip("ctranslate2")
    return {"nllb": T.convert_checkpoint(nllb, root / "nllb-ct2"),
            "m2m100": T.convert_checkpoint(m2m100, root / "m2m100-ct2")}


# ---- units and shards ---------------------------------------------------------------------


def test_make_units_hashes_deduplicates_and_sorts(tmp_path):
    frame = T.make_units(["b sentence.", "a sentence.", "b sentence.", None, float("nan")])
    assert list(frame.columns) == ["unit_id", "text"]
    assert sorted(frame["text"]) == ["a sentence.", "b sentence."]
    assert list(frame["unit_id"]) == sorted(frame["unit_id"])
    for uid, text in zip(frame["unit_id"], frame["text"]):
        assert uid == hashlib.sha256(text.encode()).hexdigest()[:16]
    frame.to_parquet(tmp_path / "units.parquet")
    pd.testing.assert_frame_equal(T.read_units(tmp_path / "units.parquet"), frame)  # same dtypes
    assert list(T.make_units([]).columns) == ["unit_id", "text"]
    with pytest.raises(InputError, match="sentence 1: empty or blank"):
        T.make_units(["ok.", "  "])
    with pytest.raises(InputError, match="sentence 0: expected a string"):
        T.make_units([3])


def test_shards_partition_the_units_and_adding_units_moves_none():
    base = T.make_units(sample_texts(200))
    shards = [T.shard_units(base, 4, k) for k in range(4)]
    assert sorted(pd.concat(shards)["unit_id"]) == sorted(base["unit_id"])
    assert all(len(s) > 20 for s in shards)  # roughly even
    for shard in shards:  # each keeps the units' order
        assert list(shard["unit_id"]) == sorted(shard["unit_id"])
    grown = T.make_units(sample_texts(300))
    for k, shard in enumerate(shards):
        assert set(shard["unit_id"]) <= set(T.shard_units(grown, 4, k)["unit_id"])
    for bad, message in (((0, 0), "n_shards must be a positive integer"), ((4, 4), r"shard must be .* not 4"),
                         ((4, -1), r"shard must be .* not -1")):
        with pytest.raises(InputError, match=message):
            T.shard_units(base, *bad)


def test_read_units_rejects_bad_files(root):
    path = root / "bad-units.parquet"
    pd.DataFrame({"unit_id": ["0123456789abcdef"] * 2, "text": ["a", "b"]}).to_parquet(path)
    with pytest.raises(InputError, match="duplicated unit_id"):
        T.read_units(path)
    pd.DataFrame({"id": ["x"], "text": ["a"]}).to_parquet(path)
    with pytest.raises(InputError, match="columns unit_id, text"):
        T.read_units(path)


# ---- language codes -----------------------------------------------------------------------


def test_check_languages_maps_registry_codes_without_model_files(nllb, m2m100):
    assert T.check_languages("transformers", "facebook/nllb-200-3.3B", ["en", "de", "zh-Hant", "ckb"]) == {
        "en": "eng_Latn", "de": "deu_Latn", "zh-Hant": "zho_Hant", "ckb": "ckb_Arab"}
    assert T.check_languages("ctranslate2", "facebook/m2m100_418M", ["en", "nb", "nso", "ast"]) == {
        "en": "en", "nb": "no", "nso": "ns", "ast": "ast"}
    assert T.check_languages("provided", "anything", ["ar-Latn"]) == {}
    assert T.model_family(nllb) == "nllb" and T.model_family(f"local:{m2m100}") == "m2m100"
    with pytest.raises(InputError, match=r"'ar-Latn'.*not covered by NLLB-200.*facebook/nllb-200-3.3B"):
        T.check_languages("transformers", "facebook/nllb-200-3.3B", ["en", "ar-Latn"])
    with pytest.raises(InputError, match=r"'zh-Hant'.*M2M100 model 'facebook/m2m100_418M'"):
        T.check_languages("transformers", "facebook/m2m100_418M", ["zh-Hant"])
    with pytest.raises(InputError, match="'deu' is not a modsent language code; write 'de'"):
        T.check_languages("transformers", "facebook/nllb-200-3.3B", ["deu"])
    with pytest.raises(InputError, match="cannot tell whether it is an NLLB or an M2M100"):
        T.check_languages("transformers", "Helsinki-NLP/opus-mt-en-de", ["de"])
    with pytest.raises(InputError, match="no built-in translation model"):
        T.check_languages("transformers", "builtin:nllb", ["de"])
    with pytest.raises(InputError, match="translation engine 'marian'"):
        T.check_languages("marian", "facebook/nllb-200-3.3B", ["de"])


def test_uncovered_language_fails_before_any_model_is_loaded(root, units, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(T, "load_translator", no_loading)
    out = root / "never.parquet"
    with pytest.raises(InputError, match="'ar-Latn'"):
        T.translate_shard(units[0], out, engine="transformers", model="facebook/nllb-200-3.3B", tgt_lang="ar-Latn")
    assert not out.exists() and not T.partial_dir(out).exists()


# ---- tokens: source language, forced target language --------------------------------------


@pytest.mark.parametrize("family", ["nllb", "m2m100"])
def test_language_tokens_of_the_transformers_engine(family, nllb, m2m100):
    model = {"nllb": nllb, "m2m100": m2m100}[family]
    code = {"nllb": ("eng_Latn", "deu_Latn", "fra_Latn"), "m2m100": ("__en__", "__de__", "__fr__")}[family]
    translator = T.load_translator("transformers", model, src_lang="en", tgt_lang="de", **OPTIONS)
    tok = translator.tokenizer
    texts = ["Return the number of items.", "A much longer sentence, with a comma and more words in it."]

    sources = translator.encode(texts)
    for ids in sources:  # [source language] tokens </s>
        assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == [code[0], "</s>"]
        assert tok.unk_token_id not in ids
    french = T.load_translator("transformers", model, src_lang="fr", tgt_lang="de", **OPTIONS)
    assert [ids[1:] for ids in french.encode(texts)] == [ids[1:] for ids in sources]
    assert tok.convert_ids_to_tokens(french.encode(texts)[0][0]) == code[2]

    raw = []
    generate = translator.model.generate
    translator.model.generate = lambda **kw: raw.append(out := generate(**kw)) or out
    targets = translator.generate(sources)
    decoder_start = translator.model.generation_config.decoder_start_token_id
    assert raw[0][:, 0].tolist() == [decoder_start] * 2  # </s>, then the forced language token
    assert tok.convert_ids_to_tokens(raw[0][:, 1].tolist()) == [code[1]] * 2
    assert all(t[0] == tok.convert_tokens_to_ids(code[1]) and 1 < len(t) <= OPTIONS["max_length"] for t in targets)
    text = translator.decode(targets)
    assert all(isinstance(t, str) and code[1] not in t for t in text)
    beam = T.load_translator("transformers", model, src_lang="en", tgt_lang="fr", beam_size=3, max_length=8)
    assert {t[0] for t in beam.generate(sources)} == {tok.convert_tokens_to_ids(code[2])}


# ---- translate_shard: order, completeness, sharding, resumption ---------------------------


class UpperCaseTranslator(T.Translator):
    """A stand-in engine whose 'translation' is the upper-cased text: exact ordering checks."""

    engine = "stub"

    def __init__(self):
        self.max_input_length = 512
        self.batches: list[list[int]] = []

    def encode(self, texts):
        return [[ord(c) for c in text] for text in texts]

    def generate(self, sources):
        self.batches.append([len(s) for s in sources])
        return [list(s) for s in sources]

    def decode(self, targets):
        return ["".join(map(chr, t)).upper() for t in targets]


def test_length_sorted_batches_come_back_in_input_order(root, units, monkeypatch):
    stub = UpperCaseTranslator()
    monkeypatch.setattr(T, "load_translator", lambda *a, **k: stub)
    path, frame = units
    out = T.translate_shard(path, root / "stub.parquet", engine="transformers", model="facebook/nllb-200-3.3B",
                            tgt_lang="de", batch_size=4)
    result = pd.read_parquet(out)
    assert list(result.columns) == ["unit_id", "translation"]
    assert list(result["unit_id"]) == list(frame["unit_id"])
    assert list(result["translation"]) == [t.upper() for t in frame["text"]]
    lengths = [n for batch in stub.batches for n in batch]
    assert lengths == sorted(lengths, reverse=True) and lengths != [len(t) for t in frame["text"]]
    assert [len(b) for b in stub.batches] == [4] * 7 + [2]


def _brute_force_batches(lengths, batch_size, batch_tokens):
    """The definition, one sentence at a time: a batch takes the next sentence of the
    longest-first order while its sentences times its longest stay within the budget."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches:
            last = batches[-1]
            longest = max(lengths[j] for j in last + [i])
            if len(last) < batch_size and (batch_tokens is None or (len(last) + 1) * longest <= batch_tokens):
                last.append(i)
                continue
        batches.append([i])
    return batches


@pytest.mark.parametrize("batch_tokens", [None, 1, 40, 96, 500, 10_000])
def test_length_batches_follow_the_token_budget(batch_tokens):
    generator = torch.Generator().manual_seed(batch_tokens or 0)
    lengths = torch.randint(1, 60, (200,), generator=generator).tolist()
    batches = T.length_batches(lengths, batch_size=16, batch_tokens=batch_tokens)
    assert batches == _brute_force_batches(lengths, 16, batch_tokens)
    assert sorted(i for b in batches for i in b) == list(range(200))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert len(batch) <= 16 and (batch_tokens is None or padded <= batch_tokens or len(batch) == 1)
    if batch_tokens is None:
        assert [len(b) for b in batches] == [16] * 12 + [8]
    elif batch_tokens == 500:  # more short sentences per batch than long ones
        assert len(batches[0]) < len(batches[-2]) == 16
    # a resumed run sees the order without its finished batches: the same remaining batches
    for done in (1, 5):
        finished = {i for b in batches[:done] for i in b}
        rest = [i for i in range(200) if i not in finished]
        again = T.length_batches([lengths[i] for i in rest], batch_size=16, batch_tokens=batch_tokens)
        assert [[rest[i] for i in b] for b in again] == batches[done:]


def test_padding_fraction_counts_the_padded_positions():
    lengths = [4, 2, 3, 1]
    assert T.padding_fraction(lengths, [[0, 1], [2, 3]]) == pytest.approx(1 - 10 / (2 * 4 + 2 * 3))
    assert T.padding_fraction(lengths, [[0], [1], [2], [3]]) == 0
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (500,), generator=generator).tolist()
    fixed = T.padding_fraction(lengths, T.length_batches(lengths, batch_size=64))
    shuffled = T.padding_fraction(lengths, [list(range(k, min(k + 64, 500))) for k in range(0, 500, 64)])
    assert 0 < fixed < shuffled  # sorting by length leaves less padding than input order


def test_token_budget_batches_in_translate_shard(root, units, monkeypatch):
    stub = UpperCaseTranslator()
    monkeypatch.setattr(T, "load_translator", lambda *a, **k: stub)
    path, frame = units
    out = T.translate_shard(path, root / "stub-tokens.parquet", engine="transformers",
                            model="facebook/nllb-200-3.3B", tgt_lang="de", batch_size=30, batch_tokens=600)
    result = pd.read_parquet(out)
    assert list(result["translation"]) == [t.upper() for t in frame["text"]]
    sizes = [len(b) for b in stub.batches]
    assert all(len(b) * b[0] <= 600 or len(b) == 1 for b in stub.batches)
    assert sizes[0] < max(sizes) and sum(sizes) == len(frame)  # short sentences fill larger batches
    with pytest.raises(InputError, match="batch_tokens must be a positive integer or None"):
        T.translate_shard(path, root / "bad.parquet", engine="transformers", model="facebook/nllb-200-3.3B",
                          tgt_lang="de", batch_tokens=0)


def test_real_model_output_matches_unit_by_unit_translation(nllb, units, reference):
    """Each row is the translation of its own unit (not of a neighbour in the sorted batch)."""
    _, frame = units
    assert list(reference["unit_id"]) == list(frame["unit_id"])
    translator = T.load_translator("transformers", nllb, src_lang="en", tgt_lang="de", **OPTIONS)
    cudnn_attention = []  # generate runs without cuDNN's attention (a plan per decoding length on Hopper)
    generate = translator.model.generate
    translator.model.generate = lambda **kw: cudnn_attention.append(torch.backends.cuda.cudnn_sdp_enabled()) or \
        generate(**kw)
    one_by_one = [translator.translate([text])[0] for text in frame["text"]]
    assert list(reference["translation"]) == one_by_one
    assert cudnn_attention == [False] * len(frame) and torch.backends.cuda.cudnn_sdp_enabled()
    assert reference["translation"].nunique() > len(frame) // 2  # the noise depends on the input


def test_shards_of_one_file_translate_every_unit_once(root, nllb, units, reference):
    path, frame = units
    outputs = [pd.read_parquet(T.translate_shard(
        path, root / f"shard-{k}.parquet", shard=k, n_shards=3, engine="transformers", model=nllb,
        tgt_lang="de", batch_size=8, **OPTIONS)) for k in range(3)]
    for k, output in enumerate(outputs):
        assert list(output["unit_id"]) == list(T.shard_units(frame, 3, k)["unit_id"])
    joined = pd.concat(outputs).set_index("unit_id")
    assert sorted(joined.index) == sorted(frame["unit_id"])
    assert joined.loc[reference["unit_id"], "translation"].tolist() == reference["translation"].tolist()


def test_empty_shard_writes_empty_output_without_a_model(root, units, monkeypatch):
    monkeypatch.setattr(T, "load_translator", lambda *a, **k: pytest.fail("model loaded"))
    path, frame = units
    empty = next(k for k in range(200) if T.shard_units(frame, 200, k).empty)
    out = T.translate_shard(path, root / "empty.parquet", shard=empty, n_shards=200,
                            engine="transformers", model="facebook/nllb-200-3.3B", tgt_lang="de")
    result = pd.read_parquet(out)
    assert list(result.columns) == ["unit_id", "translation"] and result.empty


class Crash(Exception):
    pass


def _count_translated(monkeypatch) -> list[int]:
    """Count the units each engine call translates."""
    calls: list[int] = []
    generate = T.TransformersTranslator.generate

    def counting(self, sources):
        calls.append(len(sources))
        return generate(self, sources)

    monkeypatch.setattr(T.TransformersTranslator, "generate", counting)
    return calls


def crashing_at(batch: int, seen: list):
    """An ``on_batch`` that records each finished batch's unit ids in ``seen`` and raises Crash
    after batch number ``batch``."""
    def on_batch(ids):
        seen.append(ids)
        if len(seen) == batch:
            raise Crash
    return on_batch


def test_resume_after_an_exception_keeps_every_finished_batch(root, nllb, units, reference, monkeypatch):
    path, frame = units
    out = root / "crash.parquet"
    first: list[str] = []

    def crash_at_batch_3(ids):
        first.extend(ids)
        if len(first) == 12:
            raise Crash

    common = dict(engine="transformers", model=nllb, tgt_lang="de", batch_size=4, checkpoint_every=5, **OPTIONS)
    with pytest.raises(Crash):
        T.translate_shard(path, out, on_batch=crash_at_batch_3, **common)
    assert not out.exists()
    parts = list(T.partial_dir(out).glob("part-*.parquet"))
    assert len(parts) == 1 and len(pd.read_parquet(parts[0])) == 12  # flushed before 5 batches

    calls = _count_translated(monkeypatch)
    second: list[str] = []
    T.translate_shard(path, out, on_batch=second.extend, **common)
    assert sum(calls) == len(frame) - 12 and not set(first) & set(second)
    assert set(first) | set(second) == set(frame["unit_id"])
    pd.testing.assert_frame_equal(pd.read_parquet(out), reference)
    assert not T.partial_dir(out).exists()


def test_resume_with_a_token_budget(root, nllb, units, reference, monkeypatch):
    """Token-budget batches of a real model: a crash after two batches, a rerun that translates
    the rest in the batches an uninterrupted run forms; the same translations as fixed batches."""
    path, frame = units
    out = root / "crash-tokens.parquet"
    common = dict(engine="transformers", model=nllb, tgt_lang="de", batch_size=16, batch_tokens=64,
                  checkpoint_every=1, **OPTIONS)
    first: list[list[str]] = []
    with pytest.raises(Crash):
        T.translate_shard(path, out, on_batch=crashing_at(2, first), **common)
    calls = _count_translated(monkeypatch)
    T.translate_shard(path, out, **common)
    translator = T.load_translator("transformers", nllb, src_lang="en", tgt_lang="de", **OPTIONS)
    lengths = [len(s) for s in translator.encode(frame["text"].tolist())]
    expected = [len(b) for b in T.length_batches(lengths, batch_size=16, batch_tokens=64)]
    assert [len(b) for b in first] == expected[:2] and calls == expected[2:]
    assert max(expected) > min(expected[:-1])  # the budget, not batch_size, made the batches
    pd.testing.assert_frame_equal(pd.read_parquet(out), reference)


def test_sigterm_saves_finished_batches(root, nllb, units, reference, monkeypatch):
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM is handled by someone else in this process")
    path, _ = units
    out = root / "sigterm.parquet"
    seen: list[str] = []

    def terminate_at_batch_2(ids):
        seen.extend(ids)
        if len(seen) == 8:
            os.kill(os.getpid(), signal.SIGTERM)

    common = dict(engine="transformers", model=nllb, tgt_lang="de", batch_size=4, checkpoint_every=10, **OPTIONS)
    with pytest.raises(T._Terminated, match="terminated by signal"):
        T.translate_shard(path, out, on_batch=terminate_at_batch_2, **common)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored
    calls = _count_translated(monkeypatch)
    T.translate_shard(path, out, **common)
    assert sum(calls) == len(reference) - 8
    pd.testing.assert_frame_equal(pd.read_parquet(out), reference)


def test_resume_after_the_process_is_killed(root, nllb, units, reference, monkeypatch):
    """SIGKILL at batch 3 with checkpoint_every=2: the part with batches 1-2 survives, batch 3
    is lost; the rerun translates everything else, batch size changed, same result."""
    path, frame = units
    out = root / "killed.parquet"
    script = textwrap.dedent(f"""
        import os, signal, torch
        from modsent.data.translation import translate_shard
        torch.set_num_threads(1)
        batches = []
        def kill_at_batch_3(ids):
            batches.append(ids)
            if len(batches) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        translate_shard({str(path)!r}, {str(out)!r}, engine="transformers", model={str(nllb)!r},
                        tgt_lang="de", batch_size=4, checkpoint_every=2, beam_size=1, max_length=8,
                        on_batch=kill_at_batch_3)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not out.exists()
    assert json.loads((T.partial_dir(out) / "settings.json").read_text())["tgt_lang"] == "de"
    assert sum(len(pd.read_parquet(p)) for p in T.partial_dir(out).glob("part-*.parquet")) == 8

    calls = _count_translated(monkeypatch)
    T.translate_shard(path, out, engine="transformers", model=nllb, tgt_lang="de", batch_size=4,
                      checkpoint_every=2, **OPTIONS)
    assert sum(calls) == len(frame) - 8
    pd.testing.assert_frame_equal(pd.read_parquet(out), reference)


def test_a_partial_made_with_other_settings_is_discarded(root, nllb, units, monkeypatch):
    path, frame = units
    out = root / "settings.parquet"
    common = dict(engine="transformers", model=nllb, tgt_lang="de", batch_size=8, max_length=8)

    def crash(ids):
        raise Crash

    with pytest.raises(Crash):
        T.translate_shard(path, out, beam_size=1, on_batch=crash, **common)
    assert list(T.partial_dir(out).glob("part-*.parquet"))
    calls = _count_translated(monkeypatch)
    T.translate_shard(path, out, beam_size=2, **common)
    assert sum(calls) == len(frame)


def test_a_partial_made_by_another_model_under_the_same_path_is_discarded(root, nllb, units, monkeypatch):
    """The CTranslate2 engine always reads resources/mt_models/ct2, converted anew when the model,
    its revision or quantization changes: a partial shard of the old model must not be reused."""
    from safetensors.torch import load_file, save_file

    path, frame = units
    model, out = root / "swapped-model", root / "swapped.parquet"
    shutil.copytree(nllb, model)
    common = dict(engine="transformers", model=model, tgt_lang="de", batch_size=4, checkpoint_every=1, **OPTIONS)
    with pytest.raises(Crash):
        T.translate_shard(path, out, on_batch=crashing_at(3, []), **common)
    assert json.loads((T.partial_dir(out) / "settings.json").read_text())["model_files"]["model.safetensors"]
    weights = load_file(str(model / "model.safetensors"))
    save_file({k: v.flip(0) if v.ndim else v for k, v in weights.items()}, str(model / "model.safetensors"),
              metadata={"format": "pt"})  # another model of the same size, under the same path
    calls = _count_translated(monkeypatch)
    T.translate_shard(path, out, **common)
    assert sum(calls) == len(frame)  # nothing of the old model's partial was kept


# ---- CTranslate2 --------------------------------------------------------------------------


def test_convert_checkpoint_writes_a_self_contained_directory(ct2, root, nllb):
    converted = ct2["nllb"]
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer", T.CONVERSION_INFO} <= {
        p.name for p in converted.iterdir()}
    assert json.loads((converted / T.CONVERSION_INFO).read_text())["family"] == "nllb"
    assert T.model_family(converted) == "nllb" and T.model_family(ct2["m2m100"]) == "m2m100"
    assert not [p for p in root.iterdir() if p.name.startswith(".nllb-ct2")]  # no temporaries left
    with pytest.raises(InputError, match="quantization 'int4'"):
        T.convert_checkpoint(nllb, root / "never-ct2", quantization="int4")
    with pytest.raises(InputError, match="not a CTranslate2 model directory"):
        T.load_translator("ctranslate2", nllb, src_lang="en", tgt_lang="de")


def test_a_local_checkpoint_is_converted_from_its_safetensors_never_from_pickles(ct2, root, nllb, monkeypatch):
    """A local directory holding pickled weights only is refused, naming them; one that holds both
    converts from its safetensors (the converter sees links to the safetensors, configs and
    vocabularies only), and torch.load is never called."""
    from safetensors.torch import load_file

    pickled = root / "nllb-pickled"
    shutil.copytree(nllb, pickled)
    torch.save(load_file(str(pickled / "model.safetensors")), pickled / "pytorch_model.bin")
    both = root / "nllb-both"
    shutil.copytree(pickled, both)
    for path in pickled.glob("*.safetensors"):
        path.unlink()
    assert (pickled / "pytorch_model.bin").is_file()
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or pytest.fail("torch.load called"))
    with pytest.raises(InputError, match=r"nllb-pickled: no safetensors weights \(found pickled weights "
                                         r"\['pytorch_model.bin'\]"):
        T.convert_checkpoint(f"local:{pickled}", root / "never-ct2")
    converted = T.convert_checkpoint(f"local:{both}", root / "both-ct2")
    assert (converted / "model.bin").read_bytes() == (ct2["nllb"] / "model.bin").read_bytes() and loads == []
    assert not (converted / ".download").exists() and both.joinpath("pytorch_model.bin").is_file()


@pytest.mark.parametrize("bf16_units", [True, False])
def test_the_default_gpu_type_is_the_half_type_the_gpu_computes_natively(bf16_units, ct2, monkeypatch):
    """compute_type auto (or none given) on a GPU: bfloat16 where it has bf16 units (A100, H100),
    float16 where it has not (V100, T4: bf16 emulated at about fp32's speed in PyTorch, refused by
    CTranslate2), for both engines; float32 on the CPU."""
    import ctranslate2

    asked = []
    simulated_gpus(monkeypatch, [bf16_units, bf16_units])  # torch asked about cuda:1 as about cuda:0
    half = torch.bfloat16 if bf16_units else torch.float16
    assert T._torch_dtype("auto", "cuda") == T._torch_dtype(None, "cuda:1") == half
    assert T._torch_dtype("auto", "cpu") == torch.float32
    assert T._torch_dtype("float32", "cuda") == torch.float32  # an explicit type is kept

    class Recorded:  # CTranslate2's Translator on a GPU this machine lacks: what it is asked for
        def __init__(self, path, **kwargs):
            asked.append(kwargs)

    monkeypatch.setattr(ctranslate2, "Translator", Recorded)
    queried = []  # CTranslate2 is asked for its own types on the device (torch may be a CPU build)
    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", lambda device, index=0: queried.append(
        (device, index)) or ({"float32", "float16", "bfloat16"} if bf16_units else {"float32", "float16"}))
    T.load_translator("ctranslate2", ct2["nllb"], src_lang="en", tgt_lang="de", device="cuda:1", **OPTIONS)
    assert queried == [("cuda", 1)]
    T.load_translator("ctranslate2", ct2["nllb"], src_lang="en", tgt_lang="de", device="cuda",
                      compute_type="auto", **OPTIONS)
    assert [kwargs["compute_type"] for kwargs in asked] == ["bfloat16" if bf16_units else "float16", "auto"]
    assert [(kwargs["device"], kwargs["device_index"]) for kwargs in asked] == [("cuda", 1), ("cuda", 0)]


@pytest.mark.parametrize("family", ["nllb", "m2m100"])
def test_ctranslate2_tokens_and_agreement_with_transformers(family, ct2, nllb, m2m100, units):
    _, frame = units
    texts = frame["text"].tolist()
    hf = T.load_translator("transformers", {"nllb": nllb, "m2m100": m2m100}[family],
                           src_lang="en", tgt_lang="de", **OPTIONS)
    fast = T.load_translator("ctranslate2", ct2[family], src_lang="en", tgt_lang="de", **OPTIONS)
    src, tgt = {"nllb": ("eng_Latn", "deu_Latn"), "m2m100": ("__en__", "__de__")}[family]

    sources = fast.encode(texts)
    assert sources == hf.encode(texts)  # the same tokenizer, saved with the conversion
    tokens = fast.source_tokens(sources)
    assert all(t[0] == src and t[-1] == "</s>" for t in tokens)
    raw = fast.translator.translate_batch(tokens[:3], target_prefix=[[tgt]] * 3, beam_size=1,
                                          max_decoding_length=8)
    assert [r.hypotheses[0][0] for r in raw] == [tgt] * 3  # the target language comes first

    targets = fast.generate(sources)
    assert targets == hf.generate(sources)  # same weights, greedy: the same tokens
    assert fast.decode(targets) == hf.decode(targets)


def test_ctranslate2_translate_shard_equals_transformers(ct2, root, units, reference):
    path, _ = units
    out = T.translate_shard(path, root / "ct2.parquet", engine="ctranslate2", model=ct2["nllb"],
                            tgt_lang="de", batch_size=4, checkpoint_every=2, compute_type="float32", **OPTIONS)
    pd.testing.assert_frame_equal(pd.read_parquet(out), reference)


def test_ctranslate2_int8_conversion_translates(ct2, root, m2m100, units):
    path, frame = units
    converted = T.convert_checkpoint(f"local:{m2m100}", root / "m2m100-int8", quantization="int8")
    assert json.loads((converted / T.CONVERSION_INFO).read_text())["quantization"] == "int8"
    out = pd.read_parquet(T.translate_shard(path, root / "int8.parquet", engine="ctranslate2",
                                            model=converted, tgt_lang="nb", batch_size=16, **OPTIONS))
    assert list(out["unit_id"]) == list(frame["unit_id"]) and out["translation"].map(type).eq(str).all()
