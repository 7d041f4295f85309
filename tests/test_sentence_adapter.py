import hashlib
import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from modsent.modular import language_adapter as la
from modsent.modular import sentence_adapter as sa
from modsent.modular.fasttext_embeddings import train_token_fasttext
from modsent.modular.focus import initialize_embeddings
from modsent.io import InputError
from modsent.losses import MultipleNegativesRankingLoss
from modsent.training import efficiency
from modsent.data.paraphrase import align_provided, translate_pairs, translation_units
from modsent.sources.builtin import builtin_corpus, builtin_paraphrases, builtin_translations
from modsent.testing import make_tiny_bert, make_tiny_xlmr, sample_texts
from modsent.modular.tokenizer_training import train_tokenizer
from modsent.training.pairs import batches_of_steps
from conftest import load_benchmark
from tiny_modules import (assert_resumed_equals_straight, assert_same_adamw_training, assert_trained_alike,
                          compiled_against_eager, inductor_draws_as_eager, logged_losses, needs_cpu_compiler)

LA_CFG = la.LanguageAdapterConfig(steps=4, batch_size=4, seq_len=32, learning_rate=2e-3,
                                  warmup_steps=1, eval_sentences=30, checkpoint_every=100, log_every=1,
                                  head_warmup_steps=0)
# A tiny random model learns only with a large learning rate; dropout off for exact comparisons.
CFG = sa.SentenceAdapterConfig(batch_size=16, seq_len=32, learning_rate=5e-3, max_steps=80,
                               lora_dropout=0.0, eval_pairs=30, log_every=5, seed=0)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny random XLM-R base, a German LA on it, and the built-in paraphrases in German."""
    torch.set_num_threads(1)  # tiny matrices: a second thread on shared cores only slows them
    root = tmp_path_factory.mktemp("se")
    base = make_tiny_xlmr(root / "base", sample_texts(600))
    corpus = root / "de.txt"
    corpus.write_text("\n".join(builtin_corpus("de")[:600]) + "\n", encoding="utf-8")
    train_tokenizer(corpus, base, root / "tok", vocab_size=500)
    train_token_fasttext(corpus, root / "tok", root / "ft", dim=16, epochs=2, min_count=2)
    initialize_embeddings(base, root / "tok", root / "ft", root / "emb")
    la.train_language_adapter(base, root / "tok", root / "emb", corpus, root / "la", LA_CFG, progress=False)
    english = builtin_paraphrases()
    units, _ = align_provided(translation_units(english), builtin_translations("de"), "de")
    pairs = translate_pairs(english, units)
    pairs_path = root / "de.parquet"
    pairs.to_parquet(pairs_path, index=False)
    return {"base": base, "la": root / "la", "pairs": pairs_path, "root": root}


def _lora_targets(model) -> set[str]:
    return {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}


def test_lora_covers_every_linear_layer_of_the_encoder_and_nothing_else(inputs):
    model = sa.build_model(inputs["base"], inputs["la"], CFG)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    targets = {t.split("base_model.model.", 1)[1] for t in _lora_targets(model)}
    from transformers import AutoModel

    plain = AutoModel.from_pretrained(str(inputs["base"]))  # every linear layer of the encoder
    linears = {n for n, m in plain.encoder.named_modules() if isinstance(m, torch.nn.Linear)}
    linears = {f"encoder.{n}" for n in linears}
    assert targets == linears
    kinds = {t.split(".", 3)[3] for t in targets}
    assert kinds == {"attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "intermediate.dense", "output.dense"}
    assert not any("embeddings" in t for t in targets)
    # the pooling head is frozen
    assert not any(p.requires_grad for p in model.head.parameters())


def test_la_is_merged_into_the_frozen_weights(inputs):
    """With a fresh SE LoRA (B = 0) the model computes exactly L's LA model."""
    model = sa.build_model(inputs["base"], inputs["la"], CFG).eval()
    la_model, tok = la.load_language_model(inputs["base"], inputs["la"], mlm=False)
    texts = builtin_corpus("de")[:6]
    features = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model.encoder(**features).last_hidden_state
        ref = la_model(**features).last_hidden_state
    assert torch.allclose(ours, ref, atol=1e-5)
    emb = load_file(str(inputs["la"] / la.EMBEDDINGS_NAME))["input_embeddings"]
    assert torch.equal(model.encoder.get_input_embeddings().weight, emb)


@pytest.mark.parametrize("make, pooling", [(make_tiny_bert, "cls"), (make_tiny_xlmr, "mean")])
def test_fresh_adapter_without_la_pools_as_the_base(tmp_path, make, pooling):
    """LaBSE-like (CLS + Dense(tanh) + Normalize) and E5-like (mean + Normalize) heads."""
    from sentence_transformers import SentenceTransformer

    base = make(tmp_path / "base", sample_texts(300), pooling=pooling)
    texts = sample_texts(40)[10:40]
    st = SentenceTransformer(str(base), device="cpu")
    reference = st.encode(texts, batch_size=7)
    head, max_len = sa._sentence_head(base)  # loaded module by module, without the transformer
    assert [type(m) for m in head] == [type(st[i]) for i in range(1, len(st))]
    assert max_len == st.max_seq_length
    model = sa.build_model(base, None, sa.SentenceAdapterConfig())
    assert np.allclose(model.encode(texts, batch_size=7), reference, atol=1e-5)
    loaded = sa.load_sentence_encoder(base, None, None, device="cpu")
    assert np.allclose(loaded.encode(texts, batch_size=4), reference, atol=1e-5)


@pytest.mark.parametrize("configured", [None, 24])
def test_head_max_seq_length_follows_sentence_transformers(tmp_path, configured):
    """Without a configured max_seq_length, sentence-transformers takes the tokenizer's
    model_max_length capped at max_position_embeddings; ours must agree."""
    import json

    from sentence_transformers import SentenceTransformer

    base = make_tiny_xlmr(tmp_path / "base", sample_texts(300), pooling="mean")
    config = base / "sentence_bert_config.json"
    settings = json.loads(config.read_text()) if config.is_file() else {}
    settings.pop("max_seq_length", None)
    if configured:
        settings["max_seq_length"] = configured
    config.write_text(json.dumps(settings))
    expected = SentenceTransformer(str(base), device="cpu").max_seq_length
    assert sa._sentence_head(base)[1] == expected == (configured or expected)


def test_batches_hold_no_text_twice_and_are_seeded(inputs):
    pairs = sa.read_pairs(inputs["pairs"])
    # the data has clashes to avoid: a negative that is another pair's positive
    assert set(pairs["negative"].dropna()) & set(pairs["positive"])
    for seed, epoch in ((0, 0), (0, 1), (3, 0)):
        batches = sa.no_duplicate_batches(pairs, 16, seed, epoch)
        placed = [i for b in batches for i in b]
        assert len(placed) == len(set(placed)) and len(placed) >= len(pairs) - 16
        for batch in batches:
            assert 2 <= len(batch) <= 16
            _assert_rows_disjoint(pairs, batch)
    assert sa.no_duplicate_batches(pairs, 16, 0, 0) == sa.no_duplicate_batches(pairs, 16, 0, 0)
    assert sa.no_duplicate_batches(pairs, 16, 0, 0) != sa.no_duplicate_batches(pairs, 16, 0, 1)
    clash = pd.DataFrame({"anchor": ["a", "b", "c", "a"], "positive": ["x", "a", "y", "z"],
                          "negative": [None, None, "x", None]})
    batches = sa.no_duplicate_batches(clash, 4, 0)
    # rows 0, 1 and 3 share "a", rows 0 and 2 share "x": no batch holds two of them; a row
    # left alone at the end is dropped (one pair has no in-batch negative)
    assert batches and all(len(b) >= 2 for b in batches)
    for batch in batches:
        _assert_rows_disjoint(clash, batch)


def _assert_rows_disjoint(pairs, batch):
    """No text of one row (anchor, positive, negative) occurs in another row of the batch."""
    seen = set()
    for i in batch:
        row = {t for t in pairs.loc[i, ["anchor", "positive", "negative"]] if isinstance(t, str)}
        assert not row & seen
        seen |= row


def _digest(directory) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_only_the_se_lora_moves_and_the_saved_adapter_reloads(inputs, tmp_path):
    model = sa.build_model(inputs["base"], inputs["la"], CFG)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pairs = sa.read_pairs(inputs["pairs"])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss_fn = MultipleNegativesRankingLoss(20.0)
    model.train()
    for batch in sa.no_duplicate_batches(pairs, 16, 0)[:3]:
        sa.batch_loss(model, loss_fn, pairs.iloc[batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert any(".lora_B." in n for n in changed)
    # save as training does, reload through the public loader: the same embeddings
    model.encoder.save_pretrained(str(tmp_path / "se" / sa.ADAPTER_DIR), save_embedding_layers=False)
    texts = pairs["anchor"].tolist()[:20]
    reloaded = sa.load_sentence_encoder(inputs["base"], inputs["la"], tmp_path / "se", device="cpu",
                                        max_seq_length=CFG.seq_len)
    assert np.allclose(reloaded.encode(texts, batch_size=8), model.encode(texts, batch_size=5), atol=1e-5)
    saved = load_file(str(tmp_path / "se" / sa.ADAPTER_DIR / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)


def test_a_batch_tokenised_ahead_on_a_thread_has_the_mnrl_of_its_texts(inputs):
    """Training tokenises each batch on a thread one step ahead (modsent.training.loop.ahead):
    the loss equals the step's own and MNRL's definition on the texts encoded one by one."""
    from modsent.training.loop import ahead

    model = sa.build_model(inputs["base"], inputs["la"], CFG)
    model.eval()
    pairs = sa.read_pairs(inputs["pairs"])
    loss_fn = MultipleNegativesRankingLoss(20.0)
    batches = sa.no_duplicate_batches(pairs, 8, 0)[:3]
    with torch.no_grad():
        prepared = [sa.batch_loss(model, loss_fn, pairs.iloc[b], features) for b, features in
                    ahead(batches, lambda b: model.features(sa.batch_texts(pairs.iloc[b])))]
        direct = [sa.batch_loss(model, loss_fn, pairs.iloc[b]) for b in batches]
        for batch, loss in zip(batches, prepared):
            rows = pairs.iloc[batch]
            anchors, positives = (torch.cat([model([t]) for t in rows[side]]) for side in ("anchor", "positive"))
            negatives = [model([t]) for t in rows["negative"] if isinstance(t, str)]
            candidates = torch.cat([positives] + negatives)  # hard negatives: more candidates
            scores = 20.0 * torch.nn.functional.normalize(anchors, dim=-1) @ torch.nn.functional.normalize(
                candidates, dim=-1).T
            reference = torch.nn.functional.cross_entropy(scores, torch.arange(len(rows)))
            assert torch.allclose(loss, reference, atol=1e-5)
    assert [x.item() for x in prepared] == [x.item() for x in direct]


def test_a_step_in_chunks_by_length_computes_the_one_pass_loss_and_gradients(inputs):
    """On the CPU a step's texts are encoded in sub-passes of similar length (step_features):
    the same embeddings, MNRL and LoRA gradients as one pass over the batch padded to its
    longest, with less padding. Dropout off (eval mode), where its draws would differ."""
    from modsent.training.loop import LengthChunks

    model = sa.build_model(inputs["base"], inputs["la"], CFG).eval()
    pairs = sa.read_pairs(inputs["pairs"])
    rows = pairs.iloc[sa.no_duplicate_batches(pairs, 20, 0)[0]]
    texts = sa.batch_texts(rows)
    one, chunks = model.features(texts), model.step_features(texts)
    assert isinstance(chunks, LengthChunks) and len(chunks) == -(-len(texts) // 16) >= 3
    assert sum(c["attention_mask"].numel() for c in chunks) < one["attention_mask"].numel()
    loss_fn = MultipleNegativesRankingLoss(20.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    results = []
    for features in (one, chunks):
        model.zero_grad()
        emb = model(features)
        loss = sa.pass_loss(loss_fn, emb, len(rows))
        loss.backward()
        results.append((emb.detach(), loss.detach(), [p.grad.clone() for p in trainable]))
    (emb_one, loss_one, grads_one), (emb_chunks, loss_chunks, grads_chunks) = results
    assert torch.allclose(emb_chunks, emb_one, atol=1e-5)
    assert torch.allclose(loss_chunks, loss_one, rtol=1e-5)
    assert any(g.abs().max() > 0 for g in grads_one)
    for g_chunks, g_one in zip(grads_chunks, grads_one):
        assert torch.allclose(g_chunks, g_one, atol=1e-6, rtol=1e-4)


def test_training_raises_heldout_retrieval_and_reloads(inputs, tmp_path):
    la_before = _digest(inputs["la"])
    out = tmp_path / "de"
    metrics = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], out, CFG, device="cpu",
                                         progress=False)
    assert metrics["steps"] == CFG.max_steps
    assert metrics["heldout_pairs"] >= 10
    assert metrics["heldout_retrieval_accuracy_after"] > metrics["heldout_retrieval_accuracy_before"]
    assert metrics["loss_last"] < metrics["loss_first"]
    # the padding of the training batches, counted again through transformers' tokenizer call
    train, _ = sa.split_heldout(sa.read_pairs(inputs["pairs"]), CFG.eval_pairs)
    tokenizer = sa.load_sentence_encoder(inputs["base"], inputs["la"], None, device="cpu").tokenizer
    masks = [tokenizer(sa.batch_texts(train.iloc[batch]), padding=True, truncation=True, max_length=CFG.seq_len,
                       return_tensors="pt")["attention_mask"]
             for batch in batches_of_steps(train, CFG.batch_size, CFG.seed, CFG.max_steps)]
    padded = sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    # on the CPU each step's pass runs in chunks of up to 16 sentences sorted by length, each
    # padded to its own longest (modsent.training.loop.split_by_length)
    chunk_positions = chunk_tokens = 0
    for m in masks:
        for lengths in np.array_split(np.sort(m.sum(dim=1).numpy()), -(-len(m) // 16)):
            chunk_positions += len(lengths) * int(lengths.max())
            chunk_tokens += int(lengths.sum())
    chunk_padded = 1 - chunk_tokens / chunk_positions
    assert 0 < metrics["padding_fraction"] == pytest.approx(chunk_padded)
    assert chunk_padded < padded
    # the model FLOPs: the real tokens of those masks, through the body the stage trains
    lengths = torch.cat([m.sum(dim=1) for m in masks])
    body = efficiency.body_shape(sa.build_model(inputs["base"], inputs["la"], CFG).encoder)
    assert metrics["model_flops"] == pytest.approx(
        efficiency.encoder_flops(body, int(lengths.sum()), int(lengths.square().sum())))
    assert metrics["model_tflops_per_second"] > 0
    assert metrics["mfu"] is None and metrics["gpu_peak_memory_gib"] is None  # the CPU: no peak
    assert _digest(inputs["la"]) == la_before  # the LA directory is untouched
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "metrics.json",
            "loss.tsv", "loss.png"} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert all("lora_" in k for k in saved) and not any("embed" in k for k in saved)
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == CFG.lora_r
    assert (out / "loss.tsv").read_text().splitlines()[0] == "step\tloss\tlr"
    # reloaded: the held-out accuracy measured in training, and deterministic encodings
    encoder = sa.load_sentence_encoder(inputs["base"], inputs["la"], out, device="cpu")
    _, heldout = sa.split_heldout(sa.read_pairs(inputs["pairs"]), CFG.eval_pairs)
    accuracy = sa.retrieval_accuracy(encoder.model, heldout["anchor"].tolist(), heldout["positive"].tolist())
    assert accuracy == pytest.approx(metrics["heldout_retrieval_accuracy_after"])
    emb = encoder.encode(heldout["anchor"].tolist(), batch_size=4)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    again = sa.load_sentence_encoder(inputs["base"], inputs["la"], out, device="cpu")
    assert np.allclose(again.encode(heldout["anchor"].tolist(), batch_size=16), emb, atol=1e-5)


def test_without_language_adapter(inputs, tmp_path):
    """The Mod_m-LA ablation: the SE adapter on the base with its own tokenizer."""
    cfg = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 3})
    out = tmp_path / "de-nola"
    metrics = sa.train_sentence_adapter(inputs["base"], None, inputs["pairs"], out, cfg, device="cpu",
                                         progress=False)
    assert metrics["steps"] == 3 and metrics["language_adapter"] is None
    encoder = sa.load_sentence_encoder(inputs["base"], None, out, device="cpu")
    from transformers import AutoTokenizer

    assert len(encoder.tokenizer) == len(AutoTokenizer.from_pretrained(str(inputs["base"])))
    assert encoder.encode(["Republik Namibia", "Namibia"]).shape == (2, 32)
    # a damaged copy is named, with the file, before peft reads it
    weights = out / sa.ADAPTER_DIR / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(InputError, match=rf"{weights}: unreadable safetensors file \(truncated"):
        sa.load_sentence_encoder(inputs["base"], None, out, device="cpu")
    config = out / sa.ADAPTER_DIR / "adapter_config.json"
    config.write_text(config.read_text()[:-20])
    with pytest.raises(InputError, match=rf"{config}: not valid JSON"):
        sa.load_sentence_encoder(inputs["base"], None, out, device="cpu")


def test_bad_pair_files(tmp_path):
    path = tmp_path / "x.parquet"
    pd.DataFrame({"anchor": ["a"], "other": ["b"]}).to_parquet(path)
    with pytest.raises(InputError, match="missing pair columns"):
        sa.read_pairs(path)
    pd.DataFrame({"anchor": ["a", " "], "positive": ["b", "c"], "negative": [None, None]}).to_parquet(path)
    with pytest.raises(InputError, match="at least 2"):
        sa.read_pairs(path)
    with pytest.raises(InputError, match="batch_size"):
        sa.SentenceAdapterConfig(batch_size=1)


def test_config_from_a_config_section():
    cfg = sa.SentenceAdapterConfig.from_config(
        {"batch_size": 32, "learning_rate": 1e-4, "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
         "max_steps": None})
    assert (cfg.batch_size, cfg.learning_rate) == (32, 1e-4)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout) == (4, 8, 0.0)
    assert cfg.seq_len == 128 and cfg.scale == 20.0 and cfg.target_modules == "all-linear"
    with pytest.raises(InputError, match="unknown"):
        sa.SentenceAdapterConfig.from_config({"batchsize": 32})


# dropout on (LoRA's and the encoder's own): a resumed run must draw the masks an unbroken one draws
RESUME_CFG = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 8, "checkpoint_every": 3,
                                          "lora_dropout": 0.1, "log_every": 1})


def _train_and_die(inputs, out, cfg, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], out, cfg, device="cpu",
                              progress=False, on_step=die)


def _kill_midway(inputs, out, cfg, die_at):
    process = multiprocessing.get_context("fork").Process(target=_train_and_die,
                                                          args=(inputs, out, cfg, die_at))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL


def test_grouped_batches_are_the_steps_the_stage_trains_on(inputs, tmp_path, monkeypatch):
    """sentence_adapter.length_groups: each step's rows are those of the grouped batches of the
    stage's training pairs (their datasets kept: the built-in ones), and the metrics say so."""
    seen = []
    loss_of = sa.batch_loss

    def recording(model, loss_fn, rows, *args):
        seen.append(rows["anchor"].tolist())
        return loss_of(model, loss_fn, rows, *args)

    monkeypatch.setattr(sa, "batch_loss", recording)
    torch.set_num_threads(1)
    cfg = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 4, "length_groups": 4})
    metrics = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "se", cfg,
                                        device="cpu", progress=False)
    train, _ = sa.split_heldout(sa.read_pairs(inputs["pairs"]), cfg.eval_pairs)
    assert train["dataset"].nunique() > 1
    grouped = [train.iloc[b]["anchor"].tolist() for b in batches_of_steps(train, 16, 0, 4, length_groups=4)]
    assert seen == grouped
    assert grouped != [train.iloc[b]["anchor"].tolist() for b in batches_of_steps(train, 16, 0, 4)]
    assert metrics["config"]["length_groups"] == 4 and metrics["steps"] == 4


def test_a_checkpoint_of_random_batches_is_the_one_made_before_pairs_kept_their_datasets(inputs, tmp_path,
                                                                                      monkeypatch):
    """The pairs now carry their ``dataset`` labels: at ``length_groups: 1`` the stage's
    checkpoint fingerprint is the one the frame without them gives (a run interrupted before the
    upgrade resumes); grouped, the labels are hashed too."""
    from modsent.training import checkpoints

    asked = []
    resume = checkpoints.resume

    def recording(directory, model, optimizer, fingerprint, *args, **kwargs):
        asked.append(fingerprint)
        return resume(directory, model, optimizer, fingerprint, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "resume", recording)
    torch.set_num_threads(1)
    pairs = sa.read_pairs(inputs["pairs"])
    assert "dataset" in pairs.columns
    for groups in (1, 4):
        cfg = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 1, "length_groups": groups})
        sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / str(groups), cfg,
                                  device="cpu", progress=False)
    earlier = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 1}).fingerprint(
        inputs["base"], inputs["la"], pairs.drop(columns="dataset"))
    grouped = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 1, "length_groups": 4}).fingerprint(
        inputs["base"], inputs["la"], pairs)
    assert asked == [earlier, grouped]


def test_killed_job_resumes_from_its_last_checkpoint(inputs, tmp_path):
    torch.set_num_threads(1)
    straight = tmp_path / "straight"
    cudnn_attention = []  # whether SDPA may take cuDNN's kernel, at each step (a plan per batch shape)
    expected = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], straight, RESUME_CFG,
                                         device="cpu", progress=False, on_step=lambda step: cudnn_attention.append(
                                             torch.backends.cuda.cudnn_sdp_enabled()))
    assert cudnn_attention == [False] * RESUME_CFG.max_steps and torch.backends.cuda.cudnn_sdp_enabled()
    assert not Path(f"{straight}.checkpoint").exists()  # removed once the output is complete
    resumed = tmp_path / "resumed"
    _kill_midway(inputs, resumed, RESUME_CFG, die_at=5)
    assert not resumed.exists()  # nothing Snakemake would accept
    checkpoint = Path(f"{resumed}.checkpoint")
    assert sorted(p.name for p in checkpoint.iterdir()) == ["meta.json", "state.safetensors"]
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["step"] == 3 and len(meta["history"]["losses"]) == 3
    metrics = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], resumed, RESUME_CFG,
                                        device="cpu", progress=False)
    assert metrics["resumed_from_step"] == 3 and expected["resumed_from_step"] == 0
    assert not checkpoint.exists()
    assert_resumed_equals_straight(straight, resumed, expected, metrics, "adapter_model.safetensors")


def test_training_with_batches_tokenised_ahead_equals_tokenising_in_the_step(inputs, tmp_path, monkeypatch):
    """The stage tokenises batch i+1 on a thread during step i and reads losses back only at
    logged steps and checkpoints: its adapter, metrics and loss curve are those of the plain
    loop (each batch tokenised in its own step), bit for bit."""
    from modsent.training import loop

    torch.set_num_threads(1)
    cfg = sa.SentenceAdapterConfig(**{**RESUME_CFG.__dict__, "log_every": 5})
    threaded = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "threaded", cfg,
                                         device="cpu", progress=False)
    monkeypatch.setattr(sa, "ahead", lambda items, prepare: loop.ahead(items, prepare, enabled=False))
    serial = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "serial", cfg,
                                       device="cpu", progress=False)
    assert_resumed_equals_straight(tmp_path / "serial", tmp_path / "threaded", serial, threaded,
                                   "adapter_model.safetensors")
    curve = (tmp_path / "threaded" / "loss.tsv").read_text()
    assert "nan" not in curve.lower() and len(curve.strip().splitlines()) > cfg.max_steps // cfg.log_every


def test_fp16_scales_the_loss_checkpoints_the_scale_and_resumes(inputs, tmp_path, monkeypatch):
    """precision fp16, forced on the CPU as a GPU without bf16 runs it: the stage trains through
    the loss scaler, keeps its scale in the checkpoint, resumes to the unbroken run's adapter,
    and its losses stay within fp16's rounding of fp32's."""
    from modsent.training import precision

    resolve, make_scaler = precision.resolve, sa.grad_scaler
    monkeypatch.setattr(precision, "resolve", lambda device, name="auto": "fp16" if name == "fp16" else resolve(device, name))

    def overflowing_scaler(device, name):  # a scale that overflows fp16's gradients in the first steps
        scaler = make_scaler(device, name)
        if scaler.is_enabled():
            scaler.update(new_scale=2.0 ** 28)
        return scaler

    monkeypatch.setattr(sa, "grad_scaler", overflowing_scaler)
    torch.set_num_threads(1)
    cfg = sa.SentenceAdapterConfig(**{**RESUME_CFG.__dict__, "precision": "fp16"})
    train = dict(device="cpu", progress=False)
    expected = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "straight", cfg, **train)
    _kill_midway(inputs, tmp_path / "resumed", cfg, die_at=5)
    meta = json.loads((tmp_path / "resumed.checkpoint" / "meta.json").read_text())
    # the first steps overflowed at 2^28, so the scale a resumed run starts from matters
    assert meta["step"] == 3 and meta["scaler"]["scale"] < 2.0 ** 28, meta["scaler"]
    metrics = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "resumed", cfg, **train)
    assert metrics["resumed_from_step"] == 3
    assert_resumed_equals_straight(tmp_path / "straight", tmp_path / "resumed", expected, metrics,
                                   "adapter_model.safetensors")
    full = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], tmp_path / "fp32", RESUME_CFG, **train)
    assert expected["loss_first"] != full["loss_first"]  # fp16 really ran
    assert abs(expected["loss_first"] - full["loss_first"]) < 0.02 * full["loss_first"]
    assert abs(expected["loss_last"] - full["loss_last"]) < 0.05 * full["loss_last"]


def test_checkpoint_of_other_settings_or_inputs_is_not_resumed(inputs, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "de"
    _kill_midway(inputs, out, RESUME_CFG, die_at=4)
    other = sa.SentenceAdapterConfig(**{**RESUME_CFG.__dict__, "learning_rate": 1e-3})
    metrics = sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"], out, other,
                                        device="cpu", progress=False)
    assert metrics["resumed_from_step"] == 0
    # what the fingerprint covers: settings but not their cadence, and the inputs' content
    pairs = sa.read_pairs(inputs["pairs"])
    fingerprint = RESUME_CFG.fingerprint(inputs["base"], inputs["la"], pairs)
    cadence = sa.SentenceAdapterConfig(**{**RESUME_CFG.__dict__, "checkpoint_every": 7, "log_every": 2})
    assert cadence.fingerprint(inputs["base"], inputs["la"], pairs) == fingerprint
    changed = pairs.copy()
    changed.loc[0, "positive"] += "!"
    assert RESUME_CFG.fingerprint(inputs["base"], inputs["la"], changed) != fingerprint
    assert RESUME_CFG.fingerprint(inputs["base"], None, pairs) != fingerprint
    la_copy = tmp_path / "la"
    shutil.copytree(inputs["la"], la_copy)
    assert RESUME_CFG.fingerprint(inputs["base"], la_copy, pairs) == fingerprint  # content, not path
    data = (la_copy / la.EMBEDDINGS_NAME).read_bytes()
    (la_copy / la.EMBEDDINGS_NAME).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert RESUME_CFG.fingerprint(inputs["base"], la_copy, pairs) != fingerprint


@needs_cpu_compiler
@inductor_draws_as_eager()
def test_a_compiled_encoder_trains_as_the_eager_one_over_batches_of_every_width(inputs, tmp_path):
    """sentence_adapter.compile: batches of varying width, padded and unpadded, through the
    compiled encoder (torch.compile's dynamic sizes after the first), in training and in the
    held-out evaluation: the losses, accuracies and adapter of the eager run (fp32, the CPU; the
    base's dropout drawn by Inductor as eager draws it), and the same checkpoint fingerprint (a
    runtime setting)."""
    cfg = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 4, "log_every": 1})
    compiled_cfg = sa.SentenceAdapterConfig(**{**cfg.__dict__, "compile": True})
    assert compiled_cfg.fingerprint(inputs["pairs"]) == cfg.fingerprint(inputs["pairs"])
    eager, compiled = compiled_against_eager(
        lambda on: sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"],
                                             tmp_path / ("compiled" if on else "eager"), compiled_cfg if on else cfg,
                                             device="cpu", progress=False))
    assert compiled["config"]["compile"]
    losses = [logged_losses(tmp_path / name) for name in ("eager", "compiled")]
    assert len(losses[0]) == 4 and losses[0] == pytest.approx(losses[1], rel=1e-4)
    for key in ("heldout_retrieval_accuracy_before", "heldout_retrieval_accuracy_after", "padding_fraction"):
        assert compiled[key] == pytest.approx(eager[key]), key
    x, y = (load_file(str(tmp_path / run / sa.ADAPTER_DIR / "adapter_model.safetensors")) for run in ("eager", "compiled"))
    assert_same_adamw_training(x, y, cfg.learning_rate)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU and modsent's whole environment "
                    "(gpu.sh's images lack the fixtures' packages): pytest tests -k on_a_gpu on a GPU node")
@inductor_draws_as_eager()
def test_the_stage_compiled_on_a_gpu_trains_as_the_eager_one(inputs, tmp_path):
    """sentence_adapter.compile end to end on a GPU: bf16 autocast, Triton's kernels, the stage's
    attention without cuDNN, batches of varying width: the eager run's losses within bf16's
    rounding and the same training of the adapter."""
    cfg = sa.SentenceAdapterConfig(**{**CFG.__dict__, "max_steps": 6, "log_every": 1})
    eager, compiled = compiled_against_eager(
        lambda on: sa.train_sentence_adapter(inputs["base"], inputs["la"], inputs["pairs"],
                                             tmp_path / ("compiled" if on else "eager"),
                                             sa.SentenceAdapterConfig(**{**cfg.__dict__, "compile": on}),
                                             device="cuda", progress=False))
    assert compiled["config"]["compile"] and not eager["config"]["compile"]
    assert compiled["padding_fraction"] == pytest.approx(eager["padding_fraction"])
    assert compiled["model_flops"] == pytest.approx(eager["model_flops"])  # the same tokens
    peak, _ = efficiency.peak_tflops("cuda")
    for run in (eager, compiled):
        assert run["gpu_peak_memory_gib"] > 0
        assert run["mfu"] is None if peak is None else 0 < run["mfu"] < 1
    assert_trained_alike(tmp_path, f"{sa.ADAPTER_DIR}/adapter_model.safetensors", ("lora_B",), rel=3e-2, cosine=0.95)


def test_throughput_benchmark_warms_every_shape_and_masks_as_the_stage_does():
    """benchmarks/pair_throughput.py (the SE/CLA goal's figures) times no step of a batch shape it
    has not run before (a new shape is slow once on a GPU; twice under CUDA graphs), measures
    what the first step of a shape costs, and gives the encoder the stage's mask."""
    bench = load_benchmark("pair_throughput")
    shapes = [(9, 48), (9, 56), (9, 48), (9, 40), (9, 56), (7, 48), (9, 40), (9, 48)]
    schedule, untimed = bench.warm_schedule(shapes, 2)
    assert schedule == [0, 1, 3, 5, 2, 3, 4, 5, 6, 7] and untimed == 4
    assert bench.first_of_shape(shapes, schedule) == [1, 2, 3]  # the very first is not a sample
    schedule, untimed = bench.warm_schedule(shapes, 2, repeats=2)
    assert schedule == [0, 1, 3, 3, 5, 5, 2, 3, 4, 5, 6, 7] and untimed == 6
    generator = torch.Generator().manual_seed(0)
    for warmup in (0, 1, 3):
        shapes = [tuple(row) for row in torch.randint(1, 4, (30, 2), generator=generator).tolist()]
        schedule, untimed = bench.warm_schedule(shapes, warmup)
        assert schedule[untimed:] == list(range(warmup, 30))  # every batch timed once, in order
        assert {shapes[k] for k in schedule[untimed:]} <= {shapes[k] for k in schedule[:untimed]}
        assert untimed == warmup + len(set(shapes[warmup:]) - set(shapes[:warmup]))
        firsts = bench.first_of_shape(shapes, schedule)
        assert all(i < untimed for i in firsts) and len(firsts) == len(set(shapes)) - 1

    torch.manual_seed(0)
    model, config = bench.build("small", "cpu")
    model.eval()
    ids, mask, attention = bench.padded([5, 9, 3], config, "cpu", generator, 1)
    assert ids.shape == mask.shape == (3, 9) and mask.sum(1).tolist() == [5, 9, 3]
    assert attention.dtype == torch.bool and attention.shape == (3, 1, 1, 9)  # sentence_adapter's form
    with torch.no_grad():
        ours = bench.mean_pool(model(input_ids=ids, attention_mask=attention).last_hidden_state, mask)
        reference = bench.mean_pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    assert torch.allclose(ours, reference, atol=1e-6)
    with torch.no_grad(), bench.attention_kernels(cudnn=False):  # the stages' attention: no cuDNN kernel
        other = bench.mean_pool(model(input_ids=ids, attention_mask=attention).last_hidden_state, mask)
    assert torch.allclose(other, reference, atol=1e-6)
    ids, mask, attention = bench.padded([4, 4], config, "cpu", generator, 8)
    assert ids.shape == (2, 8) and attention is not None  # rounded up: padding
    assert bench.padded([6, 6], config, "cpu", generator, 1)[2] is None  # no padding: no mask


def test_throughput_benchmark_trains_what_each_stage_trains_on_its_batches(monkeypatch, capsys):
    """benchmarks/pair_throughput.py: SE trains the LoRA; CLA trains parallel adapters on the
    same encoder with its LoRA frozen (alignment.build_alignment_model); a step encodes what the
    stage's batch holds (anchors, positives, then the hard negatives; CLA: L's side only); the
    whole benchmark runs and prints every variant of both stages."""
    from modsent.modular import parallel_adapter as pa

    bench = load_benchmark("pair_throughput")
    se, _ = bench.build("small", "cpu", "SE")
    cla, _ = bench.build("small", "cpu", "CLA")
    se_trained = {n for n, p in se.named_parameters() if p.requires_grad}
    cla_trained = {n for n, p in cla.named_parameters() if p.requires_grad}
    assert se_trained and all("lora_" in n for n in se_trained)
    adapters = pa.parallel_adapters(cla)
    assert len(adapters) == 4 and cla_trained == {n for n, _ in cla.named_parameters() if "parallel_adapter" in n}
    assert any("lora_" in n for n, _ in cla.named_parameters())  # there, frozen

    batches = bench.make_batches(list(range(5, 45)), 4000, 100, 1, seed=3, negative_share=0.37)
    assert len(batches) == 40 and all(len(batch) == 100 for batch in batches)
    assert all(sum(len(row) == 3 for row in batch) == 37 for batch in batches)  # the share, in each batch
    assert len({tuple(i for i, row in enumerate(batch) if len(row) == 3) for batch in batches}) == 40  # at random
    batch = [(7, 9), (11, 13, 15), (17, 19)]
    assert bench.sentences(batch, "SE") == [7, 11, 17, 9, 13, 19, 15]
    assert bench.sentences(batch, "CLA") == [9, 13, 19, 15]
    assert bench.shape(batch, "SE", 8) == (7, 24) and bench.shape(batch, "CLA", 1) == (4, 19)
    assert all(len(row) == 2 for batch in bench.make_batches(list(range(5, 45)), 400, 100, 4, seed=3)
               for row in batch)  # no share: pairs only

    # the chunk plan stays as it is on its way to the device; the optimizer's state goes there and back
    from modsent.training.loop import LengthChunks, split_by_length

    parts = split_by_length({"input_ids": torch.ones(20, 6, dtype=torch.long),
                             "attention_mask": torch.ones(20, 6, dtype=torch.long)}, 8)
    moved = bench.to_device((parts, [(torch.ones(2), None)]), "cpu")
    assert moved[0] is parts and isinstance(moved[1], list) and moved[1][0][1] is None
    assert isinstance(parts, LengthChunks)
    for fused in (False, True):
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.AdamW([weight], fused=fused or None)
        weight.grad = torch.ones(3)
        optimizer.step()
        bench.move_state(optimizer, "meta")
        state = optimizer.state[weight]
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        # fused AdamW counts its steps on the parameters' device, foreach AdamW on the host
        assert state["step"].is_meta == fused

    monkeypatch.setattr("sys.argv", ["pair_throughput.py", "--batch-size", "12", "--seq-len", "64", "--steps", "2",
                                     "--warmup", "1", "--rounds", "2"])
    bench.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("SE ", "CLA "))]
    names = ("fp32, random", "fp32, random, fast", "fp32, grouped", "fp32, fast, chunks 16")
    assert [(row[0], " ".join(row[2:-5])) for row in rows] == [(stage, name) for stage in ("SE", "CLA") for name in names]
    assert all(float(row[-5]) > 0 for row in rows)
    assert all(float(row[-1].rstrip("%")) >= 0 for row in rows)  # two rounds: their spread
    padding = {(row[0], " ".join(row[2:-5])): float(row[-4].rstrip("%")) for row in rows}
    # the same batches as 'random', SE's ~28 sentences in two passes by length: less padding
    assert padding["SE", "fp32, fast, chunks 16"] < padding["SE", "fp32, random"]
    assert any(row[-2].endswith("ms") for row in rows)  # widths vary: a new shape's cost is measured


def test_throughput_benchmark_groups_two_datasets_as_length_groups_does(monkeypatch, capsys):
    """benchmarks/pair_throughput.py --two-datasets: pairs of datasets of very different
    lengths (the tests' fixture), each hard negative from its pair's dataset; grouped by length alone, most batches hold one dataset;
    grouped as the stages' length_groups groups them (modsent.training.pairs.length_grouped_order
    with each pair's dataset), every batch holds each dataset about in its share, with padding
    between the two; without labels, the grouped batches are the pools sorted by length."""
    from collections import Counter

    from modsent.testing import two_length_datasets

    bench = load_benchmark("pair_throughput")
    labelled = bench.dataset_rows(128)
    frame = two_length_datasets()
    assert len(labelled) == len(frame) and Counter(row[2] for row in labelled) == Counter(frame["dataset"])
    assert labelled[-1] == (round(1.3 * len(frame["anchor"].iat[-1].split())) + 2,
                            round(1.3 * len(frame["positive"].iat[-1].split())) + 2, "docstrings")
    # two datasets of disjoint lengths: which a sentence comes from shows in its length
    pairs = [(3 + i % 6, 3 + (i * 7) % 6, "short") for i in range(40)] + \
        [(20 + i % 41, 20 + (i * 3) % 41, "long") for i in range(80)]
    share = 80 / 120

    def padding(batches):
        cells = [bench.sentences(batch, "SE") for batch in batches]
        return 1 - sum(map(sum, cells)) / sum(len(c) * max(c) for c in cells)

    def long_shares(batches):
        return [sum(row[0] >= 20 for row in batch) / len(batch) for batch in batches]

    kinds = {}
    for name, group, strata in (("random", 1, False), ("grouped", 8, False), ("strata", 8, True)):
        batches = bench.make_batches(pairs, 3200, 25, group, seed=5, negative_share=0.4, strata=strata)
        assert len(batches) == 128 and all(len(batch) == 25 for batch in batches)
        assert all(sum(len(row) == 3 for row in batch) == 10 for batch in batches)
        assert all((row[0] >= 20) == (row[1] >= 20) for batch in batches for row in batch)  # one pair's
        # a hard negative is a sentence of the pair's own dataset
        assert all((row[2] >= 20) == (row[0] >= 20) for batch in batches for row in batch if len(row) == 3)
        kinds[name] = batches
    # the pairs drawn are the same in every variant, only their batches differ
    assert Counter(r[:2] for b in kinds["random"] for r in b) == Counter(r[:2] for b in kinds["strata"] for r in b)
    assert padding(kinds["grouped"]) < padding(kinds["strata"]) < padding(kinds["random"])
    by_length, by_strata = long_shares(kinds["grouped"]), long_shares(kinds["strata"])
    assert sum(s in (0.0, 1.0) for s in by_length) > len(by_length) / 2  # most batches one dataset
    assert max(abs(s - share) for s in by_strata) < 0.2  # each batch about the file's share

    # unlabelled lengths: the pools sorted by length, as before (the batches shuffled)
    drawn = [row for batch in bench.make_batches(list(range(5, 45)), 400, 20, 1, seed=3) for row in batch]
    pools = [sorted(drawn[k:k + 80], key=lambda row: max(row[:2])) for k in range(0, 400, 80)]
    reference = sorted(tuple(pool[i:i + 20]) for pool in pools for i in range(0, 80, 20))
    assert sorted(tuple(b) for b in bench.make_batches(list(range(5, 45)), 400, 20, 4, seed=3)) == reference
    with pytest.raises(ValueError, match="labelled"):
        bench.make_batches(list(range(5, 45)), 400, 20, 4, seed=3, strata=True)

    made, make_batches = [], bench.make_batches

    def recorded(lengths, *args, **kwargs):  # each variant's batches, as main asks for them
        made.append((isinstance(lengths[0], tuple), args[2], kwargs.get("strata", False)))
        return make_batches(lengths, *args, **kwargs)

    monkeypatch.setattr(bench, "make_batches", recorded)
    monkeypatch.setattr("sys.argv", ["pair_throughput.py", "--batch-size", "12", "--seq-len", "64", "--steps", "2",
                                     "--warmup", "1", "--stages", "SE", "--two-datasets", "--group", "4",
                                     "--only", "fp32, grouped", "fp32, strata"])
    bench.main()
    # the fixture's labelled pairs in every variant; random, by length alone, within each dataset
    assert made == [(True, 1, False), (True, 4, False), (True, 4, True)]
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("SE ")]
    assert [" ".join(row[2:-4]) for row in rows] == ["fp32, random", "fp32, grouped", "fp32, strata"]
    assert all(float(row[-4]) > 0 for row in rows)


def test_encoding_benchmark_runs_the_evaluations_loop_and_prints_every_variant(monkeypatch, capsys):
    """benchmarks/encode_throughput.py (the evaluation batch size's figures) runs, through the
    stage's padding and mask, and prints a positive rate for each variant."""
    bench = load_benchmark("encode_throughput")
    monkeypatch.setattr("sys.argv", ["encode_throughput.py", "--sentences", "40", "--repeat", "1",
                                     "--batch-size", "16"])
    bench.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("   16")]
    assert [" ".join(row[1:-5]) for row in rows] == ["fp32, given order", "fp32, by length", "bf16, by length",
                                                     "bf16, by length, merged"]
    assert all(float(row[-5]) > 0 for row in rows)
    assert float(rows[1][-4].rstrip("%")) < float(rows[0][-4].rstrip("%"))  # sorted: less padding
