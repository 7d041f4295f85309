"""Full-parameter baselines, the ablations and every evaluated system by name (tiny random models)."""

import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from conftest import REPO, snakemake_exe
from modsent.modular import alignment as al
from modsent.methods import baselines as bl
from modsent.modular import sentence_adapter as sa
from modsent.encoders import systems as variants
from modsent.io import InputError
from modsent.losses import MultipleNegativesRankingLoss
from modsent.training.loop import optimizer_step
from modsent.training.pairs import batches_of_steps
from modsent.data.paraphrase import align_provided, crosslingual_paraphrase_pairs, parallel_pairs
from modsent.sources.builtin import builtin_translations
from modsent.testing import make_tiny_bert, sample_texts
from modsent.training import efficiency
from tiny_modules import counted_training_passes, language_modules, pairs_in, tiny_base_and_data

LANGS = ["en", "de", "ky"]
# A tiny random model moves only with a large learning rate.
CFG = bl.FullTrainingConfig(batch_size=8, seq_len=32, learning_rate=1e-3, max_steps=3, eval_pairs=10, log_every=1)
SE_CFG = sa.SentenceAdapterConfig(batch_size=8, seq_len=32, learning_rate=5e-3, max_steps=3, lora_dropout=0.0,
                                  eval_pairs=10, log_every=1)
CLA_CFG = al.AlignmentConfig(batch_size=8, learning_rate=1e-3, max_steps=2, eval_pairs=10, log_every=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny random XLM-R base and the built-in pairs in en, de, ky (the same pair ids)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("baselines")
    base, english, units = tiny_base_and_data(root)
    pairs, paths = {}, {}
    for lang in LANGS:
        pairs[lang] = english if lang == "en" else pairs_in(lang, english, units)
        paths[lang] = root / f"pairs-{lang}.parquet"
        pairs[lang].to_parquet(paths[lang], index=False)
    return {"root": root, "base": base, "english": english, "units": units, "pairs": pairs, "paths": paths}


@pytest.fixture(scope="module")
def frames(data):
    return bl.split_heldout_by_pivot(bl.read_language_pairs(data["paths"]), 10)[0]


@pytest.fixture(scope="module")
def trained(data):
    """Full_m then Full_mc from it, and Full_en, Full_c: results/baselines/{name} of a tiny tree."""
    out = data["root"] / "results" / "baselines"
    metrics = {}
    for name in ("Full_en", "Full_m", "Full_c", "Full_mc"):
        start = out / "Full_m" if name == "Full_mc" else data["base"]
        with pytest.MonkeyPatch.context() as monkeypatch:  # each step's pass, counted apart from the loop
            passes = counted_training_passes(monkeypatch)
            metrics[name] = bl.train_full_baseline(name, start, data["paths"], out / name, CFG, device="cpu",
                                                   progress=False)
        PASSES[name] = (passes.tokens, passes.token_squares)
    return metrics


PASSES: dict[str, tuple[int, int]] = {}  # each baseline's real tokens and their squares, as its steps encoded them


# ---- batching ----------------------------------------------------------------------------------


def test_full_m_epochs_over_pair_ids_take_each_batch_in_a_language_drawn_at_random(frames):
    """monolingual_epoch: pair_ids (the paper's): an epoch is the pivot's batches of pair ids,
    so Full_m trains as many steps as Full_c; each batch in one language drawn at random (every
    language drawn), its rows those pair ids in that language, no text twice; every pair id at
    most once per epoch; seeded; one language (Full_en) gives the batches of the other reading."""
    data = bl.monolingual_data(frames, 8, seed=0, epoch_of="pair_ids")
    pivot_batches = sa.no_duplicate_batches(frames["en"], 8, bl.language_seed(0, "en"), 0)
    batches = data.epoch_batches(0)
    assert len(pivot_batches) - 2 <= len(batches) <= len(pivot_batches)  # (a batch whose rows clash may drop)
    assert len(batches) < len(bl.monolingual_data(frames, 8, seed=0).epoch_batches(0)) / (len(frames) - 1)
    languages, used = [], Counter()
    for batch, ids in zip(batches, pivot_batches):
        rows = data.rows.iloc[batch]
        assert rows["language"].nunique() == 1 and _no_text_twice(rows)
        languages.append(rows["language"].iloc[0])
        used.update(rows["pair_id"])
    assert max(used.values()) == 1 and len(used) > 0.9 * len(frames["en"])  # each pair id once, in one language
    assert set(languages) == set(frames)  # every language drawn, in no fixed order
    assert sum(a != b for a, b in zip(languages, languages[1:])) > len(languages) // 3
    # a batch is the pivot batch's pair ids in its language
    for batch, ids in zip(batches[:5], pivot_batches[:5]):
        rows = data.rows.iloc[batch]
        assert set(rows["pair_id"]) <= set(frames["en"]["pair_id"].iloc[ids])
    assert data.epoch_batches(1) != batches
    assert bl.monolingual_data(frames, 8, seed=0, epoch_of="pair_ids").epoch_batches(1) == data.epoch_batches(1)
    english = {"en": frames["en"]}
    assert bl.monolingual_data(english, 8, 0, epoch_of="pair_ids").epoch_batches(0) \
        == bl.monolingual_data(english, 8, 0, epoch_of="languages").epoch_batches(0)
    assert bl.FullTrainingConfig().monolingual_epoch == "pair_ids"
    with pytest.raises(InputError, match="monolingual_epoch must be one of pair_ids, languages"):
        bl.FullTrainingConfig(monolingual_epoch="sentences")


def test_full_m_epochs_over_languages_use_every_pair_of_every_language_once(frames):
    data = bl.monolingual_data(frames, 8, seed=0, epoch_of="languages")
    assert len(data.rows) == sum(len(f) for f in frames.values())
    for epoch in range(3):
        batches = data.epoch_batches(epoch)
        seen = Counter(i for batch in batches for i in batch)
        assert max(seen.values()) == 1
        # every pair of every language once (a clashing last row of a language may wait: at most one)
        assert len(seen) >= len(data.rows) - len(frames)
        if epoch == 0:
            assert len(seen) == len(data.rows)
        order = []
        for batch in batches:
            rows = data.rows.iloc[batch]
            assert rows["language"].nunique() == 1  # one language per batch
            assert _no_text_twice(rows)
            order.append(rows["language"].iloc[0])
        # the languages are interleaved, not one block per language
        switches = sum(a != b for a, b in zip(order, order[1:]))
        assert switches > len(order) // 3
        assert Counter(order) == Counter({lang: len(sa.no_duplicate_batches(
            frames[lang], 8, bl.language_seed(0, lang), epoch)) for lang in frames})
    assert data.epoch_batches(0) != data.epoch_batches(1)  # reshuffled every epoch
    assert bl.monolingual_data(frames, 8, seed=0).epoch_batches(1) == data.epoch_batches(1)  # seeded
    assert bl.monolingual_data(frames, 8, seed=1).epoch_batches(0) != data.epoch_batches(0)


def test_grouped_batches_of_both_kinds_keep_their_rules_and_pad_less(frames):
    """baselines.length_groups: Full_m's batches stay monolingual and Full_c's keep the pair's
    dataset; each pair once, no text twice in a batch, less padding than random batches."""
    from modsent.training.pairs import text_lengths

    for make in (bl.monolingual_data, bl.crosslingual_data):
        random, grouped = make(frames, 8, 0), make(frames, 8, 0, 4)
        assert "dataset" in grouped.rows.columns
        batches = grouped.epoch_batches(0)
        seen = Counter(i for batch in batches for i in batch)
        assert max(seen.values()) == 1 and len(seen) >= len(grouped.rows) - len(frames)
        for batch in batches:
            assert _no_text_twice(grouped.rows.iloc[batch])
            if make is bl.monolingual_data:
                assert grouped.rows.iloc[batch]["language"].nunique() == 1
        lengths = text_lengths(grouped.rows)

        def padding(of):
            return sum(len(b) * lengths[b].max() - lengths[b].sum() for b in of) / sum(len(b) * lengths[b].max()
                                                                                        for b in of)
        assert batches != random.epoch_batches(0)
        assert padding(batches) < padding(random.epoch_batches(0))


def _no_text_twice(rows: pd.DataFrame) -> bool:
    """No text in two rows of a batch (a row may repeat its own text: anchor == positive, as
    sentence-transformers allows)."""
    per_row = [set(t for t in row if isinstance(t, str)) for row in rows[["anchor", "positive", "negative"]].itertuples(index=False)]
    all_texts = [t for texts in per_row for t in texts]
    return len(all_texts) == len(set(all_texts))


def test_full_c_pairs_mix_languages_seeded_negative_in_the_positive_language(frames):
    mixed = bl.crosslingual_pairs(frames, seed=0)
    assert sorted(mixed["pair_id"]) == sorted(frames["en"]["pair_id"])  # every shared pair id once
    assert set(mixed["anchor_lang"]) == set(mixed["positive_lang"]) == set(LANGS)
    assert (mixed["anchor_lang"] != mixed["positive_lang"]).mean() > 0.4  # mostly cross-lingual
    indexed = {lang: f.set_index("pair_id") for lang, f in frames.items()}
    for row in mixed.itertuples(index=False):
        assert row.anchor == indexed[row.anchor_lang].at[row.pair_id, "anchor"]
        assert row.positive == indexed[row.positive_lang].at[row.pair_id, "positive"]
        negative = indexed[row.positive_lang].at[row.pair_id, "negative"]
        assert row.negative == negative or not isinstance(row.negative, str)
    pd.testing.assert_frame_equal(bl.crosslingual_pairs(frames, seed=0), mixed)  # seeded
    other = bl.crosslingual_pairs(frames, seed=1)
    assert (other["anchor_lang"] != mixed["anchor_lang"]).any()
    data = bl.crosslingual_data(frames, 8, seed=0)
    batches = data.epoch_batches(0)
    assert Counter(i for b in batches for i in b) == Counter(range(len(mixed)))
    for batch in batches:
        assert _no_text_twice(data.rows.iloc[batch])


def test_heldout_pair_ids_are_the_english_se_slice_and_held_out_in_every_language(data):
    pairs = bl.read_language_pairs(data["paths"])
    train, heldout = bl.split_heldout_by_pivot(pairs, 10)
    se_train, se_heldout = sa.split_heldout(pairs["en"], 10)
    pd.testing.assert_frame_equal(heldout["en"], se_heldout)  # Full_en's slice is the English SE adapter's
    held_ids = set(pairs["en"]["pair_id"]) - set(se_train["pair_id"])
    for lang in LANGS:
        assert not set(train[lang]["pair_id"]) & held_ids
        assert set(heldout[lang]["pair_id"]) <= held_ids and len(heldout[lang]) > 0


# ---- training ----------------------------------------------------------------------------------


def test_every_weight_of_the_full_model_changes_the_se_adapter_leaves_the_base_alone(data, tmp_path):
    """A LaBSE-shaped base (CLS -> Dense(tanh)): the full model trains embeddings, every layer and
    the Dense layer; the SE adapter's model trains its LoRA only."""
    base = make_tiny_bert(tmp_path / "bert", sample_texts(600), pooling="cls")
    fresh = bl.build_full_model(base, CFG)
    assert all(p.requires_grad for p in fresh.parameters())
    before = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    assert any(n.startswith("head.") for n in before)  # the Dense layer is part of it
    result = bl.run_full_training("Full_en", base, {"en": data["paths"]["en"]}, CFG, device="cpu", progress=False)
    after = dict(result.model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n].detach())]
    assert unchanged == []
    assert result.metrics["trainable_parameters"] == result.metrics["total_parameters"]
    assert result.metrics["steps"] == 3

    model = sa.build_model(base, None, SE_CFG)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    trainable = [p for p in model.parameters() if p.requires_grad]
    pairs = sa.read_pairs(data["paths"]["en"])
    loss_fn = MultipleNegativesRankingLoss()
    optimizer = torch.optim.AdamW(trainable, lr=5e-3)
    model.train()
    for batch in batches_of_steps(pairs, SE_CFG.batch_size, SE_CFG.seed, 3):
        sa.batch_loss(model, loss_fn, pairs.iloc[batch]).backward()
        optimizer_step(optimizer, trainable, 1.0)
    params = dict(model.named_parameters())
    assert all(torch.equal(p, params[n].detach()) for n, p in frozen.items())
    assert any(not torch.all(p == 0) for n, p in params.items() if "lora_B" in n)  # the LoRA did train


def test_compile_routes_the_encoder_through_dynamo_and_trains_what_eager_trains(data, traced_compile):
    """baselines.compile: the encoder is compiled in place (Dynamo graphs, run eagerly here: the
    traced_compile fixture) and trains the eager run's weights and losses; the checkpoint
    fingerprint leaves the setting out (a checkpoint resumes with it on or off)."""
    modules, graphs = traced_compile
    paths = {"en": data["paths"]["en"]}
    eager = bl.run_full_training("Full_en", data["base"], paths, CFG, device="cpu", progress=False)
    assert modules == [] and graphs() == 0
    cfg = dataclasses.replace(CFG, compile=True)
    compiled = bl.run_full_training("Full_en", data["base"], paths, cfg, device="cpu", progress=False)
    assert len(modules) == 1 and modules[0] is compiled.model.encoder and graphs() >= 1
    assert [row[1] for row in compiled.history] == pytest.approx([row[1] for row in eager.history], rel=1e-5)
    a, b = eager.model.state_dict(), compiled.model.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert compiled.metrics["heldout_retrieval_accuracy_after"] == eager.metrics["heldout_retrieval_accuracy_after"]
    assert bl.training_fingerprint("Full_en", cfg, data["base"], paths) == \
        bl.training_fingerprint("Full_en", CFG, data["base"], paths)


@pytest.mark.parametrize("kind", ["xlmr-mean", "bert-cls-dense"])
def test_saved_directory_reloads_with_sentence_transformers_and_encodes_the_same(data, tmp_path, kind):
    from sentence_transformers import SentenceTransformer

    base = data["base"] if kind == "xlmr-mean" else make_tiny_bert(tmp_path / "bert", sample_texts(600),
                                                                   pooling="cls")
    result = bl.run_full_training("Full_m", base, data["paths"], CFG, device="cpu", progress=False)
    out = tmp_path / "Full_m"
    out.mkdir()
    bl.save_sentence_transformer(result.model, base, out)
    texts = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence."]
    ours = result.model.encode(texts)
    reloaded = SentenceTransformer(str(out), device="cpu")
    assert reloaded.max_seq_length == CFG.seq_len
    theirs = reloaded.encode(texts, normalize_embeddings=True)
    assert ours.shape == theirs.shape
    assert np.min(np.sum(ours * theirs, axis=1)) >= 0.9999
    assert not np.allclose(ours, SentenceTransformer(str(base), device="cpu").encode(
        texts, normalize_embeddings=True, prompt=""), atol=1e-3)  # trained: not the base any more
    st_config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st_config["default_prompt_name"] is None  # trained without prompts


def test_half_precision_storage_halves_the_file_and_evaluates_in_float32(data, tmp_path):
    """baselines.storage_dtype: float16 — the weights file holds the trained weights rounded to
    float16 (half the bytes); modsent's loader computes in float32 from them, and the vectors
    stay those of the float32 model up to that rounding."""
    from safetensors import safe_open

    from modsent.encoders.systems import load_sentence_transformer

    result = bl.run_full_training("Full_m", data["base"], data["paths"], CFG, device="cpu", progress=False)
    outs = {}
    for dtype in ("float32", "float16"):
        outs[dtype] = tmp_path / dtype
        outs[dtype].mkdir()
        bl.save_sentence_transformer(result.model, data["base"], outs[dtype], dtype=dtype)
    files = {dtype: out / "model.safetensors" for dtype, out in outs.items()}
    assert files["float16"].stat().st_size < 0.55 * files["float32"].stat().st_size
    trained = {k: v.detach() for k, v in result.model.encoder.state_dict().items()}
    with safe_open(str(files["float16"]), "pt") as half:
        names = [name for name in half.keys() if name.removeprefix("model.") in trained or name in trained]
        assert names
        for name in names:
            stored = half.get_tensor(name)
            assert stored.dtype == torch.float16
            assert torch.equal(stored, trained.get(name, trained.get(name.removeprefix("model."))).half())
    texts = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence."]
    full, half_model = (load_sentence_transformer(outs[dtype], device="cpu") for dtype in ("float32", "float16"))
    assert all(p.dtype == torch.float32 for p in half_model.parameters())
    a, b = (m.encode(texts, normalize_embeddings=True) for m in (full, half_model))
    assert np.min(np.sum(a * b, axis=1)) > 0.999 and not np.array_equal(a, b)
    with pytest.raises(InputError, match="storage_dtype must be one of float32, float16, bfloat16"):
        bl.FullTrainingConfig(storage_dtype="int8")
    # how the result is saved is not how it trains: a checkpoint of either resumes the other
    fingerprints = {bl.training_fingerprint("Full_m", dataclasses.replace(CFG, storage_dtype=dtype), data["base"],
                                            data["paths"]) for dtype in ("float32", "float16")}
    assert len(fingerprints) == 1
    assert bl.training_fingerprint("Full_m", dataclasses.replace(CFG, seed=CFG.seed + 1), data["base"],
                                   data["paths"]) not in fingerprints


def test_outputs_are_standard_directories_and_full_mc_starts_from_full_m(data, trained):
    from sentence_transformers import SentenceTransformer

    out = data["root"] / "results" / "baselines"
    for name, metrics in trained.items():
        files = {p.name for p in (out / name).iterdir()}
        assert {"modules.json", "model.safetensors", "metrics.json", "loss.tsv", "loss.png"} <= files
        assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]  # safetensors only
        assert metrics["steps"] == CFG.max_steps and metrics["baseline"] == name
        assert 0 < metrics["padding_fraction"] < 1
        assert metrics["model_flops"] > 0 and metrics["mfu"] is None  # the CPU: no peak
        # every weight of the body but the embeddings and pooler, at every real token of the steps' passes
        body = efficiency.body_shape(bl.build_full_model(data["base"], CFG).encoder)
        assert metrics["model_flops"] == efficiency.encoder_flops(body, *PASSES[name])
        assert json.loads((out / name / "metrics.json").read_text()) == metrics
    assert trained["Full_en"]["languages"] == ["en"] and trained["Full_m"]["languages"] == LANGS
    assert set(trained["Full_c"]["pair_languages"]) == {f"{a}-{b}" for a in LANGS for b in LANGS}
    # Full_mc continues Full_m: its starting weights are Full_m's (so its "before" is Full_m's "after")
    assert trained["Full_mc"]["initialised_from"] == str(out / "Full_m")
    for key in ("heldout_retrieval_accuracy", "heldout_crosslingual_retrieval_accuracy"):
        assert trained["Full_mc"][f"{key}_before"] == trained["Full_m"][f"{key}_after"]
    start = bl.build_full_model(out / "Full_m", CFG).encoder.state_dict()
    saved = SentenceTransformer(str(out / "Full_m"), device="cpu")[0].auto_model.state_dict()
    assert all(torch.equal(tensor, saved[key]) for key, tensor in start.items())
    with pytest.raises(InputError, match="starts from Full_m"):
        bl.run_full_training("Full_mc", data["base"], data["paths"], CFG, device="cpu", progress=False)
    bl.write_summary([out / name for name in trained], data["root"] / "summary.md")
    summary = (data["root"] / "summary.md").read_text()
    assert "| Full_mc | 3 |" in summary and "| en | de | ky | en→L |" in summary


def test_config_section_defaults_are_the_papers(repo):
    from snakemake.utils import validate

    from modsent.schema import SCHEMA_PATH

    config = {"base_model": {"name": "x", "source": "builtin:tiny-xlmr-random"}, "languages": ["en"]}
    validate(config, str(SCHEMA_PATH))
    section = config["baselines"]
    assert section["full"] == ["Full_en", "Full_m", "Full_c", "Full_mc"]
    assert section["ablations"] == ["Mod_m-LA", "Mod_c"]
    assert bl.FullTrainingConfig.from_config(section) == bl.FullTrainingConfig()
    assert (section["checkpoint_every"], section["gpus"]) == (bl.FullTrainingConfig().checkpoint_every, 1)
    assert (bl.FullTrainingConfig().epochs, bl.FullTrainingConfig().batch_size, bl.FullTrainingConfig().seq_len,
            bl.FullTrainingConfig().learning_rate, bl.FullTrainingConfig().scale) == (3, 128, 128, 2e-5, 20.0)
    with pytest.raises(InputError, match="unknown key"):
        bl.FullTrainingConfig.from_config({"lr": 1})
    for path in ("config.yaml", "configs/test.yaml"):
        bl.FullTrainingConfig.from_config(yaml.safe_load((repo / path).read_text())["baselines"])


# ---- resumption ----------------------------------------------------------------------------------

# Full_en in batches of 32: 6 batches an epoch, so the 8 steps cross into a second epoch and a
# job killed at step 7 resumes from the step-6 checkpoint inside it. The tiny base has dropout.
RESUME_CFG = bl.FullTrainingConfig(batch_size=32, seq_len=32, learning_rate=1e-3, max_steps=8, eval_pairs=10,
                                   log_every=2, checkpoint_every=3)


def test_a_resumed_run_sees_the_batches_of_an_unbroken_one(frames):
    for data in (bl.monolingual_data(frames, 32, seed=0), bl.monolingual_data(frames, 32, seed=0, epoch_of="pair_ids"),
                 bl.crosslingual_data(frames, 32, seed=0)):
        per_epoch = len(data.epoch_batches(0))
        total = 2 * per_epoch + 3
        unbroken = list(bl.iter_steps(data, total))
        assert len(unbroken) == total and unbroken[per_epoch] == data.epoch_batches(1)[0]
        for start in (0, 1, per_epoch - 1, per_epoch, per_epoch + 2, total):
            assert list(bl.iter_steps(data, total, start=start)) == unbroken[start:]


def _train_and_die(data, out, cfg, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    bl.train_full_baseline("Full_en", data["base"], {"en": data["paths"]["en"]}, out, cfg, device="cpu",
                           progress=False, on_step=die)


def _killed_at(data, out, cfg, step):
    """Train in a child process that is killed with SIGKILL after ``step`` (as a cluster kills a job)."""
    process = multiprocessing.get_context("fork").Process(target=_train_and_die, args=(data, out, cfg, step))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    assert not out.exists()  # nothing Snakemake would accept
    return Path(f"{out}.checkpoint")


def test_killed_job_resumes_from_its_last_checkpoint(data, tmp_path):
    torch.set_num_threads(1)
    english = bl.split_heldout_by_pivot(bl.read_language_pairs({"en": data["paths"]["en"]}), 10)[0]
    assert len(bl.monolingual_data(english, 32, 0).epoch_batches(0)) <= 6  # the resumed steps are in epoch 2
    straight = tmp_path / "straight"
    bl.train_full_baseline("Full_en", data["base"], {"en": data["paths"]["en"]}, straight, RESUME_CFG,
                           device="cpu", progress=False)
    resumed = tmp_path / "resumed"
    checkpoint = _killed_at(data, resumed, RESUME_CFG, 7)
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["step"] == 6
    assert sorted(p.name for p in checkpoint.iterdir()) == ["meta.json", "state.safetensors"]  # no pickle
    state = load_file(str(checkpoint / "state.safetensors"))
    n_params = sum(1 for _ in bl.build_full_model(data["base"], RESUME_CFG).parameters())
    assert sum(k.startswith("param/") for k in state) == n_params  # every weight
    assert sum(k.startswith("exp_avg/") for k in state) == n_params  # and its AdamW moments
    metrics = bl.train_full_baseline("Full_en", data["base"], {"en": data["paths"]["en"]}, resumed, RESUME_CFG,
                                     device="cpu", progress=False)
    assert metrics["resumed_from_step"] == 6 and metrics["steps"] == 8
    assert not checkpoint.exists()  # removed once the output is complete
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit what an unbroken run gives
    unbroken = json.loads((straight / "metrics.json").read_text())
    for key in ("loss_first", "loss_last", "heldout_retrieval_accuracy_before", "heldout_retrieval_accuracy_after"):
        assert metrics[key] == unbroken[key], key
    assert (resumed / "loss.tsv").read_text() == (straight / "loss.tsv").read_text()


def test_checkpoint_of_other_settings_or_inputs_is_not_resumed(data, tmp_path):
    torch.set_num_threads(1)
    en = {"en": data["paths"]["en"]}

    def stop_at_4(step):
        if step == 4:
            raise KeyboardInterrupt  # a job stopped after its step-3 checkpoint

    out = tmp_path / "Full_en"
    with pytest.raises(KeyboardInterrupt):
        bl.train_full_baseline("Full_en", data["base"], en, out, RESUME_CFG, device="cpu", progress=False,
                               on_step=stop_at_4)
    other = bl.FullTrainingConfig(**{**dataclasses.asdict(RESUME_CFG), "learning_rate": 5e-4})
    metrics = bl.train_full_baseline("Full_en", data["base"], en, out, other, device="cpu", progress=False)
    assert metrics["resumed_from_step"] == 0 and metrics["steps"] == 8

    fingerprint = bl.training_fingerprint("Full_en", RESUME_CFG, data["base"], en)
    cadence = bl.FullTrainingConfig(**{**dataclasses.asdict(RESUME_CFG), "checkpoint_every": 5, "log_every": 1})
    assert bl.training_fingerprint("Full_en", cadence, data["base"], en) == fingerprint  # may change on a rerun
    assert bl.training_fingerprint("Full_c", RESUME_CFG, data["base"], en) != fingerprint
    assert bl.training_fingerprint("Full_en", RESUME_CFG, data["base"], {"en": data["paths"]["de"]}) != fingerprint
    changed = tmp_path / "start"  # a retrained starting model (Full_m for Full_mc): other weights, same names
    shutil.copytree(data["base"], changed)
    weights = load_file(str(changed / "model.safetensors"))
    key = sorted(weights)[0]
    weights[key] = weights[key] + 1e-3
    save_file(weights, str(changed / "model.safetensors"))
    assert bl.training_fingerprint("Full_en", RESUME_CFG, changed, en) != fingerprint


# ---- every system by name ----------------------------------------------------------------------


def test_module_paths_and_evaluated_variants():
    assert variants.module_paths("base", "de", [0.5]) == []
    assert variants.module_paths("Full_en", "de", [0.5]) == ["baselines/Full_en"]
    assert variants.module_paths("Full_mc", "en", [0.5]) == ["baselines/Full_mc"]
    assert variants.module_paths("Mod_en", "de", [0.5]) == ["language_adapters/de", "sentence_adapters/en"]
    assert variants.module_paths("Mod_m", "de", [0.5]) == ["language_adapters/de", "sentence_adapters/de"]
    assert variants.module_paths("Mod_mc-pp", "de", [0.5]) == [
        "language_adapters/de", "sentence_adapters/de", "alignment/pp/de"]
    assert variants.module_paths("Mod_mc-0.7", "de", [0.5]) == [
        "language_adapters/de", "sentence_adapters/de", "alignment/merged-0.7/de"]
    assert variants.module_paths("Mod_mc-pl", "en", [0.5]) == ["language_adapters/en", "sentence_adapters/en"]
    assert variants.module_paths("Mod_m-LA", "de", [0.5]) == ["ablations/sentence_adapters_base/de"]
    assert variants.module_paths("Mod_m-LA", "en", [0.5]) == ["ablations/sentence_adapters_base/en"]
    assert variants.module_paths("Mod_c", "de", [0.7, 0.5]) == [
        "language_adapters/de", "ablations/alignment_la/merged-0.7/de"]
    assert variants.module_paths("Mod_c", "en", [0.7]) == ["language_adapters/en", "sentence_adapters/en"]
    # a language that skips its LA
    assert variants.module_paths("Mod_m", "de", [0.5], la_languages=["en"]) == ["sentence_adapters/de"]
    assert variants.module_paths("Mod_c", "de", [0.5], la_languages=["en"]) == ["ablations/alignment_la/merged-0.5/de"]

    config = {"alignment": {"merge_weights": [0.5, 0.7]},
              "baselines": {"full": ["Full_mc", "Full_en", "Full_m", "Full_c"], "ablations": ["Mod_c", "Mod_m-LA"]}}
    assert variants.evaluated_variants(config) == [
        "base", "Full_en", "Full_m", "Full_c", "Full_mc", "Mod_en", "Mod_m", "Mod_mc-pp", "Mod_mc-pl",
        "Mod_mc-0.5", "Mod_mc-0.7", "Mod_m-LA", "Mod_c"]
    config["baselines"] = {"full": ["Full_mc"], "ablations": []}
    assert variants.evaluated_variants(config) == [
        "base", "Full_mc", "Mod_en", "Mod_m", "Mod_mc-pp", "Mod_mc-pl", "Mod_mc-0.5", "Mod_mc-0.7"]
    for name in variants.evaluated_variants({"alignment": {"merge_weights": [0.5]}}):
        assert variants.variant(name, [0.5]).name == name


def test_a_merged_system_has_one_spelling():
    assert [variants.canonical_name(n) for n in ("Mod_mc", "Mod_mc-0.5", "Mod_mc-0.50", "Mod_mc-1", "Mod_mc-0.70")] \
        == ["Mod_mc-0.5", "Mod_mc-0.5", "Mod_mc-0.5", "Mod_mc-1", "Mod_mc-0.7"]
    assert [variants.canonical_name(n) for n in ("Mod_mc-pp", "Mod_c", "base", "MEXMA")] == [
        "Mod_mc-pp", "Mod_c", "base", "MEXMA"]
    for name in ("Mod_mc", "Mod_mc-0.70"):  # the same modules as the canonical name's
        assert variants.variant(name).recipe("de") == variants.variant(variants.canonical_name(name)).recipe("de")


def test_unknown_variant_names_the_valid_ones():
    for name in ("Full_x", "Mod_m-la", "Mod_mc-1.5", "mod_en", ""):
        with pytest.raises(InputError, match="unknown variant|merge weight") as error:
            variants.variant(name)
        if "unknown" in str(error.value):
            for valid in ("base", "Full_en", "Full_mc", "Mod_en", "Mod_mc-{w}", "Mod_m-LA", "Mod_c"):
                assert valid in str(error.value)
    with pytest.raises(InputError, match="Full_x"):
        variants.module_paths("Full_x", "de")
    with pytest.raises(InputError, match="unknown system"):
        variants.evaluated_variants({"baselines": {"full": ["Full_x"], "ablations": []}})


@pytest.fixture(scope="module")
def tree(data, trained):
    """A tiny results/{base} tree holding every module each system needs, for en and de."""
    root, base = data["root"], data["base"]
    results = root / "results"
    for folder in ("modular", "on-base"):
        (root / folder).mkdir()
    for folder in ("language_adapters", "sentence_adapters", variants.ABLATION_SE_DIR):
        (results / folder).mkdir(parents=True)
    for lang in ("en", "de"):
        la_dir, se_dir = language_modules(root / "modular", base, lang, data["pairs"][lang], SE_CFG)
        shutil.move(la_dir, results / "language_adapters" / lang)
        shutil.move(se_dir, results / "sentence_adapters" / lang)
        _, se_base = language_modules(root / "on-base", base, lang, data["pairs"][lang], SE_CFG, with_la=False)
        shutil.move(se_base, results / variants.ABLATION_SE_DIR / lang)
    la_en, se_en = results / "language_adapters/en", results / "sentence_adapters/en"
    english = al.embed_english(base, la_en, se_en, data["paths"]["en"], root / "english.safetensors")
    translations, _ = align_provided(data["units"], builtin_translations("de"), "de")
    inputs = {"pp": crosslingual_paraphrase_pairs(data["english"], data["pairs"]["de"]),
              "pl": parallel_pairs(translations)}
    la_de, se_de = results / "language_adapters/de", results / "sentence_adapters/de"
    for root_dir, se_dir in (("alignment", se_de), (variants.ABLATION_CLA_DIR, None)):  # Mod_c: no SE
        for kind in ("pp", "pl"):
            al.train_alignment_adapter(kind, base, la_de, se_dir, inputs[kind], english, results / root_dir / kind / "de",
                                       CLA_CFG, language="de", device="cpu", progress=False)
        al.merge_alignment_adapters(results / root_dir / "pp/de", results / root_dir / "pl/de", (0.5, 0.5),
                                    results / root_dir / "merged-0.5/de")
    assert json.loads((results / variants.ABLATION_CLA_DIR / "pp/de/metrics.json").read_text())["sentence_adapter"] is None
    return results


def test_build_encoder_for_every_system(data, tree):
    from sentence_transformers import SentenceTransformer

    from modsent.encoders.modular import ModularEncoder

    base = data["base"]
    names = variants.evaluated_variants({"alignment": {"merge_weights": [0.5]}})
    sentences = {"en": ["Hello world", "Good morning"], "de": ["Hallo Welt", "Guten Morgen"]}
    vectors = {}
    for name in names:
        encoder = variants.build_encoder(name, tree, base, ["en", "de"], merge_weights=[0.5], device="cpu")
        for lang, texts in sentences.items():
            emb = encoder.encode(texts, lang=lang, batch_size=32)
            assert emb.dtype == np.float32 and emb.shape == (2, 32)
            assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
            vectors[name, lang] = emb
    # the base: the base model through its own tokenizer, no prompt
    reference = SentenceTransformer(str(base), device="cpu").encode(sentences["de"], normalize_embeddings=True,
                                                                    prompt="")
    assert np.allclose(vectors["base", "de"], reference, atol=1e-5)
    # a Full_* system is its sentence-transformers directory, the same for every language
    full = SentenceTransformer(str(tree / "baselines/Full_c"), device="cpu")
    assert np.allclose(vectors["Full_c", "de"], full.encode(sentences["de"], normalize_embeddings=True), atol=1e-5)
    # every system encodes German its own way
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not np.allclose(vectors[a, "de"], vectors[b, "de"], atol=1e-4), (a, b)
    # English: Mod_c and Mod_mc use English's LA + SE as Mod_m does; Mod_m-LA has its own SE on the base
    assert np.allclose(vectors["Mod_c", "en"], vectors["Mod_m", "en"], atol=1e-5)
    assert np.allclose(vectors["Mod_mc-0.5", "en"], vectors["Mod_m", "en"], atol=1e-5)
    assert not np.allclose(vectors["Mod_m-LA", "en"], vectors["Mod_m", "en"], atol=1e-4)
    # Mod_c for German is LA + the CLA trained without SE, nothing else
    manual = ModularEncoder(base, device="cpu")
    manual.add_language("de", language_adapter=tree / "language_adapters/de",
                        alignment=tree / variants.ABLATION_CLA_DIR / "merged-0.5/de")
    assert np.allclose(vectors["Mod_c", "de"], manual.encode(sentences["de"], lang="de"), atol=1e-5)
    with pytest.raises(InputError, match="does not exist"):
        variants.build_encoder("Mod_c", tree, base, ["de"], merge_weights=[0.7], device="cpu")


def test_the_command_line_s_mod_c_is_the_merge_the_tree_holds(data, tree, tmp_path, capsys):
    """`modsent export` and `encode` assemble Mod_c with the weight the workflow merged (the first of
    alignment.merge_weights; here 0.7), not with the default 0.5; with two merges in the tree
    (the config's first weight changed) they ask for --merge-weight, which picks one."""
    from sentence_transformers import SentenceTransformer

    from modsent import cli

    results, base = tmp_path / "tree", data["base"]
    shutil.copytree(tree, results)
    ablation = results / variants.ABLATION_CLA_DIR
    al.merge_alignment_adapters(ablation / "pp/de", ablation / "pl/de", (0.7, 0.3), ablation / "merged-0.7/de")
    sentences = ["Hallo Welt", "Guten Morgen"]
    # what the evaluation builds with each weight (build_language_encoders' merge weights)
    evaluated = {weight: variants.build_encoder("Mod_c", results, base, ["de"], merge_weights=[weight],
                                                device="cpu").encode(sentences, lang="de") for weight in (0.5, 0.7)}
    shutil.move(ablation / "merged-0.5", tmp_path / "merged-0.5")  # the workflow merged 0.7 only
    (ablation / "merged-0.3").mkdir()  # a merge that failed before writing a language: no merge
    (ablation / "merged-foo" / "de").mkdir(parents=True)  # not a weight: no merge

    def exported(*options):
        out = tmp_path / f"export{len(list(tmp_path.glob('export*')))}"
        code = cli.main(["export", "--model", str(results), "--variant", "Mod_c", "--lang", "de", "--base", str(base),
                         "--out", str(out), "--device", "cpu", *options])
        assert code == 0, capsys.readouterr().err
        return SentenceTransformer(str(out), device="cpu").encode(sentences)

    assert not np.allclose(evaluated[0.7], evaluated[0.5], atol=1e-4)
    assert np.allclose(exported(), evaluated[0.7], atol=1e-5)
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert cli.main(["encode", "--model", str(results), "--variant", "Mod_c", "--lang", "de", "--base", str(base),
                     "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "c.npy"), "--quiet"]) == 0
    assert np.allclose(np.load(tmp_path / "c.npy"), evaluated[0.7], atol=1e-5)
    shutil.move(tmp_path / "merged-0.5", ablation / "merged-0.5")  # two merges: the user says which
    assert cli.main(["export", "--model", str(results), "--variant", "Mod_c", "--lang", "de", "--base", str(base),
                     "--out", str(tmp_path / "never")]) == 2
    assert "holds merges of weights 0.5, 0.7; give --merge-weight W" in capsys.readouterr().err
    assert np.allclose(exported("--merge-weight", "0.5"), evaluated[0.5], atol=1e-5)
    for variant, weight, message in (("Mod_m", "0.5", "only Mod_c takes one"), ("Mod_c", "1.5", "must be in")):
        assert cli.main(["export", "--model", str(results), "--variant", variant, "--lang", "de", "--merge-weight",
                         weight, "--out", str(tmp_path / "never")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


# ---- the rules ---------------------------------------------------------------------------------


def _snakemake(tmp_path, config_path, *args):
    """Snakemake on the repository's workflow plus rules/baselines.smk (included here when the
    Snakefile does not include it yet), target: every baseline output of the config."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        f'include: "{REPO / "Snakefile"}"\n'
        'if "full_baseline" not in {r.name for r in workflow.rules}:\n'
        f'    include: "{REPO / "rules" / "baselines.smk"}"\n\n'
        "rule baseline_outputs:\n    input: baseline_targets()\n")
    return subprocess.run(
        [snakemake_exe(), "--snakefile", str(snakefile), "--directory", str(tmp_path / "work"),
         "--configfile", str(config_path), "--cores", "2", *args, "baseline_outputs"],
        capture_output=True, text=True)


def _job_counts(output: str) -> dict[str, int]:
    counts, in_table = {}, False
    for line in output.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                if parts[0] != "total":
                    counts[parts[0]] = int(parts[1])
            elif counts:
                break
    return counts


@pytest.mark.workflow
def test_dry_run_plans_every_baseline_and_ablation_job(tmp_path):
    proc = _snakemake(tmp_path, REPO / "configs" / "test.yaml", "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = _job_counts(proc.stdout + proc.stderr)
    assert {key: counts.get(key) for key in (
        "full_baseline", "full_baseline_summary", "ablation_sentence_adapter", "ablation_alignment_adapter",
        "ablation_merge_alignment")} == {
        "full_baseline": 4, "full_baseline_summary": 1, "ablation_sentence_adapter": 3,  # en, de, ky
        "ablation_alignment_adapter": 4, "ablation_merge_alignment": 2}  # {pp, pl} x {de, ky}; first weight
    for path in ("results/tiny/baselines/Full_mc", "results/tiny/ablations/sentence_adapters_base/en",
                 "results/tiny/ablations/alignment_la/merged-0.5/ky"):
        assert path in proc.stdout
    assert "results/tiny/ablations/alignment_la/merged-0.7" not in proc.stdout
    # the full baselines and Mod_m-LA need no language adapter (the workflow test trains them all)
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["baselines"]["ablations"] = ["Mod_m-LA"]
    config_path = tmp_path / "no-la.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proc = _snakemake(tmp_path, config_path, "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = _job_counts(proc.stdout + proc.stderr)
    assert counts["full_baseline"] == 4 and counts["ablation_sentence_adapter"] == 3
    assert not {"language_adapter", "tokenizer", "focus_embeddings", "ablation_alignment_adapter"} & set(counts), counts


def _job_block(output: str, rule: str, target: str) -> str:
    """The dry run's description of the job of ``rule`` that makes ``target``."""
    for block in output.split("\nrule ")[1:]:
        if block.startswith(f"{rule}:") and f"output: {target}" in block:
            return block
    raise AssertionError(f"no {rule} job for {target} in the plan")


@pytest.mark.workflow
def test_full_baseline_jobs_request_baselines_gpus_gpus_of_one_node(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["baselines"]["gpus"] = 2
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proc = _snakemake(tmp_path, config_path, "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("Full_en", "Full_mc"):
        resources = _job_block(proc.stdout, "full_baseline", f"results/tiny/baselines/{name}")
        assert "gpu=2," in resources and "mem_mb=64000" in resources  # 2 x the gpu_train kind's memory
    se = _job_block(proc.stdout, "ablation_sentence_adapter", "results/tiny/ablations/sentence_adapters_base/en")
    assert "gpu=1," in se  # the setting is the full baselines' own
