"""m-ST5 (modsent.methods.mst5): the triplet loss, the triplet builder, training a tiny random
mT5 encoder and a tiny encoder-only base, the saved sentence-transformers directory, resumption."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from modsent import losses, methods
from modsent.encoders import transformer as tf
from modsent.io import InputError
from modsent.methods.mst5 import training as mt
from modsent.testing import make_random_mt5 as make_tiny_mt5, make_tiny_bert, sample_texts
from modsent.training import efficiency
from tiny_modules import (assert_grouped_batches, assert_stored_in_half, compiled_against_eager,
                          counted_training_passes, needs_cpu_compiler, pairs_in, recorded_training_data,
                          tiny_base_and_data)

LANGS = ["en", "de", "ky"]
# a tiny random model moves only with a large learning rate; the built-in pairs have no mnli rows
SETTINGS = {"batch_size": 8, "max_steps": 3, "eval_pairs": 10, "learning_rate": 5e-3, "datasets": None,
            "log_every": 1, "seq_len": 32}
TEXTS = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence."]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny random XLM-R base (sentence-transformers), a tiny random mT5 and the built-in pairs
    in en, de, ky (the same pair ids)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("mst5")
    base, english, units = tiny_base_and_data(root)
    paths = {}
    for lang in LANGS:
        frame = english if lang == "en" else pairs_in(lang, english, units)
        paths[lang] = root / f"pairs-{lang}.parquet"
        frame.to_parquet(paths[lang], index=False)
    mt5 = make_tiny_mt5(root / "mt5", sample_texts(600))
    return {"root": root, "base": base, "mt5": mt5, "paths": paths, "inputs": {"base": base, "pairs": paths}}


# ---- the loss ------------------------------------------------------------------------------------


def test_triplet_infonce_is_its_formula_and_mnrl_with_scale_one_over_t():
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    generator = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(6, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    t = 0.05
    ours = losses.TripletInfoNCELoss(t)(a, p, n)

    def cos(u, v):
        return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))

    a64, p64, n64 = a.numpy(), p.numpy(), n.numpy()
    terms = []
    for i in range(len(a)):
        numerator = math.exp(cos(a64[i], p64[i]) / t)
        denominator = sum(math.exp(cos(a64[i], p64[j]) / t) + math.exp(cos(a64[i], n64[j]) / t)
                          for j in range(len(a)))
        terms.append(-math.log(numerator / denominator))
    assert ours.item() == pytest.approx(np.mean(terms), rel=1e-5)

    reference = MultipleNegativesRankingLoss(model=None, scale=1 / t)
    labels = torch.zeros(6)
    a32, p32, n32 = a.float(), p.float(), n.float()
    assert torch.allclose(losses.TripletInfoNCELoss(t)(a32, p32, n32),
                          reference.compute_loss_from_embeddings([a32, p32, n32], labels), atol=1e-5)
    assert torch.allclose(losses.TripletInfoNCELoss(t)(a32, p32),  # no negatives: in-batch only
                          reference.compute_loss_from_embeddings([a32, p32], labels), atol=1e-5)
    with pytest.raises(ValueError, match="one positive and one negative per anchor"):
        losses.TripletInfoNCELoss(t)(a32, p32, n32[:3])


def test_mean_pooling_averages_the_real_tokens_only():
    from sentence_transformers.sentence_transformer.modules import Pooling

    tokens = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    pooled = tf.mean_pool(tokens, mask)
    assert torch.allclose(pooled[0], tokens[0, :3].mean(0)) and torch.allclose(pooled[1], tokens[1, 0])
    reference = Pooling(3, "mean")({"token_embeddings": tokens, "attention_mask": mask})["sentence_embedding"]
    assert torch.allclose(pooled, reference, atol=1e-6)


# ---- the triplets --------------------------------------------------------------------------------


def test_triplets_come_from_one_pair_id_languages_vary_and_batches_hold_each_pair_id_once(data):
    frames = mt.read_frames(data["paths"], None, "methods.mST5-xnli.datasets")
    rows = mt.crosslingual_triplets(frames, seed=0)
    indexed = {lang: frame.set_index("pair_id") for lang, frame in frames.items()}
    for row in rows.itertuples(index=False):
        assert row.anchor == indexed[row.anchor_lang].at[row.pair_id, "anchor"]
        assert row.positive == indexed[row.positive_lang].at[row.pair_id, "positive"]
        assert row.negative == indexed[row.negative_lang].at[row.pair_id, "negative"]
        assert row.negative not in (row.anchor, row.positive)
    # a pair id once per anchor language (less where a name is the same in two languages and the
    # triplet was dropped); the other two languages drawn from all of them
    assert rows.groupby(["pair_id", "anchor_lang"]).size().max() == 1
    assert (rows.groupby("pair_id").size() == len(LANGS)).mean() > 0.9
    assert set(rows["positive_lang"]) == set(rows["negative_lang"]) == set(LANGS)
    assert 0.5 < (rows["positive_lang"] != rows["anchor_lang"]).mean() < 0.85  # 2/3 expected
    assert 0.5 < (rows["negative_lang"] != rows["positive_lang"]).mean() < 0.85
    pd.testing.assert_frame_equal(mt.crosslingual_triplets(frames, seed=0), rows)  # seeded
    assert not mt.crosslingual_triplets(frames, seed=1)["positive_lang"].equals(rows["positive_lang"])

    english = mt.english_triplets(frames["en"])
    assert set(english[["anchor_lang", "positive_lang", "negative_lang"]].to_numpy().ravel()) == {"en"}
    assert len(english) == frames["en"]["negative"].notna().sum()

    data_ = mt.triplet_data(rows, 16, seed=0)
    batches = data_.epoch_batches(0)
    assert sorted(i for batch in batches for i in batch) == list(range(len(rows)))  # every triplet once
    for batch in batches:
        chosen = rows.iloc[batch]
        assert chosen["pair_id"].is_unique
        per_row = [set(row) for row in chosen[["anchor", "positive", "negative"]].itertuples(index=False)]
        texts = [t for row in per_row for t in row]  # a row may repeat its own text (a name)
        assert len(texts) == len(set(texts))
    assert data_.epoch_batches(1) != batches and mt.triplet_data(rows, 16, seed=0).epoch_batches(0) == batches


def test_grouped_batches_keep_each_dataset_in_each_language_and_the_run_trains_on_them(data, monkeypatch):
    """``length_groups``: the triplets carry their pair's dataset; the run's batches are
    ``no_duplicate_batches`` grouped within (dataset, anchor language), still without a pair
    id twice, padding less than its random batches; the metrics record the setting."""
    from modsent.training.pairs import no_duplicate_batches

    made = recorded_training_data(monkeypatch)
    settings = {**SETTINGS, "model": str(data["mt5"]), "length_groups": 4, "max_steps": 1}
    result = mt.run_training("mST5-xnli", data["inputs"], mt.MST5Config.from_settings("mST5-xnli", settings),
                             english_only=False, device="cpu", progress=False)
    assert result.metrics["config"]["length_groups"] == 4
    (run,) = made
    rows = run.rows
    assert "dataset" in rows.columns and rows["anchor_lang"].nunique() == len(LANGS)  # negatives: one dataset
    # each triplet carries its own pair's label (here made to differ from pair to pair)
    frames = mt.read_frames(data["paths"], None, "k")
    relabelled = {lang: frame.assign(dataset=[f"d{i % 3}" for i in range(len(frame))])
                  for lang, frame in frames.items()}
    labels = relabelled["en"].set_index("pair_id")["dataset"]
    relabelled = {lang: frame.drop(columns="dataset").merge(labels.reset_index(), on="pair_id")
                  for lang, frame in relabelled.items()}
    triplets = mt.crosslingual_triplets(relabelled, seed=0)
    assert triplets["dataset"].nunique() == 3
    assert (triplets["dataset"].to_numpy() == labels.loc[triplets["pair_id"]].to_numpy()).all()
    english = mt.english_triplets(relabelled["en"])
    assert (english["dataset"].to_numpy() == labels.loc[english["pair_id"]].to_numpy()).all()
    grouped = run.epoch_batches(0)
    assert_grouped_batches(rows, grouped, no_duplicate_batches(rows, 8, 0, group_column="pair_id", length_groups=4,
                                                               strata_column=("dataset", "anchor_lang")),
                           mt.triplet_data(rows, 8, 0).epoch_batches(0), ["anchor", "positive", "negative"], "pair_id")


def test_datasets_choose_the_rows_and_a_missing_dataset_names_the_setting(data):
    frames = mt.read_frames(data["paths"], ["builtin-countries"], "methods.X.datasets")
    english = pd.read_parquet(data["paths"]["en"])
    countries = set(english.loc[english["dataset"] == "builtin-countries", "pair_id"])
    assert set(frames["en"]["pair_id"]) == countries
    with pytest.raises(InputError, match=r"methods\.X\.datasets \['mnli'\].*builtin-countries"):
        mt.read_frames(data["paths"], ["mnli"], "methods.X.datasets")
    with pytest.raises(InputError, match=r"methods\.mST5-en: unknown key\(s\) lr"):
        mt.MST5Config.from_settings("mST5-en", {"lr": 1})


# ---- training ----------------------------------------------------------------------------------


def test_a_tiny_mt5_trains_and_reloads_with_sentence_transformers_to_the_same_vectors(data, tmp_path):
    from sentence_transformers import SentenceTransformer

    methods.load()
    method = methods.get("mST5-xnli")
    settings = {**SETTINGS, "model": str(data["mt5"])}
    metrics = method.train(data["inputs"], tmp_path / "out", settings, device="cpu", progress=False)
    assert metrics["steps"] == 3 and metrics["lora_targets"] == ["q", "v"]
    assert 0 < metrics["padding_fraction"] < 1  # anchors, positives and negatives
    assert metrics["model_flops"] > 0 and metrics["model_tflops_per_second"] > 0
    assert metrics["mfu"] is None and metrics["gpu_peak_memory_gib"] is None  # the CPU: no peak
    assert metrics["languages"] == sorted(LANGS) and metrics["source_model"] == str(data["mt5"])
    assert metrics["trainable_parameters"] == 2 * 2 * 8 * (32 + 32)  # q, v of 2 blocks: A [8, 32], B [32, 8]
    assert not (tmp_path / "out.checkpoint").exists()

    # the same run in memory (a pure function of the settings) encodes as the saved directory
    result = mt.run_training("mST5-xnli", data["inputs"], mt.MST5Config.from_settings("mST5-xnli", settings),
                             english_only=False, device="cpu", progress=False)
    ours = result.model.encode(TEXTS)
    reloaded = SentenceTransformer(str(tmp_path / "out"), device="cpu")
    assert type(reloaded[0].auto_model).__name__ == "MT5EncoderModel"
    assert [type(m).__name__ for m in reloaded][1:] == ["Pooling"]  # mean pooling, no normalisation
    assert reloaded.max_seq_length == 32
    theirs = reloaded.encode(TEXTS, normalize_embeddings=True)
    assert np.min(np.sum(ours * theirs, axis=1)) >= 0.9999
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert not any("decoder" in k or "lora" in k for k in weights)  # the encoder alone, LoRA merged

    # trained: not the frozen encoder any more
    body, tokenizer = tf.load_encoder_body(data["mt5"])
    frozen = {k: v for k, v in body.state_dict().items()}
    changed = [k for k in weights if k in frozen and not torch.equal(weights[k], frozen[k])]
    assert changed and all(k.endswith(("q.weight", "v.weight")) for k in changed)

    # gradient checkpointing recomputes the same activations (dropout masks included): the same
    # training, so a runtime setting, out of the job's params and the checkpoints' fingerprint
    cfg = mt.MST5Config.from_settings("mST5-xnli", {**settings, "gradient_checkpointing": True})
    checkpointed = mt.run_training("mST5-xnli", data["inputs"], cfg, english_only=False, device="cpu", progress=False)
    assert np.allclose(checkpointed.model.encode(TEXTS), ours, atol=1e-5)
    assert method.settings_schema["gradient_checkpointing"][methods.ROLE_KEY] == "runtime"
    langs = sorted(data["inputs"]["pairs"])
    assert mt.training_fingerprint("mST5-xnli", cfg, settings["model"], langs, data["inputs"]["pairs"]) == \
        mt.training_fingerprint("mST5-xnli", mt.MST5Config.from_settings("mST5-xnli", settings), settings["model"],
                                langs, data["inputs"]["pairs"])

    # all-linear: every linear layer of the encoder
    targets = mt.lora_targets(body, "all-linear")
    assert {name.rsplit(".", 1)[-1] for name in targets} == {"q", "k", "v", "o", "wi_0", "wi_1", "wo"}
    assert len(targets) == 2 * 7


def test_the_model_flops_are_what_the_flop_counter_counts_for_the_three_passes(data):
    """model_flops (metrics.json): the loop counts the masks of a step's three passes (its
    TrainingLog), through the LoRA mT5 body's shape, 6N per token as published MFU figures
    count. PyTorch's FLOP counter on the same steps' loss and backward agrees once every weight
    trains; with the body frozen it sees nearer 4N (no weight gradients but LoRA's). A triplet
    per step: no padding, which the counter would count."""
    from torch.utils.flop_counter import FlopCounterMode

    from modsent.training.loop import TrainingLog

    cfg = mt.MST5Config.from_settings("mST5-xnli", {**SETTINGS, "model": str(data["mt5"])})
    model = mt.build_model(data["mt5"], cfg).model
    shape = efficiency.body_shape(model.encoder)
    assert shape[1:] == (2, 32) and any("lora_" in name for name, _ in model.encoder.named_parameters())
    rows = mt.crosslingual_triplets(mt.read_frames(data["paths"], None, "k"), 0).iloc[:4]
    loss_fn = losses.TripletInfoNCELoss(cfg.temperature)

    def run():
        log = TrainingLog(len(rows), 0, "test", False, 10)
        with FlopCounterMode(display=False) as counter:
            for step in range(len(rows)):
                features = mt.batch_features(model, rows.iloc[[step]])
                mt.batch_loss(model, loss_fn, rows.iloc[[step]], features).backward()
                log.record(step, 0.0, 0.0, 1, features)
        log.close()
        assert log.padded == 0 and log.tokens > 3 * len(rows)
        return counter.get_total_flops(), efficiency.encoder_flops(shape, log.tokens, log.token_squares)

    lora, ours = run()
    assert 0.6 * ours < lora < 0.75 * ours
    model.requires_grad_(True)
    full, again = run()
    assert again == ours and 0.98 * ours < full <= ours  # the LayerNorms' weights are in N


def test_storage_dtype_float16_saves_the_merged_training_rounded(data, tmp_path):
    """methods.mST5-xnli.storage_dtype: the LoRA merged in float32 as always, then every weight
    of the body rounded to float16; the same training and checkpoint fingerprint."""
    methods.load()
    settings = {**SETTINGS, "model": str(data["mt5"])}
    metrics = {dtype: methods.get("mST5-xnli").train(data["inputs"], tmp_path / dtype,
                                                     {**settings, "storage_dtype": dtype}, device="cpu",
                                                     progress=False) for dtype in ("float32", "float16")}
    assert metrics["float16"]["loss_last"] == metrics["float32"]["loss_last"]
    assert_stored_in_half(tmp_path / "float32", tmp_path / "float16", TEXTS)
    cfgs = [mt.MST5Config.from_settings("mST5-xnli", {**settings, "storage_dtype": d}) for d in ("float32", "float16")]
    paths = data["inputs"]["pairs"]
    assert len({mt.training_fingerprint("mST5-xnli", cfg, str(data["mt5"]), LANGS, paths) for cfg in cfgs}) == 1


def test_a_bfloat16_body_is_merged_and_saved_in_float32_and_encodes_as_it_trained(data, tmp_path):
    """dtype: bfloat16 holds the frozen weights in bfloat16 while training; the saved model is
    float32 with the LoRA merged at full precision, so it encodes as the trained (unmerged) model
    computed in float32. The update here is ~0.3% of each weight, finer than bfloat16's
    resolution of it: merged into bfloat16 weights, most of it would round away."""
    import copy

    from sentence_transformers import SentenceTransformer

    cfg = mt.MST5Config.from_settings("mST5-xnli", {**SETTINGS, "model": str(data["mt5"]), "dtype": "bfloat16"})
    model = mt.build_model(data["mt5"], cfg).model
    assert {p.dtype for n, p in model.encoder.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    generator = torch.Generator().manual_seed(0)
    frozen = copy.deepcopy(model)
    with torch.no_grad():  # a trained-looking LoRA: B·A·scaling ~0.3% of the weight it adds to
        for module in model.encoder.modules():
            if hasattr(module, "lora_B") and "default" in module.lora_B:
                b, a = module.lora_B["default"].weight, module.lora_A["default"].weight
                b.copy_(torch.randn(b.shape, generator=generator))
                delta = module.scaling["default"] * b @ a
                b.mul_(0.003 * module.base_layer.weight.float().norm() / delta.norm())

    def in_float32(encoder_model):
        unmerged = copy.deepcopy(encoder_model)
        unmerged.encoder = unmerged.encoder.float()
        return unmerged.encode(TEXTS)

    trained, before = in_float32(model), in_float32(frozen)
    effect = np.abs(trained - before).max()
    assert effect > 1e-4  # the LoRA moves the vectors measurably
    mt.write_output(mt.TrainingResult(model, str(data["mt5"]), {"method": "mST5-xnli"}, [[1, 1.0, 1e-3]]),
                    tmp_path / "out")
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    saved = SentenceTransformer(str(tmp_path / "out"), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert np.abs(saved - trained).max() < effect / 100


def test_a_killed_run_resumes_to_the_weights_of_an_unbroken_one(data, tmp_path):
    settings = {**SETTINGS, "model": str(data["mt5"]), "max_steps": 5, "checkpoint_every": 2}
    straight = mt.train_mst5("mST5-xnli", data["inputs"], tmp_path / "straight", settings, english_only=False,
                             device="cpu", progress=False)

    class Killed(Exception):
        pass

    def kill(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        mt.train_mst5("mST5-xnli", data["inputs"], tmp_path / "resumed", settings, english_only=False,
                      device="cpu", progress=False, on_step=kill)
    assert (tmp_path / "resumed.checkpoint").is_dir() and not (tmp_path / "resumed").exists()
    resumed = mt.train_mst5("mST5-xnli", data["inputs"], tmp_path / "resumed", settings, english_only=False,
                            device="cpu", progress=False)
    assert resumed["resumed_from_step"] == 2 and straight["resumed_from_step"] == 0
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    for key in ("loss_first", "loss_last", "steps", "heldout_retrieval_accuracy_before",
                "heldout_retrieval_accuracy_after"):
        assert resumed[key] == straight[key], key
    assert (tmp_path / "resumed" / "loss.tsv").read_text() == (tmp_path / "straight" / "loss.tsv").read_text()
    # a checkpoint of other settings is not resumed
    with pytest.raises(Killed):
        mt.train_mst5("mST5-xnli", data["inputs"], tmp_path / "other", settings, english_only=False,
                      device="cpu", progress=False, on_step=kill)
    other = mt.train_mst5("mST5-xnli", data["inputs"], tmp_path / "other", {**settings, "learning_rate": 1e-3},
                          english_only=False, device="cpu", progress=False)
    assert other["resumed_from_step"] == 0


def test_batches_tokenised_ahead_train_what_tokenising_in_the_step_trains(data, monkeypatch):
    """The loop tokenises batch i+1 on a thread during step i (loop.ahead): the same weights and
    logged losses as the plain loop, bit for bit; a prepared batch has the loss of its texts."""
    from modsent.training import loop

    cfg = mt.MST5Config.from_settings("mST5-xnli", {**SETTINGS, "model": str(data["mt5"])})
    run = dict(english_only=False, device="cpu", progress=False)
    threaded = mt.run_training("mST5-xnli", data["inputs"], cfg, **run)
    monkeypatch.setattr(mt, "ahead", lambda items, prepare: loop.ahead(items, prepare, enabled=False))
    passes = counted_training_passes(monkeypatch)
    serial = mt.run_training("mST5-xnli", data["inputs"], cfg, **run)
    a, b = threaded.model.state_dict(), serial.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert threaded.history == serial.history and len(threaded.history) == 3
    # the model FLOPs: every pass the steps ran (anchors, positives, negatives), through the LoRA body
    assert serial.metrics["model_flops"] == threaded.metrics["model_flops"] == efficiency.encoder_flops(
        efficiency.body_shape(serial.model.encoder), passes.tokens, passes.token_squares)

    model, rows = serial.model.eval(), pd.DataFrame({"anchor": TEXTS, "positive": TEXTS[::-1], "negative": TEXTS[1:] + TEXTS[:1]})
    loss_fn = losses.TripletInfoNCELoss(cfg.temperature)
    with torch.no_grad():
        prepared = mt.batch_loss(model, loss_fn, rows, mt.batch_features(model, rows))
        by_hand = loss_fn(model(rows["anchor"].tolist()), model(rows["positive"].tolist()), model(rows["negative"].tolist()))
    assert torch.equal(prepared, by_hand)


def test_compile_routes_the_lora_encoder_through_dynamo_and_trains_what_eager_trains(data, traced_compile):
    """methods.mST5-*.compile: the LoRA-wrapped T5 encoder is compiled in place (Dynamo graphs run
    eagerly: the traced_compile fixture) and trains the eager run's LoRA and losses; the merged
    output is a plain encoder again; the checkpoint fingerprint leaves the setting out."""
    modules, graphs = traced_compile
    settings = {**SETTINGS, "model": str(data["mt5"])}
    run = dict(english_only=False, device="cpu", progress=False)
    eager = mt.run_training("mST5-xnli", data["inputs"], mt.MST5Config.from_settings("mST5-xnli", settings), **run)
    cfg = mt.MST5Config.from_settings("mST5-xnli", {**settings, "compile": True})
    compiled = mt.run_training("mST5-xnli", data["inputs"], cfg, **run)
    assert len(modules) == 1 and modules[0] is compiled.model.encoder and graphs() >= 1
    assert [row[1] for row in compiled.history] == pytest.approx([row[1] for row in eager.history], rel=1e-5)
    a, b = eager.model.state_dict(), compiled.model.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert compiled.metrics["config"]["compile"] and not eager.metrics["config"]["compile"]
    langs, source = sorted(data["inputs"]["pairs"]), str(data["mt5"])
    assert mt.training_fingerprint("mST5-xnli", cfg, source, langs, data["inputs"]["pairs"]) == \
        mt.training_fingerprint("mST5-xnli", mt.MST5Config.from_settings("mST5-xnli", settings), source, langs,
                                data["inputs"]["pairs"])


@needs_cpu_compiler  # (the trainer's compile check asks for one, whatever the backend)
def test_gradient_checkpointing_with_compile_trains_what_eager_trains(data, monkeypatch):
    """gradient_checkpointing: true with compile: true: the mT5 blocks run again in the backward
    from the random state their forward saved (AOTAutograd's handling of the checkpointed regions,
    here through its aot_eager backend: Inductor's code generation, which MEXMA's test of the pair
    runs, takes a minute for this model), so the losses and weights are the plain eager run's; the
    encoder is compiled with Inductor's dropout drawn as eager's (compile_in_place's eager_random)."""
    original, options = torch.nn.Module.compile, []

    def aot_eager(module, *args, **kwargs):
        options.append(kwargs.pop("options", None))  # Inductor's: aot_eager draws as eager anyway
        return original(module, *args, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", aot_eager)
    cfg = mt.MST5Config.from_settings("mST5-xnli", {**SETTINGS, "model": str(data["mt5"])})
    eager, both = compiled_against_eager(lambda on: mt.run_training(
        "mST5-xnli", data["inputs"], dataclasses.replace(cfg, compile=on, gradient_checkpointing=on),
        english_only=False, device="cpu", progress=False))
    assert both.metrics["config"]["compile"] and both.metrics["config"]["gradient_checkpointing"]
    assert options == [{"fallback_random": True}]  # compile_in_place's eager_random, as with Inductor
    assert [row[1] for row in both.history] == pytest.approx([row[1] for row in eager.history], rel=1e-5)
    a, b = eager.model.state_dict(), both.model.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("kind", ["xlmr-mean-normalize", "bert-cls-dense"])
def test_encoder_only_bases_train_keep_their_head_and_reload(data, tmp_path, kind):
    """model: null trains the workflow's base (a sentence-transformers directory, its own
    pooling kept); English-only triplets."""
    from sentence_transformers import SentenceTransformer

    base = data["base"] if kind.startswith("xlmr") else make_tiny_bert(tmp_path / "bert", sample_texts(600),
                                                                        pooling="cls")
    inputs = {"base": base, "pairs": data["paths"]}
    methods.load()
    metrics = methods.get("mST5-en-all").train(inputs, tmp_path / "out", SETTINGS, device="cpu", progress=False)
    assert metrics["languages"] == ["en"] and metrics["english_only"]
    assert metrics["triplets_by_anchor_language"].keys() == {"en"} and metrics["crosslingual_positive_share"] == 0
    assert metrics["config"]["targets"] == "all-linear"  # the variant's default
    assert methods.get("mST5-en-all").schema()["properties"]["learning_rate"]["default"] == 5e-4
    assert not any("pooler" in name for name in metrics["lora_targets"])
    cfg = mt.MST5Config.from_settings("mST5-en-all", {**SETTINGS, "targets": "all-linear"})
    result = mt.run_training("mST5-en-all", inputs, cfg, english_only=True, device="cpu", progress=False)
    reloaded = SentenceTransformer(str(tmp_path / "out"), device="cpu")
    original = SentenceTransformer(str(base), device="cpu")
    assert [type(m).__name__ for m in reloaded] == [type(m).__name__ for m in original]
    ours, theirs = result.model.encode(TEXTS), reloaded.encode(TEXTS, normalize_embeddings=True)
    assert np.min(np.sum(ours * theirs, axis=1)) >= 0.9999
    assert not np.allclose(theirs, original.encode(TEXTS, normalize_embeddings=True, prompt=""), atol=1e-4)
    body, _ = tf.load_encoder_body(base)
    assert mt.lora_targets(body, "qv") == ["query", "value"]
