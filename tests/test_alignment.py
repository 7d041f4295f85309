import hashlib
import json
import multiprocessing
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from modsent.modular import alignment as al
from modsent.modular import parallel_adapter as pa
from modsent.modular import sentence_adapter as sa
from modsent.io import InputError
from modsent.data.paraphrase import (align_provided, crosslingual_paraphrase_pairs, parallel_pairs,
                                     provided_sample, smallest_hashes, translate_pairs)
from modsent.sources.builtin import builtin_translations
from modsent.testing import make_tiny_xlmr, sample_texts
from modsent.training import efficiency
from tiny_modules import (assert_resumed_equals_straight, assert_trained_alike, compiled_against_eager,
                          counted_training_passes, inductor_draws_as_eager, language_modules, logged_losses,
                          tiny_base_and_data)

SE_CFG = sa.SentenceAdapterConfig(batch_size=16, seq_len=32, learning_rate=5e-3, max_steps=60,
                                  lora_dropout=0.0, eval_pairs=20, log_every=4, seed=0)
# A tiny random model learns only with a large learning rate.
CFG = al.AlignmentConfig(batch_size=16, learning_rate=1e-2, max_steps=120, warmup_ratio=0.1,
                         eval_pairs=40, log_every=10, seed=0, seq_len=32)
# pp fits its ~130 training pairs at this rate within a few epochs and then overfits them: after
# 30 steps its 15 held-out pairs are retrieved better (accuracy 0.67 -> 0.80, MNRL 1.59 -> 1.51),
# after 60 no better than before (0.67, MNRL 1.64), after 120 by the draw of a pair or two.
PP_STEPS = 30


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny random XLM-R base, English and German LA + SE, the built-in data aligned."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread on shared cores is 100x slower
    root = tmp_path_factory.mktemp("cla")
    base, english, units = tiny_base_and_data(root)
    de_units, _ = align_provided(units, builtin_translations("de"), "de")
    de_pairs = translate_pairs(english, de_units)
    en_la, en_se = language_modules(root, base, "en", english, SE_CFG)
    de_la, de_se = language_modules(root, base, "de", de_pairs, SE_CFG)
    units_path = root / "units.parquet"
    units.to_parquet(units_path, index=False)
    embeddings = al.embed_english(base, en_la, en_se, units_path, root / "english.safetensors", batch_size=32,
                                  device="cpu")
    # The same without LAs (one tokenizer for both languages): for this tiny random model the
    # task the held-out retrieval measures is learnable only then (with separate tokenizers and
    # FOCUS embeddings from 16-dimensional fastText vectors, 130 training pairs do not generalise).
    for lang in ("en", "de"):
        sa.train_sentence_adapter(base, None, root / f"pairs-{lang}.parquet", root / f"se-{lang}-nola", SE_CFG,
                                  device="cpu", progress=False)
    embeddings_nola = al.embed_english(base, None, root / "se-en-nola", units["text"].tolist(),
                                       root / "english-nola.safetensors", device="cpu")
    yield {"base": base, "root": root, "en_la": en_la, "en_se": en_se, "de_la": de_la, "de_se": de_se,
           "units": units, "embeddings": embeddings, "de_se_nola": root / "se-de-nola",
           "embeddings_nola": embeddings_nola,
           "pp": crosslingual_paraphrase_pairs(english, de_pairs), "pl": parallel_pairs(de_units)}
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(inputs):
    """pp and pl adapters trained on German (each once for the module), without LAs (learnable)."""
    out = {}
    for kind in ("pp", "pl"):
        directory = inputs["root"] / f"cla-{kind}"
        cfg = al.AlignmentConfig(**{**CFG.__dict__, "max_steps": PP_STEPS}) if kind == "pp" else CFG
        metrics = al.train_alignment_adapter(kind, inputs["base"], None, inputs["de_se_nola"], inputs[kind],
                                             inputs["embeddings_nola"], directory, cfg, language="de",
                                             device="cpu", progress=False)
        out[kind] = (directory, metrics)
    return out


def _digest(directory) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_english_embeddings_are_the_english_encoder_s(inputs):
    saved = load_file(str(inputs["embeddings"]))["embeddings"]
    ids = pd.read_parquet(al.units_path(inputs["embeddings"]))
    assert ids["unit_id"].tolist() == inputs["units"]["unit_id"].tolist()  # rows in id order
    assert saved.dtype == torch.float32 and saved.shape == (len(ids), 32)
    encoder = sa.load_sentence_encoder(inputs["base"], inputs["en_la"], inputs["en_se"], device="cpu")
    texts = ids["text"].tolist()
    assert np.allclose(saved.numpy(), encoder.encode(texts, batch_size=7), atol=1e-5)
    english = al.read_english_embeddings(inputs["embeddings"])
    some = texts[5:9]
    assert torch.equal(english.lookup(some), saved[5:9])
    with pytest.raises(InputError, match="no stored embedding"):
        english.lookup(["a sentence nobody embedded"])
    # a list of sentences works too; duplicates are embedded once
    small = al.embed_english(inputs["base"], inputs["en_la"], inputs["en_se"], [texts[0], texts[1], texts[0]],
                             inputs["root"] / "small.safetensors", device="cpu")
    assert load_file(str(small))["embeddings"].shape == (2, 32)


def test_fresh_cla_adapter_is_the_identity_and_only_adapters_train(inputs, tmp_path):
    texts = inputs["pp"]["positive"].tolist()[:20]
    reference = sa.load_sentence_encoder(inputs["base"], inputs["de_la"], inputs["de_se"], device="cpu",
                                         max_seq_length=32).encode(texts)
    model = al.build_alignment_model(inputs["base"], inputs["de_la"], inputs["de_se"], CFG, device="cpu")
    assert np.allclose(model.encode(texts), reference, atol=1e-6)
    pa.save_parallel_adapters(model.encoder, tmp_path / "fresh")
    loaded = al.load_aligned_encoder(inputs["base"], inputs["de_la"], inputs["de_se"], tmp_path / "fresh",
                                     device="cpu", max_seq_length=32)
    assert np.allclose(loaded.encode(texts), reference, atol=1e-6)

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".parallel_adapter." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    english = al.read_english_embeddings(inputs["embeddings"])
    for kind in ("pp", "pl"):
        pairs = al.alignment_pairs(kind, inputs[kind])
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        model.train()
        for batch in sa.no_duplicate_batches(pairs, 16, 0)[:2]:
            al.batch_loss(kind, model, english, pairs.iloc[batch]).backward()
            optimizer.step()
            optimizer.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".parallel_adapter." in n for n in changed)
    assert any(".parallel_adapter.up." in n for n in changed)  # no longer the identity


def test_a_batch_prepared_ahead_on_a_thread_has_the_loss_of_its_definition(inputs):
    """Training prepares each batch (English vectors, L's texts tokenised) on a thread one step
    ahead (modsent.training.loop.ahead): the loss is the one computed in the step, and both are
    the loss's definition on L's texts encoded one by one (pl: cosine MSE; pp: MNRL with the
    hard negatives as extra candidates)."""
    from modsent import losses
    from modsent.training.loop import ahead

    model = al.build_alignment_model(inputs["base"], inputs["de_la"], inputs["de_se"], CFG, device="cpu")
    model.eval()  # no dropout: the same numbers every time
    english = al.read_english_embeddings(inputs["embeddings"])
    for kind in ("pp", "pl"):
        pairs = al.alignment_pairs(kind, inputs[kind])
        batches = sa.no_duplicate_batches(pairs, 16, 0)[:3]
        with torch.no_grad():
            prepared = [al.batch_loss(kind, model, english, pairs.iloc[b], 20.0, ready) for b, ready in
                        ahead(batches, lambda b: al.batch_inputs(kind, model, english, pairs.iloc[b]))]
            direct = [al.batch_loss(kind, model, english, pairs.iloc[b]) for b in batches]
            for batch, loss in zip(batches, prepared):
                rows = pairs.iloc[batch]
                anchors = english.lookup(rows["anchor"].tolist())
                one = torch.cat([model([t]) for t in rows["positive"]])
                if kind == "pl":
                    reference = losses.CosineSimilarityLoss()(anchors, one)
                else:
                    negatives = [model([t]) for t in rows["negative"] if isinstance(t, str)]
                    assert negatives  # the hard negatives are part of the batch
                    reference = losses.MultipleNegativesRankingLoss(20.0)(anchors, one, torch.cat(negatives))
                assert torch.allclose(loss, reference, atol=1e-5), kind
        assert [x.item() for x in prepared] == [x.item() for x in direct]


def test_pp_batches_hold_no_text_twice(inputs):
    pairs = al.alignment_pairs("pp", inputs["pp"])
    assert pairs["negative"].notna().any()
    for batch in sa.no_duplicate_batches(pairs, 16, 0):
        texts = [t for i in batch for t in pairs.loc[i, ["anchor", "positive", "negative"]] if isinstance(t, str)]
        per_row = sum(len({t for t in pairs.loc[i, ["anchor", "positive", "negative"]] if isinstance(t, str)})
                      for i in batch)
        assert len(set(texts)) == per_row


@pytest.mark.parametrize("kind", ["pp", "pl"])
def test_training_raises_heldout_crosslingual_retrieval(inputs, trained, kind):
    directory, metrics = trained[kind]
    assert metrics["steps"] == (PP_STEPS if kind == "pp" else CFG.max_steps) and metrics["kind"] == kind
    assert 0 < metrics["padding_fraction"] < 1  # of L's side, counted from the batches' host masks
    assert metrics["model_flops"] > 0 and metrics["model_tflops_per_second"] > 0
    assert metrics["mfu"] is None and metrics["gpu_peak_memory_gib"] is None  # the CPU: no peak
    assert metrics["heldout_pairs"] >= 10
    assert metrics["heldout_retrieval_accuracy_after"] > metrics["heldout_retrieval_accuracy_before"], metrics
    assert metrics["loss_last"] < metrics["loss_first"]
    files = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
    assert {f"adapter/{pa.WEIGHTS_NAME}", f"adapter/{pa.CONFIG_NAME}", "metrics.json", "loss.tsv",
            "loss.png"} == files
    record = pa.read_adapter_config(directory / "adapter")
    assert record["metadata"]["language"] == "de" and record["metadata"]["kind"] == kind
    assert json.loads((directory / "metrics.json").read_text())["config"]["adapter"]["scaling"] == 4.0
    # reloaded: the accuracy measured in training, deterministic encodings
    encoder = al.load_aligned_encoder(inputs["base"], None, inputs["de_se_nola"], directory, device="cpu",
                                      max_seq_length=32)
    _, heldout = al.split_pairs(al.alignment_pairs(kind, inputs[kind]), CFG.eval_pairs)
    english = al.read_english_embeddings(inputs["embeddings_nola"])
    accuracy = al.retrieval_accuracy(encoder.model, english, heldout["anchor"].tolist(),
                                     heldout["positive"].tolist())
    assert accuracy == pytest.approx(metrics["heldout_retrieval_accuracy_after"])
    texts = heldout["positive"].tolist()
    again = al.load_aligned_encoder(inputs["base"], None, inputs["de_se_nola"], directory, device="cpu",
                                    max_seq_length=32)
    assert np.array_equal(again.encode(texts, batch_size=4), encoder.encode(texts, batch_size=4))


def test_training_leaves_la_and_se_unchanged(inputs, trained):
    # the module's trainings ran before: the LA/SE directories are as the fixture wrote them
    la_se = [inputs[k] for k in ("de_la", "de_se")]
    digests = [_digest(d) for d in la_se]
    cfg = al.AlignmentConfig(**{**CFG.__dict__, "max_steps": 3})
    al.train_alignment_adapter("pl", inputs["base"], inputs["de_la"], inputs["de_se"], inputs["pl"],
                               inputs["embeddings"], inputs["root"] / "cla-short", cfg, device="cpu", progress=False)
    assert [_digest(d) for d in la_se] == digests
    # with the LA: the adapter records the language (here: the directory's name) and loads
    encoder = al.load_aligned_encoder(inputs["base"], inputs["de_la"], inputs["de_se"], inputs["root"] / "cla-short",
                                      device="cpu")
    assert encoder.encode(["Republik Namibia", "Namibia"]).shape == (2, 32)


def test_merge_is_the_mean_and_loads(inputs, trained, tmp_path):
    pp_dir, pl_dir = trained["pp"][0], trained["pl"][0]
    out = al.merge_alignment_adapters(pp_dir, pl_dir, (0.5, 0.5), tmp_path / "merged")
    merged = load_file(str(out / "adapter" / pa.WEIGHTS_NAME))
    pp = load_file(str(pp_dir / "adapter" / pa.WEIGHTS_NAME))
    pl = load_file(str(pl_dir / "adapter" / pa.WEIGHTS_NAME))
    assert merged.keys() == pp.keys() == pl.keys()
    for key in merged:
        assert torch.allclose(merged[key], (pp[key] + pl[key]) / 2, atol=1e-7)
    record = pa.read_adapter_config(out / "adapter")
    assert record["metadata"]["language"] == "de" and record["metadata"]["kind"] == "merged"
    encoder = al.load_aligned_encoder(inputs["base"], None, inputs["de_se_nola"], out, device="cpu")
    plain = al.load_aligned_encoder(inputs["base"], None, inputs["de_se_nola"], None, device="cpu")
    texts = inputs["pl"]["translation"].tolist()[:10]
    emb = encoder.encode(texts)
    assert emb.shape == (10, 32) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(emb, plain.encode(texts), atol=1e-4)  # the merged adapter is active
    with pytest.raises(InputError, match="sum to 1"):
        al.merge_alignment_adapters(pp_dir, pl_dir, (0.5, 0.6), tmp_path / "bad")


def test_adapter_or_embeddings_from_another_base_are_refused(inputs, trained, tmp_path):
    other = make_tiny_xlmr(tmp_path / "other", sample_texts(600), seed=1)
    with pytest.raises(InputError, match="another base model"):
        al.load_aligned_encoder(other, None, None, trained["pp"][0], device="cpu")
    foreign = al.embed_english(other, None, None, inputs["units"]["text"].tolist(), tmp_path / "en.safetensors",
                               device="cpu")
    with pytest.raises(InputError, match="another base model"):
        al.train_alignment_adapter("pl", inputs["base"], inputs["de_la"], inputs["de_se"], inputs["pl"], foreign,
                                   tmp_path / "x", CFG, device="cpu", progress=False)
    assert not (tmp_path / "x").exists()


def test_bad_inputs(inputs, tmp_path):
    with pytest.raises(InputError, match="kind"):
        al.alignment_pairs("xx", inputs["pl"])
    with pytest.raises(InputError, match="missing columns"):
        al.alignment_pairs("pp", inputs["pl"])
    with pytest.raises(InputError, match="embed_english"):
        al.read_english_embeddings(tmp_path / "none.safetensors")


def test_heldout_diagnostics_match_their_definitions(inputs, trained):
    """The spread is the mean cosine over distinct pairs, the pair cosine each English vector
    with its own translation, both from vectors computed here another way."""
    directory, metrics = trained["pl"]
    encoder = al.load_aligned_encoder(inputs["base"], None, inputs["de_se_nola"], directory, device="cpu",
                                      max_seq_length=32)
    _, heldout = al.split_pairs(al.alignment_pairs("pl", inputs["pl"]), CFG.eval_pairs)
    english = al.read_english_embeddings(inputs["embeddings_nola"])
    found = al.heldout_diagnostics(encoder.model, english, heldout["anchor"].tolist(), heldout["positive"].tolist())
    vectors = encoder.encode(heldout["positive"].tolist())
    anchors = english.lookup(heldout["anchor"].tolist()).numpy()
    n = len(vectors)
    cosines = [float(vectors[i] @ vectors[j]) for i in range(n) for j in range(n) if i != j]
    assert found["l_spread"] == pytest.approx(np.mean(cosines), abs=1e-5)
    own = [float(anchors[i] @ vectors[i] / np.linalg.norm(anchors[i])) for i in range(n)]
    assert found["pair_cosine"] == pytest.approx(np.mean(own), abs=1e-5)
    assert found["retrieval_accuracy"] == pytest.approx(metrics["heldout_retrieval_accuracy_after"])
    assert metrics["heldout_l_spread_after"] == pytest.approx(found["l_spread"], abs=1e-5)
    assert {"heldout_l_spread_before", "heldout_pair_cosine_before"} <= set(metrics)
    assert al.mean_pairwise_cosine(np.ones((4, 3))) == pytest.approx(1.0)
    assert al.mean_pairwise_cosine(np.eye(3)) == pytest.approx(0.0)
    assert al.mean_pairwise_cosine(np.ones((1, 3))) is None
    summary = inputs["root"] / "summary.md"
    al.write_summary([trained["pp"][0], directory], summary)
    rows = [line for line in summary.read_text().splitlines() if line.startswith("| de |")]
    assert len(rows) == 2 and f"{metrics['heldout_l_spread_before']:.3f} → " in rows[1]


def test_provided_sample_is_order_free_and_capped():
    frame = pd.DataFrame({"english": [f"Sentence {i}" for i in range(30)] + ["Sentence 0", None, "x"],
                          "translation": [f"Satz {i}" for i in range(30)] + ["Satz 0", "y", "  "]})
    everything = provided_sample(frame, None)
    assert len(everything) == 30  # the duplicate and the rows without both texts dropped
    capped = provided_sample(frame, 10)
    shuffled = provided_sample(frame.sample(frac=1, random_state=1), 10)
    assert len(capped) == 10 and set(capped["english"]) == set(shuffled["english"])
    assert set(capped["english"]) < set(everything["english"])
    assert provided_sample(frame, 100).equals(everything)
    with pytest.raises(InputError, match="corpus.parquet: missing"):
        provided_sample(frame.rename(columns={"english": "en"}), None, source="corpus.parquet")


def test_parallel_pairs_add_the_provided_translations_once(inputs):
    units = inputs["units"].head(5)
    translations = pd.DataFrame({"unit_id": units["unit_id"], "text": units["text"],
                                 "translation": [f"t{i}" for i in range(5)]})
    provided = pd.DataFrame({"english": [units["text"].iloc[0], "Another", "Blank", None],
                             "translation": ["t0", "Noch", " ", "x"]})
    pairs = parallel_pairs(translations, provided)
    assert pairs["english"].tolist() == units["text"].tolist() + ["Another"]
    assert pairs["unit_id"].iloc[-1] == al.make_units(["Another"])["unit_id"].iloc[0]
    assert parallel_pairs(translations).equals(pairs.head(5))
    with pytest.raises(InputError, match="english, translation"):
        parallel_pairs(translations, provided.rename(columns={"english": "en"}))
    # alignment.max_parallel: the same rows whatever their order, kept in order, with the provided ones
    capped = smallest_hashes(pairs, 3)
    assert len(capped) == 3 and set(capped["english"]) < set(pairs["english"])
    assert capped["english"].tolist() == [t for t in pairs["english"] if t in set(capped["english"])]
    shuffled = smallest_hashes(parallel_pairs(translations.iloc[::-1].reset_index(drop=True), provided), 3)
    assert set(zip(shuffled["english"], shuffled["translation"])) == set(zip(capped["english"], capped["translation"]))
    assert smallest_hashes(pairs, 6).equals(pairs)
    # the stage caps its pl pairs itself (alignment.max_parallel is an AlignmentConfig field)
    rows = al.alignment_pairs("pl", pairs, max_parallel=3)
    assert list(zip(rows["anchor"], rows["positive"])) == list(zip(capped["english"], capped["translation"]))
    assert al.AlignmentConfig.from_config({"max_parallel": 3}).max_parallel == 3
    with pytest.raises(InputError, match="max_parallel must be at least 1"):
        al.AlignmentConfig(max_parallel=0)


def test_config_from_a_config_section():
    cfg = al.AlignmentConfig.from_config({"batch_size": 32, "lr": 1e-4, "adapter": {"reduction_factor": 4,
                                                                                     "layers": [0, 1]}})
    assert (cfg.batch_size, cfg.learning_rate) == (32, 1e-4)
    assert cfg.adapter == pa.ParallelAdapterConfig(reduction_factor=4, layers=(0, 1))
    default = al.AlignmentConfig()
    assert (default.batch_size, default.learning_rate, default.scale, default.epochs, default.warmup_ratio) == \
        (256, 2e-5, 20.0, 1, 0.1)
    assert default.adapter == pa.ParallelAdapterConfig()
    with pytest.raises(InputError, match="unknown"):
        al.AlignmentConfig.from_config({"batchsize": 32})
    with pytest.raises(InputError, match="unknown"):
        al.AlignmentConfig.from_config({"adapter": {"size": 3}})


# dropout on in the adapters (and the encoder's own): a resumed run must draw the same masks
RESUME_CFG = al.AlignmentConfig(**{**CFG.__dict__, "max_steps": 7, "checkpoint_every": 3, "log_every": 1,
                                   "adapter": pa.ParallelAdapterConfig(dropout=0.1)})


def _train(inputs, kind, out, cfg=RESUME_CFG, on_step=None):
    return al.train_alignment_adapter(kind, inputs["base"], inputs["de_la"], inputs["de_se"], inputs[kind],
                                      inputs["embeddings"], out, cfg, language="de", device="cpu",
                                      progress=False, on_step=on_step)


def _train_and_die(inputs, kind, out, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    _train(inputs, kind, out, on_step=die)


def _kill_midway(inputs, kind, out, die_at):
    process = multiprocessing.get_context("fork").Process(target=_train_and_die, args=(inputs, kind, out, die_at))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["pp", "pl"])
def test_grouped_batches_group_by_l_s_texts(inputs, kind, tmp_path, monkeypatch):
    """alignment.length_groups: each step's rows are the grouped batches of the training pairs,
    by the length of L's texts (the English side is looked up, not encoded)."""
    from modsent.training.pairs import batches_of_steps

    seen = []
    loss_of = al.batch_loss

    def recording(kind_, model, english, rows, *args):
        seen.append(rows["positive"].tolist())
        return loss_of(kind_, model, english, rows, *args)

    monkeypatch.setattr(al, "batch_loss", recording)
    passes = counted_training_passes(monkeypatch)
    torch.set_num_threads(1)
    cfg = al.AlignmentConfig(**{**CFG.__dict__, "max_steps": 3, "length_groups": 4})
    metrics = _train(inputs, kind, tmp_path / kind, cfg)
    # the model FLOPs: L's side of every step (the English side is looked up), through the adapters' body
    body = efficiency.body_shape(al.build_alignment_model(inputs["base"], inputs["de_la"], inputs["de_se"], cfg,
                                                          device="cpu").encoder)
    assert metrics["model_flops"] == efficiency.encoder_flops(body, passes.tokens, passes.token_squares) > 0
    train, _ = al.split_pairs(al.alignment_pairs(kind, inputs[kind]), cfg.eval_pairs)
    assert ("dataset" in train.columns) == (kind == "pp")  # pl's translations have no datasets
    steps = batches_of_steps(train, 16, 0, 3, length_groups=4, length_columns=al.L_TEXT_COLUMNS)
    assert seen == [train.iloc[b]["positive"].tolist() for b in steps]
    assert metrics["config"]["length_groups"] == 4


@pytest.mark.parametrize("kind", ["pp", "pl"])
def test_killed_job_resumes_from_its_last_checkpoint(inputs, kind, tmp_path):
    straight = tmp_path / "straight"
    cudnn_attention = []  # whether SDPA may take cuDNN's kernel, at each step (a plan per batch shape)
    expected = _train(inputs, kind, straight,
                      on_step=lambda step: cudnn_attention.append(torch.backends.cuda.cudnn_sdp_enabled()))
    assert cudnn_attention == [False] * RESUME_CFG.max_steps and torch.backends.cuda.cudnn_sdp_enabled()
    assert not Path(f"{straight}.checkpoint").exists()  # removed once the output is complete
    resumed = tmp_path / "resumed"
    _kill_midway(inputs, kind, resumed, die_at=5)
    assert not resumed.exists()  # nothing Snakemake would accept
    checkpoint = Path(f"{resumed}.checkpoint")
    assert sorted(p.name for p in checkpoint.iterdir()) == ["meta.json", "state.safetensors"]
    assert json.loads((checkpoint / "meta.json").read_text())["step"] == 3
    metrics = _train(inputs, kind, resumed)
    assert metrics["resumed_from_step"] == 3 and expected["resumed_from_step"] == 0
    assert not checkpoint.exists()
    assert_resumed_equals_straight(straight, resumed, expected, metrics, pa.WEIGHTS_NAME)


def test_checkpoint_of_other_settings_or_inputs_is_not_resumed(inputs, tmp_path):
    out = tmp_path / "de"
    _kill_midway(inputs, "pl", out, die_at=4)
    other = al.AlignmentConfig(**{**RESUME_CFG.__dict__, "learning_rate": 5e-3})
    assert _train(inputs, "pl", out, other)["resumed_from_step"] == 0
    data = al.alignment_pairs("pl", inputs["pl"])
    args = (inputs["base"], inputs["de_la"], inputs["de_se"], data, inputs["embeddings"])
    fingerprint = RESUME_CFG.fingerprint("pl", *args)
    assert RESUME_CFG.fingerprint("pp", *args) != fingerprint
    assert RESUME_CFG.fingerprint("pl", *args[:4], inputs["embeddings_nola"]) != fingerprint
    assert RESUME_CFG.fingerprint("pl", *args[:2], inputs["de_se_nola"], *args[3:]) != fingerprint
    assert RESUME_CFG.fingerprint("pl", *args[:3], data.iloc[1:], args[4]) != fingerprint


def test_the_workflow_leaves_the_same_data_keys_out_of_pp_params():
    """rules/common.smk keeps its own copy of PL_ONLY_KEYS (importing torch into planning is slow)."""
    from conftest import REPO

    expected = "ALIGNMENT_DATA_KEYS = (" + ", ".join(f'"{key}"' for key in al.PL_ONLY_KEYS) + ")"
    assert expected in (REPO / "rules" / "common.smk").read_text()
    assert al.AlignmentConfig.from_config({"provided_translations": True, "max_provided": 5}) == al.AlignmentConfig()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and modsent's whole environment "
                    "(gpu.sh's images lack the fixtures' packages): pytest tests -k on_a_gpu on a GPU node")
@inductor_draws_as_eager()
def test_the_stage_compiled_on_a_gpu_trains_the_parallel_adapter_as_the_eager_one(inputs, tmp_path):
    """alignment.compile end to end on a GPU, with Inductor (bf16 autocast, Triton's kernels, the
    stage's attention without cuDNN): the eager run's losses within bf16's rounding and the same
    training of the parallel adapter (its up-projection starts at zero)."""
    import dataclasses

    cfg = dataclasses.replace(CFG, max_steps=6, log_every=1)
    eager, compiled = compiled_against_eager(lambda on: al.train_alignment_adapter(
        "pp", inputs["base"], None, inputs["de_se_nola"], inputs["pp"], inputs["embeddings_nola"],
        tmp_path / ("compiled" if on else "eager"), dataclasses.replace(cfg, compile=on), language="de",
        device="cuda", progress=False))
    assert compiled["config"]["compile"] and not eager["config"]["compile"]
    assert_trained_alike(tmp_path, f"adapter/{pa.WEIGHTS_NAME}", (".up.",), rel=3e-2, cosine=0.95)


def test_a_compiled_encoder_trains_the_parallel_adapter_as_the_eager_one(inputs, tmp_path, traced_compile):
    """alignment.compile: the frozen encoder with its parallel adapters under torch.compile
    (dynamic sizes after the first batch) gives the eager run's losses, held-out figures and
    adapter (fp32, the CPU). Dynamo's graphs run with the eager backend (``traced_compile``):
    the sentence adapter's and language adapter's tests compile with Inductor itself."""
    import dataclasses

    compiled_modules, graphs = traced_compile
    cfg = dataclasses.replace(CFG, max_steps=3, log_every=1)
    runs = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        runs[name] = al.train_alignment_adapter(
            "pp", inputs["base"], None, inputs["de_se_nola"], inputs["pp"], inputs["embeddings_nola"],
            tmp_path / name, dataclasses.replace(cfg, compile=compiled), language="de", device="cpu",
            progress=False)
        assert len(compiled_modules) == (1 if compiled else 0) and (graphs() >= 1) == compiled
    assert runs["compiled"]["config"]["compile"] and not runs["eager"]["config"]["compile"]
    losses = [logged_losses(tmp_path / name) for name in ("eager", "compiled")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-4)
    for key in ("heldout_retrieval_accuracy_before", "heldout_retrieval_accuracy_after"):
        assert runs["compiled"][key] == pytest.approx(runs["eager"][key]), key
    x, y = (load_file(str(tmp_path / run / "adapter" / pa.WEIGHTS_NAME)) for run in ("eager", "compiled"))
    assert x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=1e-5) for k in x)
