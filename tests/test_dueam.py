"""DuEAM (modsent.methods.dueam): the loss terms against a hand computation, the WMD against a
linear program, the pairs, the content-addressed WMD cache, training a tiny random encoder
that reloads with plain sentence-transformers, resumption bit for bit, bad input."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from modsent import losses, methods
from modsent.io import InputError
from modsent.methods import dueam
from modsent.methods.dueam import pairs as dp
from modsent.methods.dueam import training as dt
from modsent.methods.dueam import wmd as dw
from modsent.methods.dueam.settings import DuEAMConfig
from modsent.training import efficiency
from tiny_modules import (assert_same_model, assert_stored_in_half, counted_training_passes, padding_of, pairs_in,
                          recorded_training_data, tiny_base_and_data)

LANGS = ["en", "de", "ky"]
# the built-in pairs have no mnli rows, and their negatives are other countries, not contradictions
# (the demo's choice; test_weak_pairs_with_contradictions covers the default); a tiny random
# model moves only with a large learning rate
SETTINGS = {"datasets": None, "contradictions": False, "eval_pairs": 10, "batch_size": 8, "max_steps": 3, "learning_rate": 1e-3,
            "warmup_steps": 1, "log_every": 1, "seq_len": 32}
TEXTS = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence."]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny random XLM-R base (sentence-transformers) and the built-in pairs and human
    translations in en, de, ky (the same pair ids)."""
    from modsent.data.paraphrase import align_provided
    from modsent.sources.builtin import builtin_translations

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dueam")
    base, english, units = tiny_base_and_data(root)
    paths, translations = {}, {}
    for lang in LANGS:
        frame = english if lang == "en" else pairs_in(lang, english, units)
        paths[lang] = root / f"pairs-{lang}.parquet"
        frame.to_parquet(paths[lang], index=False)
        if lang != "en":
            translated, _ = align_provided(units, builtin_translations(lang), lang)
            translations[lang] = root / f"translations-{lang}.parquet"
            translated[["unit_id", "text", "translation"]].to_parquet(translations[lang], index=False)
    return {"root": root, "base": base, "paths": paths, "translations": translations,
            "inputs": {"base": base, "pairs": paths, "translations": translations}}


def config(**settings) -> DuEAMConfig:
    return DuEAMConfig.from_settings("DuEAM-weak", {**SETTINGS, **settings})


# ---- the loss terms ------------------------------------------------------------------------------


def test_each_loss_term_is_the_paper_s_formula_by_hand():
    s = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]], dtype=torch.float64)
    t = torch.tensor([[0.0, 1.0, 2.0], [0.5, 1.0, 1.0]], dtype=torch.float64)
    wmd = torch.tensor([0.3, 1.7], dtype=torch.float64)
    # by hand: d_euc = sqrt(1 + 1 + 0) = sqrt 2, sqrt(0 + 4 + 1) = sqrt 5
    d_euc = [math.sqrt(2), math.sqrt(5)]
    la = (math.exp(abs(math.exp(-d_euc[0]) - math.exp(-0.3))) + math.exp(abs(math.exp(-d_euc[1]) - math.exp(-1.7)))) / 2
    # cos = s.t / (|s| |t|): (0 + 0 + 4) / (sqrt 5 sqrt 5), (0.25 - 1 + 0) / (sqrt 1.25 sqrt 2.25)
    lb = (4 / 5 + (-0.75) / (math.sqrt(1.25) * math.sqrt(2.25))) / 2
    assert losses.WMDAnchorLoss()(s, t, wmd).item() == pytest.approx(la, rel=1e-6)
    assert losses.MeanPairCosine()(s, t).item() == pytest.approx(lb, rel=1e-6)
    assert losses.DuEAMLoss()(s, t, wmd).item() == pytest.approx(la - 0.003 * lb, rel=1e-6)
    assert losses.DuEAMLoss(0.5)(s, t, wmd).item() == pytest.approx(la - 0.5 * lb, rel=1e-6)
    assert losses.DuEAMLoss(objective="LA")(s, t, wmd).item() == pytest.approx(la, rel=1e-6)
    assert losses.DuEAMLoss(objective="LB")(s, t, wmd).item() == pytest.approx(-lb, rel=1e-6)
    # L_A is at its minimum, 1, where d_euc = d_wmd; the WMD gets no gradient; equal vectors
    # (d_euc = 0) give a finite gradient
    exact = torch.tensor([math.sqrt(2), math.sqrt(5)], dtype=torch.float64)
    assert losses.WMDAnchorLoss()(s, t, exact).item() == pytest.approx(1.0)
    x = s.clone().requires_grad_(True)
    w = wmd.clone().requires_grad_(True)
    losses.DuEAMLoss()(x, x.detach().clone(), w).backward()
    assert torch.isfinite(x.grad).all() and w.grad is None
    with pytest.raises(ValueError, match="objective"):
        losses.DuEAMLoss(objective="both")
    with pytest.raises(ValueError, match="one target and one WMD per source"):
        losses.WMDAnchorLoss()(s, t, wmd[:1])


# ---- the word mover's distance -------------------------------------------------------------------


def emd_by_linear_program(x, y, wx, wy, ground_cost):
    """The earth mover's distance as a linear program over the transport plan (scipy's HiGHS),
    with the ground cost written out independently."""
    from scipy.optimize import linprog

    n, m = len(x), len(y)
    if ground_cost == "cosine":
        cost = np.array([[1 - np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)) for v in y] for u in x])
    else:
        cost = np.array([[np.sum((u - v) ** 2) for v in y] for u in x])
        cost = np.sqrt(cost) if ground_cost == "euclidean" else cost
    rows = np.zeros((n, n * m))
    cols = np.zeros((m, n * m))
    for i in range(n):
        rows[i, i * m:(i + 1) * m] = 1
    for j in range(m):
        cols[j, j::m] = 1
    result = linprog(cost.ravel(), A_eq=np.vstack([rows, cols]), b_eq=np.concatenate([wx, wy]),
                     bounds=(0, None), method="highs")
    assert result.success
    return result.fun


@pytest.mark.parametrize("ground_cost", ["euclidean", "sqeuclidean", "cosine"])
def test_wmd_equals_the_linear_program(ground_cost):
    rng = np.random.default_rng(0)
    for n, m in [(1, 1), (3, 5), (7, 4), (9, 9)]:
        x, y = rng.normal(size=(n, 6)), rng.normal(size=(m, 6))
        wx, wy = rng.random(n) + 0.1, rng.random(m) + 0.1
        wx, wy = wx / wx.sum(), wy / wy.sum()
        assert dw.word_movers_distance(x, y, wx, wy, ground_cost) == pytest.approx(
            emd_by_linear_program(x, y, wx, wy, ground_cost), abs=1e-8)
        uniform = emd_by_linear_program(x, y, np.full(n, 1 / n), np.full(m, 1 / m), ground_cost)
        assert dw.word_movers_distance(x, y, ground_cost=ground_cost) == pytest.approx(uniform, abs=1e-8)
    same = rng.normal(size=(4, 6))
    assert dw.word_movers_distance(same, same[::-1], ground_cost=ground_cost) == pytest.approx(0.0, abs=1e-9)


def test_idf_is_moverscore_s():
    idf = dw.idf_table([[1, 2, 2], [2, 3], [2]])
    assert idf[2] == pytest.approx(math.log(4 / 4)) and idf[1] == pytest.approx(math.log(4 / 2))
    assert dw.token_masses([1, 2], idf).tolist() == pytest.approx([math.log(2), 0.0])
    assert dw.token_masses([2], idf) is None  # every mass 0: uniform


def test_anchor_token_vectors_are_the_layer_s_states_without_special_tokens(data):
    anchor = dw.Anchor(data["base"], layer=-1)
    vectors = anchor.token_vectors(TEXTS[:2], batch_size=1)
    batch = anchor.tokenizer([TEXTS[1]], return_tensors="pt")
    with torch.no_grad():
        states = anchor.body(**batch, output_hidden_states=True).hidden_states
    expected = torch.nn.functional.normalize(states[-1][0, 1:-1], dim=-1).double().numpy()  # <s> ... </s> dropped
    assert vectors[1].shape == expected.shape and np.allclose(vectors[1], expected, atol=1e-5)
    assert np.allclose(np.linalg.norm(vectors[0], axis=1), 1.0)
    # other settings: the embeddings layer, special tokens kept, no normalisation
    raw = dw.Anchor(data["base"], layer=0, special_tokens="keep", normalize_tokens=False).token_vectors([TEXTS[1]])
    assert np.allclose(raw[0], states[0][0].double().numpy(), atol=1e-5)
    with pytest.raises(InputError, match="anchor_layer 9: .* has 2 layers"):
        dw.Anchor(data["base"], layer=9)


# ---- the pairs -----------------------------------------------------------------------------------


def test_weak_pairs_are_mono_and_english_crosslingual_of_one_pair_id(data):
    pairs = dp.build_pairs(data["paths"], None, config())
    rows = pairs.rows
    indexed = {lang: pd.read_parquet(p).set_index("pair_id") for lang, p in data["paths"].items()}
    for row in rows.itertuples(index=False):
        assert row.text_a == indexed[row.lang_a].at[row.group, "anchor"]
        assert row.text_b == indexed[row.lang_b].at[row.group, "positive"]
        assert row.kind == ("mono" if row.lang_a == row.lang_b else "cross")
        assert "en" in (row.lang_a, row.lang_b) or row.lang_a == row.lang_b  # no de-ky pairs
        assert row.text_a != row.text_b
    assert set(pairs.stats["pairs_by_languages"]) == {"en-en", "de-de", "ky-ky", "en-de", "de-en", "en-ky", "ky-en"}
    held = set(pairs.heldout["en"]["pair_id"])
    assert held and not held & set(rows["group"])  # held-out pair ids leave every language's pairs
    per_id = rows.groupby("group").size()
    assert per_id.max() == 3 + 2 * 2 and (per_id == 7).mean() > 0.7  # less where texts are equal
    pd.testing.assert_frame_equal(dp.build_pairs(data["paths"], None, config()).rows, rows)  # pure

    sampled = dp.build_pairs(data["paths"], None, config(max_pairs=50))
    assert len(sampled.rows) == 50 and set(sampled.rows["text_a"]) <= set(rows["text_a"])


def test_weak_pairs_with_contradictions_pair_each_anchor_with_both_hypotheses(data):
    """The default, as the paper trains on XNLI with its labels dropped: every pair of the
    anchor/positive set again with the row's negative (the contradiction) as second side, mono
    and English<->X, where the row has one; rows without a negative add nothing."""
    plain = dp.build_pairs(data["paths"], None, config()).rows
    both = dp.build_pairs(data["paths"], None, config(contradictions=True))
    rows = both.rows
    indexed = {lang: pd.read_parquet(p).set_index("pair_id") for lang, p in data["paths"].items()}
    negatives = {(lang, pair_id): text for lang, frame in indexed.items()
                 for pair_id, text in frame["negative"].items() if isinstance(text, str) and text.strip()}
    with_negative = rows[[(row.lang_b, row.group) in negatives and row.text_b == negatives[row.lang_b, row.group]
                          for row in rows.itertuples(index=False)]]
    for row in rows.itertuples(index=False):
        assert row.text_a == indexed[row.lang_a].at[row.group, "anchor"]
        assert row.text_b in (indexed[row.lang_b].at[row.group, "positive"], negatives.get((row.lang_b, row.group)))
    # the anchor/positive pairs are all still there, in the same order
    positive = rows[[row.text_b == indexed[row.lang_b].at[row.group, "positive"] for row in rows.itertuples(index=False)]]
    pd.testing.assert_frame_equal(positive.reset_index(drop=True), plain)
    # one contradiction pair per (pair id, direction) whose second language's row has a negative
    ids = set(plain["group"])
    expected = sum(1 for group in ids for lang_a, lang_b in
                   [(x, x) for x in LANGS] + [(a, b) for x in LANGS if x != "en" for a, b in (("en", x), (x, "en"))]
                   if (lang_b, group) in negatives and indexed[lang_a].at[group, "anchor"] != negatives[lang_b, group])
    assert len(with_negative) == expected > 0.5 * len(plain)
    assert set(rows["kind"]) == {"mono", "cross"}
    assert DuEAMConfig().contradictions  # the default


def test_unsupervised_pairs_re_pair_the_same_sentences_across_pair_ids(data):
    weak = dp.build_pairs(data["paths"], None, config()).rows
    unsup = dp.build_pairs(data["paths"], None, config(data="unsup")).rows
    assert len(unsup) == len(weak) and (unsup["kind"] == "random").all()
    assert unsup["text_a"].tolist() == weak["text_a"].tolist()
    assert sorted(unsup["text_b"]) == sorted(weak["text_b"])  # a permutation of the second sides
    positives = {lang: set(pd.read_parquet(p).set_index("pair_id")["positive"].items())
                 for lang, p in data["paths"].items()}
    own = [(row.group, row.text_b) in positives[row.lang_b] for row in unsup.itertuples(index=False)]
    assert not any(own)  # no pair keeps a text of its own pair id
    assert (unsup["text_a"] != unsup["text_b"]).all()
    other = dp.build_pairs(data["paths"], None, config(data="unsup", seed=1)).rows
    assert not other["text_b"].equals(unsup["text_b"])


def test_parallel_pairs_come_from_the_translations_without_held_out_texts(data):
    pairs = dp.build_pairs(data["paths"], data["translations"], config(data="parallel"))
    rows = pairs.rows
    assert set(rows["kind"]) == {"parallel"} and set(rows["lang_a"]) == {"en"}
    assert set(rows["lang_b"]) == {"de", "ky"}
    held = pairs.heldout["en"]
    assert not set(rows["text_a"]) & (set(held["anchor"]) | set(held["positive"]))
    both = dp.build_pairs(data["paths"], data["translations"], config(data="weak+parallel", max_pairs=40))
    kinds = both.stats["pairs_by_kind"]
    assert kinds["parallel"] == 40 and kinds["mono"] + kinds["cross"] == 40  # max_pairs caps each part
    with pytest.raises(InputError, match="no translation file for de, ky"):
        dp.build_pairs(data["paths"], None, config(data="parallel"))


def test_bad_input_is_a_clear_error(data, tmp_path):
    frame = pd.read_parquet(data["paths"]["de"])
    frame.loc[3, "positive"] = "  "
    broken = {**data["paths"], "de": tmp_path / "de.parquet"}
    frame.to_parquet(broken["de"], index=False)
    pair_id = frame.loc[3, "pair_id"]
    with pytest.raises(InputError, match=rf"de\.parquet: pair '{pair_id}' \(de\) has an empty positive"):
        dp.build_pairs(broken, None, config())
    translated = pd.read_parquet(data["translations"]["ky"])
    translated.loc[0, "translation"] = ""
    bad = {**data["translations"], "ky": tmp_path / "ky.parquet"}
    translated.to_parquet(bad["ky"], index=False)
    with pytest.raises(InputError, match="ky.parquet: unit .* has an empty translation"):
        dp.build_pairs(data["paths"], bad, config(data="parallel"))
    with pytest.raises(InputError, match=r"methods\.X\.datasets \['mnli'\] selects no row .*builtin-countries"):
        dp.build_pairs(data["paths"], None, config(datasets=["mnli"]), key="methods.X")
    with pytest.raises(InputError, match=r"methods\.DuEAM-weak: unknown key\(s\) lr"):
        DuEAMConfig.from_settings("DuEAM-weak", {"lr": 1})


# ---- the WMD stage and its cache -----------------------------------------------------------------


def test_the_wmd_cache_computes_each_pair_once_and_a_changed_setting_recomputes(data, tmp_path):
    cache, cfg = tmp_path / "cache", config()
    n = len(dp.build_pairs(data["paths"], None, cfg).rows)
    first = dw.run_shard(data["paths"], None, cfg, data["base"], 0, 1, tmp_path / "a.parquet", cache_dir=cache)
    assert first["pairs"] == n and first["cached"] == 0 and 0 < first["computed"] <= n  # equal pairs once
    again = dw.run_shard(data["paths"], None, cfg, data["base"], 0, 1, tmp_path / "b.parquet", cache_dir=cache)
    assert again["computed"] == 0 and again["cached"] == n
    a, b = pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet")
    assert a["d_wmd"].equals(b["d_wmd"]) and b["cached"].all()
    # a training setting changes no pair and no distance: nothing recomputed
    trained = dw.run_shard(data["paths"], None, config(learning_rate=0.5, objective="LA"), data["base"], 0, 1,
                           tmp_path / "c.parquet", cache_dir=cache)
    assert trained["computed"] == 0
    # an anchor setting changes every distance: everything recomputed
    layer = dw.run_shard(data["paths"], None, config(anchor_layer=1), data["base"], 0, 1, tmp_path / "d.parquet",
                         cache_dir=cache)
    assert layer["cached"] == 0 and layer["computed"] == first["computed"]
    assert not pd.read_parquet(tmp_path / "d.parquet")["d_wmd"].equals(a["d_wmd"])
    idf = dw.run_shard(data["paths"], None, config(token_weights="idf"), data["base"], 0, 1, tmp_path / "e.parquet",
                       cache_dir=cache)
    assert idf["cached"] == 0
    # the cache holds the union; the distances equal a direct computation
    assert len(dw.WMDCache(cache)) == first["computed"] + layer["computed"] + idf["computed"]
    pairs = dp.build_pairs(data["paths"], None, cfg)
    anchor = dw.anchor_for(cfg, data["base"])
    row = pairs.rows.iloc[5]
    x, y = anchor.token_vectors([row["text_a"], row["text_b"]])
    assert a["d_wmd"][5] == pytest.approx(dw.word_movers_distance(x, y), abs=1e-6)  # float32 states, padded
    # shards: together every pair once, the same distances (from the cache)
    parts = [dw.run_shard(data["paths"], None, config(wmd_shards=2), data["base"], i, 2,
                          tmp_path / f"s{i}.parquet", cache_dir=cache) for i in range(2)]
    assert sum(p["pairs"] for p in parts) == n and all(p["computed"] == 0 and p["pairs"] for p in parts)
    values, stats = dw.read_wmd([tmp_path / "s0.parquet", tmp_path / "s1.parquet"], pairs)
    assert np.array_equal(values, a["d_wmd"].to_numpy()) and stats["pairs"] == n and stats["shards"] == 2
    with pytest.raises(InputError, match="do not cover the .* training pairs"):
        dw.read_wmd([tmp_path / "s0.parquet"], pairs)
    with pytest.raises(InputError, match="were made for other pairs"):
        dw.read_wmd([tmp_path / "a.parquet"], dp.build_pairs(data["paths"], None, config(data="unsup")))


def test_texts_longer_than_the_anchor_s_limit_are_truncated_and_counted(data, tmp_path):
    frame = pd.read_parquet(data["paths"]["en"])
    long_text = " ".join(["word"] * 40)
    frame.loc[0, "anchor"] = long_text
    paths = {"en": tmp_path / "en.parquet"}
    frame.to_parquet(paths["en"], index=False)
    cfg = DuEAMConfig.from_settings("DuEAM-weak", {**SETTINGS, "anchor_max_length": 8})
    stats = dw.run_shard(paths, None, cfg, data["base"], 0, 1, tmp_path / "w.parquet", cache_dir=None)
    rows = dp.build_pairs(paths, None, cfg).rows
    tokenizer = dw.Anchor(data["base"]).tokenizer
    truncated = [t for t in set(rows["text_a"]) | set(rows["text_b"]) if len(tokenizer(t)["input_ids"]) > 8]
    assert long_text in truncated and stats["truncated_texts"] == len(truncated) and stats["anchor_max_length"] == 8
    assert np.isfinite(pd.read_parquet(tmp_path / "w.parquet")["d_wmd"]).all()  # scored, not dropped


# ---- training ------------------------------------------------------------------------------------


def test_dueam_methods_are_registered_with_the_paper_s_defaults():
    registry = methods.load()
    for name in ("DuEAM-weak", "DuEAM-unsup", "DuEAM-parallel", "DuEAM-LA-only", "DuEAM-LB-only"):
        assert name in registry and "translations" in registry[name].uses
    properties = registry["DuEAM-weak"].schema()["properties"]
    defaults = {key: value["default"] for key, value in properties.items()}
    assert (defaults["lambda"], defaults["epochs"], defaults["batch_size"], defaults["warmup_steps"],
            defaults["learning_rate"]) == (0.003, 5, 64, 10000, 2e-5)
    assert (defaults["anchor_layer"], defaults["token_weights"], defaults["special_tokens"],
            defaults["normalize_tokens"], defaults["ground_cost"]) == (-1, "uniform", "drop", True, "euclidean")
    assert registry["DuEAM-unsup"].schema()["properties"]["data"]["default"] == "unsup"
    assert registry["DuEAM-LB-only"].schema()["properties"]["objective"]["default"] == "LB"
    assert {k for k, v in properties.items() if v.get("x-role") == "runtime"} == {
        "wmd_batch_size", "log_every", "checkpoint_every", "compile", "gpus",  # gpus: DuEAM is data-parallel
        "resources"}  # every method's: its job's SLURM request
    # the WMD jobs' params: the pairs' and the distances' settings, no training setting
    job = dueam.wmd_job_settings(defaults)
    assert "learning_rate" not in job and "lambda" not in job and {"seed", "anchor_layer", "data"} <= set(job)
    # methods with the same pairs and anchor share the WMD jobs; other pairs get their own
    digest = dueam.wmd_digest(defaults)
    assert registry["DuEAM-weak"].extra_inputs("b", {**defaults, "wmd_shards": 2}, LANGS) == {"wmd": [
        f"results/b/methods/DuEAM.wmd/{digest}/0-of-2.parquet", f"results/b/methods/DuEAM.wmd/{digest}/1-of-2.parquet"]}
    assert dueam.wmd_digest({**defaults, "objective": "LA", "lambda": 1.0, "epochs": 1}) == digest
    assert digest not in (dueam.wmd_digest({**defaults, "data": "unsup"}),
                          dueam.wmd_digest({**defaults, "anchor_layer": 2}))
    configured = {"DuEAM-weak": defaults, "DuEAM-LA-only": {**defaults, "objective": "LA"}, "mST5-en": {}}
    assert dueam.wmd_settings_of(configured, digest) == {"settings": job, "methods": ["DuEAM-weak", "DuEAM-LA-only"]}
    assert dueam.wmd_inputs({"data": "parallel", "model": "x/y"}, "b", LANGS) == {
        "pairs": [f"results/paraphrase/{lang}.parquet" for lang in LANGS],
        "translations": ["results/translation/de.parquet", "results/translation/ky.parquet"]}


def test_a_tiny_encoder_trains_every_weight_and_reloads_with_sentence_transformers(data, tmp_path):
    from sentence_transformers import SentenceTransformer

    methods.load()
    cfg = config()
    dw.run_shard(data["paths"], None, cfg, data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=tmp_path / "c")
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    metrics = methods.get("DuEAM-weak").train(inputs, tmp_path / "out", SETTINGS, device="cpu", progress=False)
    assert metrics["steps"] == 3 and metrics["objective"] == "joint" and metrics["lambda"] == 0.003
    assert 0 < metrics["padding_fraction"] < 1
    assert metrics["model_flops"] > 0 and metrics["model_tflops_per_second"] > 0
    assert metrics["mfu"] is None and metrics["gpu_peak_memory_gib"] is None  # the CPU: no peak
    # every weight trains but the body's pooler, which mean pooling never uses: saved as drawn
    saved_weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    pooler = {k: v for k, v in saved_weights.items() if k.startswith("pooler.")}
    assert pooler and metrics["trainable_parameters"] == metrics["total_parameters"] - sum(
        v.numel() for v in pooler.values())
    drawn = dict(dt.build_learner(data["base"], cfg).encoder.named_parameters())
    assert all(torch.equal(v, drawn[k]) for k, v in pooler.items())
    assert metrics["wmd"]["pairs"] == metrics["train_pairs"] and metrics["anchor_truncated_texts"] == 0
    assert metrics["loss_components"]["columns"] == ["step", "L_A", "L_B"]
    la, lb = metrics["L_A_first"], metrics["L_B_first"]
    assert metrics["loss_first"] == pytest.approx(la - 0.003 * lb, rel=1e-5)
    assert not (tmp_path / "out.checkpoint").exists()

    # the same run in memory (the WMD computed in-process, no shard files) encodes as the saved directory
    result = dt.run_training("DuEAM-weak", data["inputs"], cfg, device="cpu", progress=False)
    assert result.metrics["loss_first"] == metrics["loss_first"]
    ours = result.model.encode(TEXTS, normalize=False)
    reloaded = SentenceTransformer(str(tmp_path / "out"), device="cpu")
    assert [type(m).__name__ for m in reloaded] == ["Transformer", "Pooling"]  # mean pooling, unnormalised
    pooling = json.loads(next((tmp_path / "out").glob("1_Pooling/config.json")).read_text())
    assert pooling["pooling_mode"] == "mean"
    theirs = reloaded.encode(TEXTS, prompt="")
    assert np.allclose(ours, theirs, atol=1e-4)
    base = SentenceTransformer(str(data["base"]), device="cpu")
    changed = load_file(str(tmp_path / "out" / "model.safetensors"))
    original = base[0].auto_model.state_dict()
    assert sum(not torch.equal(v, original[k]) for k, v in changed.items() if k in original) > 0.9 * len(changed)
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert -1 <= saved["heldout_cosine_unrelated_after"] <= 1 and -1 <= saved["heldout_cosine_related_after"] <= 1

    # the held-out measures against loops over the vectors: the pivot's pairs joined by pair id
    texts = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence.",
             "The password was changed.", "Das Passwort wurde geändert.", "Good morning", "Hello world"]
    heldout = {"en": pd.DataFrame({"pair_id": ["p1", "p2", "p3"], "anchor": texts[3:6],
                                   "positive": texts[6:8] + texts[:1]}),
               "de": pd.DataFrame({"pair_id": ["p3", "p9", "p1", "p2"], "anchor": texts[4:8],
                                   "positive": texts[:4]})}
    measured = dt.evaluate_heldout(result.model, heldout, "en", 2, "fp32")
    unit = {}
    for lang, frame in heldout.items():
        for column in ("anchor", "positive"):
            vectors = result.model.encode(frame[column].tolist(), 3, normalize=False)
            unit[lang, column] = [v / math.sqrt(float(v @ v)) for v in vectors]

    def accuracy(a, p):
        return np.mean([max(range(len(p)), key=lambda j: float(a[i] @ p[j])) == i for i in range(len(a))])

    for lang, frame in heldout.items():
        assert measured["mono"][lang] == pytest.approx(accuracy(unit[lang, "anchor"], unit[lang, "positive"]))
        rows = {pid: i for i, pid in enumerate(frame["pair_id"])}
        shared = [(i, rows[pid]) for i, pid in enumerate(heldout["en"]["pair_id"]) if pid in rows]
        a = [unit["en", "anchor"][i] for i, _ in shared]
        p = [unit[lang, "positive"][j] for _, j in shared]
        cos = [[float(x @ y) for y in p] for x in a]
        n = len(shared)
        assert measured["spread"]["related"][f"en-{lang}"] == pytest.approx(np.mean([cos[i][i] for i in range(n)]),
                                                                           abs=1e-5)
        assert measured["spread"]["unrelated"][f"en-{lang}"] == pytest.approx(
            np.mean([cos[i][j] for i in range(n) for j in range(n) if i != j]), abs=1e-5)
        if lang != "en":
            assert measured["cross"][f"en-{lang}"] == pytest.approx(accuracy(a, p))
    assert measured["spread"]["unrelated_mean"] == pytest.approx(np.mean(list(measured["spread"]["unrelated"].values())))

    # the learner's truncation is counted too
    short = dt.run_training("DuEAM-weak", inputs, DuEAMConfig.from_settings("DuEAM-weak", {**SETTINGS, "seq_len": 4}),
                            device="cpu", progress=False)
    assert short.metrics["learner_truncated_texts"] > 0


def test_the_model_flops_are_what_the_flop_counter_counts_for_a_step(data):
    """model_flops (metrics.json): the loop counts the masks of each step's one pass over both
    sides' texts, through the learner's body shape (every weight trains), 6N per token. PyTorch's
    FLOP counter on the same steps' loss and backward agrees (eager attention; a pair of two texts
    of one length per step: no padding, which the counter would count)."""
    from torch.utils.flop_counter import FlopCounterMode

    from modsent.training.loop import TrainingLog

    cfg = config()
    model = dt.build_learner(data["base"], cfg)
    model.encoder.set_attn_implementation("eager")
    shape = efficiency.start(model.encoder, "cpu")
    assert shape[1:] == (2, 32)
    english = pd.read_parquet(data["paths"]["en"])
    rows = pd.DataFrame({"text_a": english["anchor"].iloc[:3], "text_b": english["anchor"].iloc[:3]})
    loss_fn = losses.DuEAMLoss(cfg.lambda_, cfg.objective)
    log = TrainingLog(len(rows), 0, "test", False, 10)
    with FlopCounterMode(display=False) as counter:
        for step in range(len(rows)):
            features = model.features(dt.pair_texts(rows.iloc[[step]]))
            sources, targets = dt.pair_embeddings(model, rows.iloc[[step]], features)
            loss_fn(sources, targets, torch.tensor([0.5])).backward()
            log.record(step, 0.0, 0.0, 1, features)
    log.close()
    assert log.padded == 0 and log.tokens > 2 * 3 * len(rows)
    ours = log.efficiency(shape, 1.0, "cpu")["model_flops"]
    assert ours == efficiency.encoder_flops(shape, log.tokens, log.token_squares)
    # N holds the biases and LayerNorms, which no product computes (13 of 12·d + 13 per d² at d = 32)
    assert 0.95 * ours < counter.get_total_flops() <= ours


def test_grouped_batches_hold_every_pair_once_keep_each_kind_and_the_run_trains_on_them(data, monkeypatch):
    """``length_groups``: the run's batches are its pairs grouped by length within each kind and
    pair of languages (``grouped_runs``), every pair once an epoch, padding less than its random
    batches, which are still the seeded permutation cut into runs; the metrics record it."""
    from modsent.training.pairs import grouped_runs, row_strata, text_lengths

    made = recorded_training_data(monkeypatch)
    result = dt.run_training("DuEAM-weak", data["inputs"], config(length_groups=4, max_steps=1), device="cpu",
                             progress=False)
    assert result.metrics["config"]["length_groups"] == 4
    (run,) = made
    rows = run.rows
    assert set(rows["kind"]) == {"mono", "cross"}
    grouped = run.epoch_batches(0)
    assert grouped == grouped_runs(text_lengths(rows, ("text_a", "text_b")), 8, 0, 0, 4,
                                   row_strata(rows, ("kind", "lang_a", "lang_b")))
    assert sorted(i for batch in grouped for i in batch) == list(range(len(rows)))
    random_ = dt.epoch_batches(rows, 8, 0)(0)
    order = np.random.default_rng([0, 0]).permutation(len(rows)).tolist()
    assert random_ == [order[i:i + 8] for i in range(0, len(rows), 8)]  # as before the setting existed
    columns = ["text_a", "text_b"]
    assert padding_of(rows, grouped, columns) < padding_of(rows, random_, columns)


def test_a_killed_run_resumes_to_the_weights_of_an_unbroken_one(data, tmp_path):
    settings = {**SETTINGS, "max_steps": 5, "checkpoint_every": 2}
    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=None)
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    straight = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "straight", settings, device="cpu", progress=False)

    class Killed(Exception):
        pass

    def kill(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        dt.train_dueam("DuEAM-weak", inputs, tmp_path / "resumed", settings, device="cpu", progress=False,
                       on_step=kill)
    assert (tmp_path / "resumed.checkpoint").is_dir() and not (tmp_path / "resumed").exists()
    resumed = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "resumed", settings, device="cpu", progress=False)
    assert resumed["resumed_from_step"] == 2 and straight["resumed_from_step"] == 0
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    for key in ("loss_first", "loss_last", "steps", "loss_components", "heldout_retrieval_accuracy_before",
                "heldout_retrieval_accuracy_after", "heldout_cosine_unrelated_after"):
        assert resumed[key] == straight[key], key
    assert (tmp_path / "resumed" / "loss.tsv").read_text() == (tmp_path / "straight" / "loss.tsv").read_text()
    # a checkpoint of other settings is not resumed
    with pytest.raises(Killed):
        dt.train_dueam("DuEAM-weak", inputs, tmp_path / "other", settings, device="cpu", progress=False,
                       on_step=kill)
    other = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "other", {**settings, "lambda": 0.1}, device="cpu",
                           progress=False)
    assert other["resumed_from_step"] == 0


# ---- the workflow --------------------------------------------------------------------------------


def test_storage_dtype_float16_saves_the_same_training_rounded(data, tmp_path):
    """methods.DuEAM-weak.storage_dtype: the same training (and checkpoint fingerprint), the
    saved learner the float32 run's rounded to float16."""
    methods.load()
    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=tmp_path / "c")
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    metrics = {dtype: methods.get("DuEAM-weak").train(inputs, tmp_path / dtype, {**SETTINGS, "storage_dtype": dtype},
                                                      device="cpu", progress=False) for dtype in ("float32", "float16")}
    assert metrics["float16"]["loss_last"] == metrics["float32"]["loss_last"]
    assert_stored_in_half(tmp_path / "float32", tmp_path / "float16", TEXTS)
    fingerprints = {dt.training_fingerprint("DuEAM-weak", config(storage_dtype=dtype), str(data["base"]), inputs)
                    for dtype in ("float32", "float16")}
    assert len(fingerprints) == 1


def test_steps_tokenised_ahead_on_a_thread_train_what_tokenising_in_the_step_trains(data, tmp_path, monkeypatch):
    """Each step's texts are tokenised and its WMD targets pinned on a thread during the step
    before (loop.ahead), and the losses read back at the logged steps: the same weights, curve
    and loss components as the plain loop, bit for bit."""
    from modsent.training import loop

    settings = {**SETTINGS, "max_steps": 3, "log_every": 2}
    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=None)
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    threaded = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "threaded", settings, device="cpu", progress=False)
    monkeypatch.setattr(dt, "ahead", lambda items, prepare: loop.ahead(items, prepare, enabled=False))
    passes = counted_training_passes(monkeypatch)
    serial = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "serial", settings, device="cpu", progress=False)
    assert_same_model(tmp_path / "threaded", tmp_path / "serial", threaded, serial)
    # the model FLOPs: each step's one pass over both sides' texts, through every weight of the learner
    shape = efficiency.body_shape(dt.build_learner(data["base"], config(**settings)).encoder)
    assert serial["model_flops"] == threaded["model_flops"] == efficiency.encoder_flops(
        shape, passes.tokens, passes.token_squares)


def test_the_checkpoint_outlives_a_failure_at_the_last_barrier(data, tmp_path, monkeypatch):
    """The main process writes the output, then waits for the others at a barrier: the checkpoint
    is removed only after it, so a process group that fails there (another process crashed)
    leaves the checkpoint for the rerun, which resumes near the end instead of from scratch.
    Shown in one process, whose barrier fails as a group's would."""
    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=None)
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}

    def failed_group():
        raise RuntimeError("another process of the group failed")

    monkeypatch.setattr(dt.distributed, "barrier", failed_group)
    with pytest.raises(RuntimeError, match="another process"):
        dt.train_dueam("DuEAM-weak", inputs, tmp_path / "out", {**SETTINGS, "checkpoint_every": 2}, device="cpu",
                       progress=False)
    assert (tmp_path / "out" / "model.safetensors").is_file()  # written before the barrier
    assert (tmp_path / "out.checkpoint").is_dir()


def test_a_learner_that_overflows_fp16_trains_in_fp32_where_auto_would_run_fp16(data, tmp_path, monkeypatch, caplog):
    """precision auto on a GPU without bf16 (V100, T4) means fp16, in which T5-family bodies
    overflow: DuEAM's learner then trains and is evaluated in fp32 (precision.for_model), as
    m-ST5's does. Shown on the CPU with such a GPU's answer and the tiny learner's family taken
    as fp16-unsafe: the run is the plain fp32 run, bit for bit."""
    from modsent.training import precision

    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=None)
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    plain = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "plain", SETTINGS, device="cpu", progress=False)
    monkeypatch.setattr(precision, "resolve",  # a GPU without bf16 units: auto is fp16
                        lambda device, mode="auto": "fp32" if mode == "fp32" else "fp16")
    monkeypatch.setattr(precision, "FP16_UNSAFE", (*precision.FP16_UNSAFE, "xlm-roberta"))
    scalers = []
    monkeypatch.setattr(dt, "grad_scaler", lambda device, mode: scalers.append(mode) or precision.grad_scaler(device, mode))
    with caplog.at_level("WARNING", logger="modsent.training.precision"):
        guarded = dt.train_dueam("DuEAM-weak", inputs, tmp_path / "guarded", SETTINGS, device="cpu", progress=False)
    assert scalers == ["fp32"]
    assert "has no bf16 and xlm-roberta overflows in fp16; fp32 instead" in caplog.text
    assert_same_model(tmp_path / "plain", tmp_path / "guarded", plain, guarded)


def test_compile_routes_the_learner_through_dynamo_and_trains_what_eager_trains(data, tmp_path, traced_compile):
    """methods.DuEAM-*.compile: the learner's encoder is compiled in place (Dynamo graphs run
    eagerly: the traced_compile fixture) and trains the eager run's weights, losses and loss
    components; the WMD targets and the checkpoint fingerprint do not depend on the setting."""
    modules, graphs = traced_compile
    dw.run_shard(data["paths"], None, config(), data["base"], 0, 1, tmp_path / "wmd.parquet", cache_dir=None)
    inputs = {**data["inputs"], "wmd": [tmp_path / "wmd.parquet"]}
    eager = dt.run_training("DuEAM-weak", inputs, config(), device="cpu", progress=False)
    assert modules == [] and graphs() == 0
    compiled = dt.run_training("DuEAM-weak", inputs, config(compile=True), device="cpu", progress=False)
    assert len(modules) == 1 and modules[0] is compiled.model.encoder and graphs() >= 1
    assert [row[1] for row in compiled.history] == pytest.approx([row[1] for row in eager.history], rel=1e-5)
    assert np.allclose(compiled.metrics["loss_components"]["rows"], eager.metrics["loss_components"]["rows"],
                       rtol=1e-5)
    a, b = eager.model.state_dict(), compiled.model.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert dt.training_fingerprint("DuEAM-weak", config(compile=True), str(data["base"]), inputs) == \
        dt.training_fingerprint("DuEAM-weak", config(), str(data["base"]), inputs)


def test_the_workflow_plans_one_wmd_job_per_shard_and_distinct_pairs(tmp_path):
    """DuEAM-weak and its loss ablation share their WMD jobs (the same pairs and anchor); other
    pairs get their own; training reads the shards. A dry run of the tests' tiny config."""
    import subprocess

    import yaml

    from conftest import REPO, snakemake_exe

    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    tiny = {"datasets": None, "max_steps": 2, "batch_size": 8, "warmup_steps": 1}
    config["methods"] = {"DuEAM-weak": {**tiny, "wmd_shards": 2}, "DuEAM-LA-only": {**tiny, "wmd_shards": 2},
                         "DuEAM-unsup": tiny}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([snakemake_exe(), "-n", "--configfile", str(path), "--directory", str(tmp_path / "run"),
                           "--snakefile", str(REPO / "Snakefile"), "--quiet", "rules"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = dict(line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("dueam_wmd", "train_m")))
    assert counts == {"dueam_wmd": "3", "train_method": "3"}  # 2 shards shared by weak and LA-only, 1 unsup

    # DuEAM is data-parallel: its gpus is a runtime key (no retraining) and the job's GPU count
    config["methods"]["DuEAM-unsup"]["gpus"] = 2
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([snakemake_exe(), "-n", "--configfile", str(path), "--directory", str(tmp_path / "run"),
                           "--snakefile", str(REPO / "Snakefile")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = {block.split("output: ")[1].split()[0]: block for block in proc.stdout.split("\nrule train_method:")[1:]}
    assert "gpu=2," in jobs["results/tiny/methods/DuEAM-unsup"] and "gpu=1," in jobs["results/tiny/methods/DuEAM-weak"]


def test_a_wmd_job_s_config_takes_its_own_runtime_key_only():
    """The workflow fills every default in, the training's runtime keys (gpus, log_every,
    checkpoint_every) included: the WMD job builds its config from the WMD settings and
    wmd_batch_size alone."""
    import yaml

    from conftest import REPO
    from modsent.config import fill_method_settings

    methods.load()
    filled = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    filled["methods"] = {"DuEAM-weak": {"datasets": None, "wmd_batch_size": 7, "gpus": 2},
                         "DuEAM-LA-only": {"datasets": None}}
    fill_method_settings(filled)  # as the Snakefile does
    assert filled["methods"]["DuEAM-LA-only"]["gpus"] == 1 and "log_every" in filled["methods"]["DuEAM-LA-only"]
    names, cfg = dueam.wmd_config(filled["methods"], dueam.wmd_digest(filled["methods"]["DuEAM-weak"]))
    assert names == ["DuEAM-weak", "DuEAM-LA-only"] and cfg.wmd_batch_size == 7 and cfg.datasets is None
