import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modsent.modular import language_adapter as la
from modsent.modular.fasttext_embeddings import train_token_fasttext
from modsent.modular.focus import initialize_embeddings
from modsent.io import InputError
from modsent.training import efficiency
from modsent.sources.builtin import builtin_corpus
from modsent.testing import make_tiny_xlmr, sample_texts
from modsent.modular.tokenizer_training import train_tokenizer
from tiny_modules import (assert_same_adamw_training, inductor_draws_as_eager, logged_losses, needs_cpu_compiler,
                          needs_triton_interpreter)

CFG = la.LanguageAdapterConfig(steps=6, batch_size=4, seq_len=32, learning_rate=2e-3,
                               warmup_steps=1, eval_sentences=60, checkpoint_every=3, log_every=1,
                               head_warmup_steps=2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny random XLM-R base model, a German corpus, tokenizer, fastText and FOCUS."""
    root = tmp_path_factory.mktemp("la")
    base = make_tiny_xlmr(root / "base", sample_texts(600))
    corpus = root / "de.txt"
    corpus.write_text("\n".join(builtin_corpus("de")[:1500]) + "\n", encoding="utf-8")
    train_tokenizer(corpus, base, root / "tok", vocab_size=500)
    train_token_fasttext(corpus, root / "tok", root / "ft", dim=16, epochs=2, min_count=2)
    initialize_embeddings(base, root / "tok", root / "ft", root / "emb")
    return {"base": base, "corpus": corpus, "tok": root / "tok", "emb": root / "emb", "root": root}


def tokenizer(inputs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(inputs["tok"]))


def test_pack_sequences_wastes_nothing_on_padding(inputs):
    tok = tokenizer(inputs)
    lines = la.read_corpus(inputs["corpus"])[:200]
    packed = la.pack_sequences(lines, tok, 32)
    assert packed.shape[1] == 32
    assert (packed[:, 0] == tok.cls_token_id).all() and (packed[:, -1] == tok.sep_token_id).all()
    assert not (packed == tok.pad_token_id).any()
    body = packed[:, 1:-1].flatten().tolist()
    stream = []
    for ids in tok(lines, add_special_tokens=False)["input_ids"]:
        stream += ids + [tok.sep_token_id]
    assert body == stream[: len(body)]  # the token stream, in order
    assert len(stream) - len(body) < 30  # only the last partial sequence is dropped
    # tokenised in chunks (here of 7 lines, so that chunks end mid-sequence): the same sequences
    chunked = la.pack_sequences(lines, tok, 32, chunk_lines=7)
    assert chunked.dtype == torch.long and torch.equal(chunked, packed)
    # the Rust tokenizer (used directly when there is one) and the Python wrapper give the same ids

    class WrapperOnly:
        sep_token_id, cls_token_id, pad_token_id = tok.sep_token_id, tok.cls_token_id, tok.pad_token_id

        def __call__(self, *args, **kwargs):
            return tok(*args, **kwargs)

    assert torch.equal(la.pack_sequences(lines, WrapperOnly(), 32, chunk_lines=50), packed)
    # empty lines carry no separator; a corpus shorter than one sequence is padded to one
    assert torch.equal(la.pack_sequences(["", *lines[:1], ""], tok, 32, chunk_lines=1),
                       la.pack_sequences(lines[:1], tok, 32))
    short = la.pack_sequences(lines[:1], tok, 256)
    assert short.shape == (1, 256) and (short == tok.pad_token_id).any()
    with pytest.raises(InputError, match="no tokens"):
        la.pack_sequences(["", ""], tok, 32)


def test_packing_in_parts_equals_concatenating_and_cutting():
    """Each tokenised part is moved into its rows of the sequences: for random corpora, sequence
    lengths and chunk sizes (parts ending anywhere in a row, shorter than one, a corpus shorter
    than one sequence) the sequences of one token stream cut in rows of seq_len - 2."""
    import random

    class Words:
        sep_token_id, cls_token_id, pad_token_id = 2, 1, 0

        def __call__(self, lines, add_special_tokens=False):
            return {"input_ids": [[3 + int(word[1:]) for word in line.split()] for line in lines]}

    rng = random.Random(0)
    for _ in range(300):
        lines = [" ".join(f"w{rng.randrange(9)}" for _ in range(rng.randrange(0, 12))) for _ in range(rng.randrange(1, 60))]
        seq_len, chunk = rng.randrange(3, 20), rng.randrange(1, 9)
        stream = [i for ids in Words()(lines)["input_ids"] if ids for i in ids + [2]]
        if not stream:
            continue
        body = seq_len - 2
        stream += [0] * (body - len(stream))  # shorter than one sequence: padded to one
        reference = torch.tensor([[1, *stream[i * body:(i + 1) * body], 2] for i in range(len(stream) // body)])
        assert torch.equal(la.pack_sequences(lines, Words(), seq_len, chunk_lines=chunk), reference)
        narrow = la.pack_sequences(iter(lines), Words(), seq_len, chunk_lines=chunk, dtype=torch.int32)
        assert narrow.dtype == torch.int32 and torch.equal(narrow.long(), reference)


def test_the_corpus_read_twice_is_split_and_packed_as_when_held(inputs, tmp_path):
    """The LA reads its corpus twice instead of holding it (the held-out lines by a heap of
    hashes, then the rest tokenised in chunks) and keeps int32 sequences: the lines, sequences
    and masked batches of the corpus read into a list, split by sorting every hash, in int64."""
    tok = tokenizer(inputs)
    lines = la.read_corpus(inputs["corpus"])
    corpus = tmp_path / "corpus.txt"  # blank and padded lines are no lines; a repeated line two
    corpus.write_text("\n".join(["", *lines[:40], "  " + lines[3] + " ", "", *lines[40:], lines[7], ""]), "utf-8")
    held_in_memory = la.read_corpus(corpus)
    assert len(held_in_memory) == len(lines) + 2
    for count in (0, 5, 50, 10 ** 6):  # 10**6: capped at a tenth of the lines
        ranked = sorted(range(len(held_in_memory)), key=lambda i: hashlib.sha1(held_in_memory[i].encode()).digest())
        held = set(ranked[:min(count, len(held_in_memory) // 10)])
        train, heldout = la.split_heldout(held_in_memory, count)
        assert heldout == [line for i, line in enumerate(held_in_memory) if i in held]
        train_lines, n_train, heldout_read = la.read_split_corpus(corpus, count)
        assert heldout_read == heldout and list(train_lines()) == train == list(train_lines())
        assert n_train == len(train) == len(held_in_memory) - len(held)
    packed = la.pack_sequences(train, tok, 32, chunk_lines=9)
    narrow = la.pack_sequences(iter(train_lines()), tok, 32, chunk_lines=9, total=n_train, dtype=torch.int32)
    assert narrow.dtype == torch.int32 and torch.equal(narrow.long(), packed)
    for a, b in zip(la.mask_tokens(narrow[:8], tok, 0.15, torch.Generator().manual_seed(3)),
                    la.mask_tokens(packed[:8], tok, 0.15, torch.Generator().manual_seed(3))):
        assert a.dtype == b.dtype == torch.long and torch.equal(a, b)
    with pytest.raises(InputError, match="empty"):
        (tmp_path / "blank.txt").write_text(" \n\n", "utf-8")
        la.read_split_corpus(tmp_path / "blank.txt", 5)


def test_the_corpus_is_tokenised_once_into_files_every_process_maps(inputs, tmp_path, monkeypatch, caplog):
    """prepared_sequences: the sequences of the corpus read twice (previous test), written once
    to a folder and mapped from it; made anew for another corpus, tokenizer, seq_len or
    eval_sentences, or for files that do not match their manifest; a failure leaves no folder.
    (Several processes: tests/test_distributed.py.)"""
    import shutil

    tok, tokenizer_dir = tokenizer(inputs), inputs["tok"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(inputs["corpus"].read_text(encoding="utf-8"), encoding="utf-8")
    folder = tmp_path / "de.sequences"
    pack = la.pack_sequences  # the reference, uncounted

    def expected(cfg):
        train, heldout = la.split_heldout(la.read_corpus(corpus), cfg.eval_sentences)
        return (pack(train, tok, cfg.seq_len), pack(heldout, tok, cfg.seq_len),
                {"train_lines": len(train), "heldout_lines": len(heldout)})

    def check(result, cfg):
        train, heldout, counts = result
        want_train, want_heldout, want_counts = expected(cfg)
        assert train.dtype == heldout.dtype == torch.int32 and counts == want_counts
        assert torch.equal(train.long(), want_train) and torch.equal(heldout.long(), want_heldout)
        return train

    calls = []
    monkeypatch.setattr(la, "pack_sequences", lambda *a, **k: calls.append(1) or pack(*a, **k))

    def prepared(cfg=CFG, tokenizer_dir=tokenizer_dir, made=2):
        before = len(calls)
        result = check(la.prepared_sequences(corpus, tok, tokenizer_dir, cfg, folder), cfg)
        assert len(calls) - before == made, "tokenised" if made == 0 else "not tokenised"
        return result

    prepared()
    assert {p.name for p in folder.iterdir()} == {"train.npy", "heldout.npy", la.SEQUENCES_MANIFEST}
    with caplog.at_level("INFO", logger=la.log.name):
        train = prepared(made=0)  # read back, not made
    assert "tokenised by an earlier run" in caplog.text
    with open("/proc/self/maps", encoding="utf-8") as maps:  # mapped from the file, not read into memory
        assert str(folder / "train.npy") in maps.read()
    del train
    assert la.sequences_key(tokenizer_dir, corpus, CFG) == la.sequences_key(
        tokenizer_dir, corpus, dataclasses.replace(CFG, steps=99, learning_rate=1.0))  # training settings: same data
    prepared(dataclasses.replace(CFG, seq_len=24))
    prepared(dataclasses.replace(CFG, eval_sentences=7))
    other = tmp_path / "tok"  # another file of the tokenizer (its special tokens live beside the vocabulary)
    shutil.copytree(tokenizer_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text(encoding="utf-8"))
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}), encoding="utf-8")
    prepared(tokenizer_dir=other)
    prepared(made=2)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("Noch ein Satz, der vorher nicht da war.\n")
    prepared()
    for damage in ("truncate", "remove", "manifest"):  # what a crash or a full disk can leave
        if damage == "truncate":
            data = (folder / "train.npy").read_bytes()
            (folder / "train.npy").write_bytes(data[:len(data) // 2])
        elif damage == "remove":
            (folder / "heldout.npy").unlink()
        else:
            (folder / la.SEQUENCES_MANIFEST).write_text("[1]", encoding="utf-8")
        prepared()
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(InputError, match="empty"):
        la.prepared_sequences(blank, tok, tokenizer_dir, CFG, tmp_path / "blank.sequences")
    assert not (tmp_path / "blank.sequences").exists()


def test_masking_follows_bert(inputs):
    tok = tokenizer(inputs)
    packed = la.pack_sequences(la.read_corpus(inputs["corpus"]), tok, 32)
    inputs_, labels = la.mask_tokens(packed, tok, 0.15, torch.Generator().manual_seed(0))
    chosen = labels != -100
    special = torch.isin(packed, torch.tensor(tok.all_special_ids))
    assert not (chosen & special).any()
    rate = chosen.sum() / (~special).sum()
    assert 0.13 < rate < 0.17
    assert (labels[chosen] == packed[chosen]).all()
    masked = (inputs_ == tok.mask_token_id) & chosen
    assert 0.75 < masked.sum() / chosen.sum() < 0.85
    assert (inputs_[~chosen] == packed[~chosen]).all()
    again = la.mask_tokens(packed, tok, 0.15, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], inputs_) and torch.equal(again[1], labels)


def test_masked_only_loss_equals_the_full_head_loss(inputs):
    tok = tokenizer(inputs)
    model = la.build_model(inputs["base"], tok, inputs["emb"] / la.EMBEDDINGS_NAME, CFG).eval()
    packed = la.pack_sequences(la.read_corpus(inputs["corpus"])[:100], tok, 32)[:4]
    masked, labels = la.mask_tokens(packed, tok, 0.15, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = la.mlm_loss(model, masked, labels)
        reference = model(input_ids=masked, labels=labels).loss  # transformers' own MLM loss
    assert torch.allclose(ours, reference, atol=1e-5)


def test_only_embeddings_head_and_lora_train(inputs):
    tok = tokenizer(inputs)
    model = la.build_model(inputs["base"], tok, inputs["emb"] / la.EMBEDDINGS_NAME, CFG)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable)
    assert all(("lora_" in n) or ("word_embeddings" in n) or ("lm_head" in n) for n in trainable)
    lora_targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable if "lora_" in n}
    assert lora_targets == {"query", "key", "value"}
    focus = load_file(str(inputs["emb"] / la.EMBEDDINGS_NAME))["input_embeddings"]
    assert torch.equal(model.get_input_embeddings().weight.detach(), focus)


def test_training_lowers_heldout_loss_and_reloads(inputs, tmp_path):
    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "steps": 30})
    out = tmp_path / "de"
    metrics = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                        out, cfg, progress=False)
    assert metrics["heldout_mlm_loss_after"] < metrics["heldout_mlm_loss_before"]
    assert not Path(str(out) + ".checkpoint").exists()  # removed once the output is complete
    files = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"embeddings.safetensors", "adapter_model.safetensors", "adapter_config.json",
            "tokenizer.json", "metrics.json", "loss.tsv", "loss.png"} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    model, tok = la.load_language_model(inputs["base"], out)
    # the base model's own weights did not move; LoRA did
    from transformers import AutoModel

    base = AutoModel.from_pretrained(str(inputs["base"]))
    layer = model.get_base_model().roberta.encoder.layer[0].attention.self.query
    assert torch.equal(layer.base_layer.weight, base.encoder.layer[0].attention.self.query.weight)
    assert layer.lora_B["default"].weight.abs().sum() > 0
    assert len(tok) == len(tokenizer(inputs))
    heldout = la.split_heldout(la.read_corpus(inputs["corpus"]), cfg.eval_sentences)[1]
    loss = la.heldout_mlm_loss(model, la.pack_sequences(heldout, tok, cfg.seq_len), tok,
                               batch_size=min(cfg.batch_size, 64))
    assert loss == pytest.approx(metrics["heldout_mlm_loss_after"], abs=1e-4)
    curve = (out / "loss.tsv").read_text().splitlines()
    assert curve[0] == "step\tloss\tlr" and len(curve) == 31
    assert metrics["padding_fraction"] == 0.0  # packed sequences
    # the model FLOPs: every step's batch and masked positions drawn again as the loop draws them
    train = la.pack_sequences(la.split_heldout(la.read_corpus(inputs["corpus"]), cfg.eval_sentences)[0], tok,
                              cfg.seq_len)
    tokens = masked = 0
    for step in range(cfg.steps):
        batch = train[la.batch_indices(step, len(train), cfg.batch_size, cfg.seed)]
        _, labels = la.mask_tokens(batch, tok, cfg.mlm_probability, la.step_generator(step, cfg.seed))
        tokens, masked = tokens + batch.numel(), masked + int((labels != -100).sum())
    assert tokens == cfg.steps * cfg.batch_size * cfg.seq_len and 0 < masked < tokens / 4
    encoder, head = la.mlm_parts(model)
    assert metrics["model_flops"] == pytest.approx(
        efficiency.encoder_flops(efficiency.body_shape(encoder), tokens, tokens * cfg.seq_len)
        + efficiency.mlm_head_flops(head, masked))
    assert metrics["model_tflops_per_second"] > 0 and metrics["mfu"] is None  # the CPU: no peak
    summary = tmp_path / "summary.md"
    la.write_summary([str(out)], summary, tmp_path / "summary.png")
    assert "| MFU % |" in summary.read_text() and "| n/a |" in summary.read_text()


def _train_and_die(inputs, out, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                              out, CFG, progress=False, on_step=die)


def test_killed_job_resumes_from_its_last_checkpoint(inputs, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    straight = tmp_path / "straight"
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                              straight, CFG, progress=False)
    resumed = tmp_path / "resumed"
    process = multiprocessing.get_context("fork").Process(target=_train_and_die, args=(inputs, resumed, 4))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    assert not resumed.exists()  # nothing Snakemake would accept
    checkpoint = Path(str(resumed) + ".checkpoint")
    assert json.loads((checkpoint / "meta.json").read_text())["step"] == 3
    sequences = la.sequences_path(resumed)
    assert (sequences / la.SEQUENCES_MANIFEST).is_file()  # the tokenised corpus outlives the kill

    def tokenise_again(*args, **kwargs):
        raise AssertionError("the rerun tokenised the corpus again")

    monkeypatch.setattr(la, "pack_sequences", tokenise_again)  # the rerun reads what the first run made
    metrics = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                        resumed, CFG, progress=False)
    assert metrics["resumed_from_step"] == 3
    assert not sequences.exists() and not checkpoint.exists()  # both go once the LA is written
    a = load_file(str(straight / "embeddings.safetensors"))
    b = load_file(str(resumed / "embeddings.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit what an unbroken run gives
    a = load_file(str(straight / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(resumed / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_of_other_settings_is_not_resumed(inputs, tmp_path):
    out = tmp_path / "x"
    process = multiprocessing.get_context("fork").Process(target=_train_and_die, args=(inputs, out, 4))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    checkpoint = Path(str(out) + ".checkpoint")
    assert json.loads((checkpoint / "meta.json").read_text())["step"] == 3  # there was one to resume
    other = la.LanguageAdapterConfig(**{**CFG.__dict__, "learning_rate": 1e-3})
    metrics = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                        out, other, progress=False)
    assert metrics["resumed_from_step"] == 0
    rows = [line.split("\t") for line in (out / "loss.tsv").read_text().splitlines()[1:]]
    assert len(rows) == CFG.steps and max(float(lr) for _, _, lr in rows) == pytest.approx(1e-3)  # all at the new rate


def test_embeddings_of_another_tokenizer_are_refused(inputs, tmp_path):
    from transformers import AutoTokenizer

    base_tok = AutoTokenizer.from_pretrained(str(inputs["base"]))
    with pytest.raises(InputError, match="do not belong together"):
        la.build_model(inputs["base"], base_tok, inputs["emb"] / la.EMBEDDINGS_NAME, CFG)


def test_a_sequence_longer_than_the_base_s_positions_is_refused_before_the_corpus_is_read(inputs, tmp_path,
                                                                                           monkeypatch):
    """XLM-R's positions start after its padding index: 130 position embeddings hold 128 tokens.
    A packed sequence one token longer would index past them (a device-side assert on a GPU)."""
    import dataclasses
    import json

    config = json.loads((inputs["base"] / "config.json").read_text())
    limit = config["max_position_embeddings"] - config["pad_token_id"] - 1
    assert la.position_limit(inputs["base"]) == limit
    monkeypatch.setattr(la, "corpus_lines", lambda *a: pytest.fail("the corpus was read"))
    with pytest.raises(InputError, match=rf"language_adapter\.seq_len {limit + 1}: the base model .* has positions "
                                         rf"for {limit} tokens"):
        la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "la",
                                  dataclasses.replace(CFG, seq_len=limit + 1), progress=False)
    model = la.build_model(inputs["base"], tokenizer(inputs), inputs["emb"] / la.EMBEDDINGS_NAME, CFG)
    ids = torch.full((1, limit), 5)
    with torch.no_grad():
        model(input_ids=ids)  # the limit itself fits
        with pytest.raises((IndexError, RuntimeError), match="out of (range|bounds)"):
            model(input_ids=torch.full((1, limit + 1), 5))


@pytest.mark.parametrize("config,limit", [
    ({"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0}, 512),  # LaBSE: from 0
    ({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),  # after padding
    ({"model_type": "deberta-v2", "max_position_embeddings": 512, "position_biased_input": False}, None),
    ({"model_type": "bert", "max_position_embeddings": 512, "position_embedding_type": "relative_key"}, None)])
def test_the_position_limit_of_each_kind_of_model(tmp_path, config, limit):
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert la.position_limit(tmp_path) == limit


def test_empty_corpus(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="empty"):
        la.read_corpus(empty)


def test_tensorboard_tracking_writes_the_curve(inputs, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "tracking": "tensorboard"})
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                              tmp_path / "de", cfg, tracking_dir=tmp_path / "tb", progress=False)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, cfg.steps + 1))
    assert "heldout/mlm_loss_after" in events.Tags()["scalars"]


def test_head_warmup_trains_the_head_alone(inputs):
    tok = tokenizer(inputs)
    model = la.build_model(inputs["base"], tok, inputs["emb"] / la.EMBEDDINGS_NAME, CFG)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train = la.pack_sequences(la.read_corpus(inputs["corpus"]), tok, CFG.seq_len)
    la.warm_up_head(model, train, tok, CFG, "cpu")
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lm_head" in n for n in changed)
    assert not any("word_embeddings" in n or "lora_" in n for n in changed)
    # everything trainable before is trainable again
    assert any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


def test_checkpoint_of_changed_inputs_is_not_resumed(inputs, tmp_path):
    a = CFG.fingerprint(inputs["tok"] / "tokenizer.json", inputs["corpus"])
    other = tmp_path / "corpus.txt"
    other.write_text(inputs["corpus"].read_text(encoding="utf-8") + "noch ein Satz\n", encoding="utf-8")
    assert CFG.fingerprint(inputs["tok"] / "tokenizer.json", other) != a
    assert CFG.fingerprint(inputs["tok"] / "tokenizer.json", inputs["corpus"]) == a


@needs_cpu_compiler
@inductor_draws_as_eager()
def test_a_compiled_encoder_trains_as_the_eager_one(inputs, tmp_path):
    """language_adapter.compile: the same losses and adapter in fp32 on the CPU (Inductor drawing
    dropout as eager does), one compiled graph, and the same checkpoint fingerprint (a runtime setting)."""
    import torch._dynamo
    from safetensors.torch import load_file

    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "steps": 3, "head_warmup_steps": 0, "eval_sentences": 0})
    compiled_cfg = la.LanguageAdapterConfig(**{**cfg.__dict__, "compile": True})
    assert compiled_cfg.fingerprint(inputs["corpus"]) == cfg.fingerprint(inputs["corpus"])
    eager = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                      tmp_path / "eager", cfg, device="cpu", progress=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        compiled = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                             tmp_path / "compiled", compiled_cfg, device="cpu", progress=False)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # the encoder, whole
    finally:
        torch._dynamo.reset()
    assert compiled["config"]["compile"] and not eager["config"]["compile"]
    assert eager["steps"] == compiled["steps"] == 3
    losses = [logged_losses(tmp_path / name) for name in ("eager", "compiled")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-4)
    for name in ("adapter/adapter_model.safetensors", la.EMBEDDINGS_NAME):
        x, y = (load_file(str(tmp_path / run / name)) for run in ("eager", "compiled"))
        assert_same_adamw_training(x, y, cfg.learning_rate, name)


def test_compile_without_a_compiler_is_refused_before_training(inputs, tmp_path, monkeypatch):
    from torch._inductor import cpp_builder

    def no_compiler():
        raise RuntimeError("no C++ compiler found (looked for g++)")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    monkeypatch.setattr(la, "pack_sequences", lambda *a, **k: pytest.fail("tokenised before the check"))
    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "compile": True})
    with pytest.raises(InputError, match=r"language_adapter.compile: true, but torch.compile on the CPU "
                                         r"needs a C\+\+ compiler .*set language_adapter.compile: false"):
        la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                  tmp_path / "de", cfg, device="cpu", progress=False)


def _kernel_settings():
    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "steps": 3, "head_warmup_steps": 0, "eval_sentences": 0,
                                      "log_every": 1})
    return cfg, la.LanguageAdapterConfig(**{**cfg.__dict__, "kernels": "triton"})


def _kernel_calls(monkeypatch):
    """A Counter of the calls of modsent's kernel functions from now on, by name (lora_linears, one
    call an attention: its layers)."""
    from collections import Counter

    from modsent.training import kernels

    calls = Counter()
    for name in ("lora_linears", "dropout_add_norm", "cross_entropy"):
        def spy(*args, _real=getattr(kernels, name), _name=name, **kwargs):
            calls[_name] += len(args[1]) if _name == "lora_linears" else 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
    return calls


def _saved(run_dir) -> dict:
    return {f"{f.name}:{k}": v for f in sorted(run_dir.rglob("*.safetensors")) for k, v in load_file(str(f)).items()}


def test_triton_kernels_are_a_runtime_setting_refused_without_triton_on_a_gpu_and_idle_on_the_cpu(
        inputs, tmp_path, monkeypatch):
    """language_adapter.kernels: triton is a runtime setting (not in the params, the same
    checkpoint fingerprint: a run resumes whatever it is); on a GPU without Triton it is refused,
    naming the key, before the corpus is tokenised; on the CPU outside Triton's interpreter it
    changes nothing: the eager run's adapter and embeddings to the bit."""
    from modsent.config import fill_defaults, inline_refs, job_settings, load_schema, runtime_settings
    from modsent.training import fastpath, kernels

    schema = load_schema()
    filled = fill_defaults({"language_adapter": {"kernels": "triton"}}, inline_refs(schema, schema))
    assert "kernels" not in job_settings(filled, "language_adapter")
    assert runtime_settings(filled, "language_adapter", "de")["kernels"] == "triton"
    assert la.LanguageAdapterConfig.from_config(filled["language_adapter"]).kernels == "triton"
    cfg, fast = _kernel_settings()
    assert fast.fingerprint(inputs["corpus"]) == cfg.fingerprint(inputs["corpus"])

    with monkeypatch.context() as patch:
        patch.setattr(kernels, "triton_available", lambda: False)
        patch.setattr(la, "pack_sequences", lambda *a, **k: pytest.fail("tokenised before the check"))
        with pytest.raises(InputError, match=r"language_adapter.kernels: triton, but this PyTorch install has "
                                             r"no Triton; .*or set language_adapter.kernels: eager"):
            la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                      tmp_path / "gpu", fast, device="cuda", progress=False)
        assert fastpath.check_kernels("cpu", "language_adapter.kernels") is False
    with monkeypatch.context() as patch:  # Triton there, but its interpreter chosen: not on a GPU
        patch.setattr(kernels, "triton_available", lambda: True)
        patch.setattr(kernels, "interpreting", lambda: True)
        with pytest.raises(InputError, match=r"TRITON_INTERPRET=1 runs Triton's kernels on the CPU"):
            fastpath.check_kernels("cuda:0", "language_adapter.kernels")
        assert fastpath.check_kernels("cpu", "language_adapter.kernels") is True

    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "eager",
                              cfg, device="cpu", progress=False)
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "interpreting", lambda: False)
        patch.setattr(fastpath, "use_triton_kernels", lambda *a, **k: pytest.fail("kernels applied on the CPU"))
        result = la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"],
                                           tmp_path / "triton", fast, device="cpu", progress=False)
    assert result["config"]["kernels"] == "triton"
    a, b = _saved(tmp_path / "eager"), _saved(tmp_path / "triton")
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
    assert logged_losses(tmp_path / "eager") == logged_losses(tmp_path / "triton")


@needs_triton_interpreter
def test_with_triton_kernels_every_training_step_runs_through_them_and_trains_the_adapter(inputs, tmp_path,
                                                                                         monkeypatch):
    """language_adapter.kernels: triton where the kernels run (here Triton's interpreter on the
    CPU): every training forward of each LoRA layer and each residual norm goes through them
    (3 steps x 2 layers x 3 LoRA layers, one call an attention, and 2 norms), and each step's MLM loss
    (eval_sentences: 0, no held-out loss), both LoRA matrices train, and the run ends
    as near the eager one as an eager run with other dropout draws does (the same start and
    batches; the kernels' results against their own masks: tests/test_kernels.py)."""
    calls = _kernel_calls(monkeypatch)
    cfg, fast = _kernel_settings()
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "triton",
                              fast, device="cpu", progress=False)
    assert calls == {"lora_linears": 3 * 2 * 3, "dropout_add_norm": 3 * 2 * 2, "cross_entropy": 3}
    calls.clear()
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "eager",
                              cfg, device="cpu", progress=False)
    build = la.build_model

    def build_then_reseed(*args, **kwargs):  # the same initial adapter, other dropout draws
        model = build(*args, **kwargs)
        torch.manual_seed(cfg.seed + 1)
        return model

    monkeypatch.setattr(la, "build_model", build_then_reseed)
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "other",
                              cfg, device="cpu", progress=False)
    assert not calls
    eager, triton, other = (_saved(tmp_path / run) for run in ("eager", "triton", "other"))
    assert eager.keys() == triton.keys() == other.keys()

    torch.manual_seed(cfg.seed)
    start = {k.replace(".default", ""): v for k, v in
             build(inputs["base"], tokenizer(inputs), inputs["emb"] / la.EMBEDDINGS_NAME, cfg).state_dict().items()}
    lora_a, lora_b = ([k for k in eager if f"lora_{m}" in k] for m in "AB")
    assert len(lora_a) == len(lora_b) == 2 * 3
    for key in lora_a:  # A's gradient (zero while B is, at the first step) reaches A through the kernels
        assert not torch.equal(triton[key], start[key.split(":", 1)[1]]), key
    for key in lora_b:  # B starts at zero
        assert triton[key].abs().max() > 0, key

    def cosine(run, key):
        return float(torch.nn.functional.cosine_similarity(run[key].flatten(), eager[key].flatten(), dim=0))

    ours, theirs = (sum(cosine(run, key) for key in lora_b) / len(lora_b) for run in (triton, other))
    assert ours > theirs - 0.15 and ours > 0.3, (ours, theirs)
    losses = [logged_losses(tmp_path / run) for run in ("eager", "triton")]
    assert len(losses[1]) == 3 and all(math.isfinite(x) for x in losses[1])
    assert losses[1] == pytest.approx(losses[0], rel=0.01)


@needs_cpu_compiler
@needs_triton_interpreter
def test_with_compile_the_triton_setting_runs_the_loss_kernel_outside_the_compiled_encoder(inputs, tmp_path,
                                                                                          monkeypatch, traced_compile):
    """kernels: triton with compile: true: inside the compiled encoder (Dynamo's graphs, run as
    eager here: traced_compile) no LoRA or norm kernel runs, and the MLM loss outside it goes
    through the cross-entropy kernel at every step; as that draws nothing, the run trains what the
    eager one trains, up to float rounding."""
    from safetensors.torch import load_file

    calls = _kernel_calls(monkeypatch)
    cfg, fast = _kernel_settings()
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "eager",
                              cfg, device="cpu", progress=False)
    assert not calls
    both = la.LanguageAdapterConfig(**{**fast.__dict__, "compile": True})
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "both",
                              both, device="cpu", progress=False)
    modules, graphs = traced_compile
    assert len(modules) == 1 and graphs() >= 1 and calls == {"cross_entropy": 3}
    losses = [logged_losses(tmp_path / run) for run in ("eager", "both")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-5)
    for name in ("adapter/adapter_model.safetensors", la.EMBEDDINGS_NAME):
        x, y = (load_file(str(tmp_path / run / name)) for run in ("eager", "both"))
        assert x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=1e-6) for k in x), name


def test_a_bf16_residual_stream_is_its_own_setting_and_changes_nothing_without_bf16_autocast(inputs, tmp_path,
                                                                                             monkeypatch):
    """language_adapter.residual_stream: bf16 makes every LayerNorm of the trained model return bf16
    under bf16 autocast (fastpath.bf16_residual_stream; its numerics are tested there): other
    results, so other params and another checkpoint fingerprint. Added after LAs existed, at its
    default it is in neither, so upgrading retrains and restarts nothing. On the CPU, without
    autocast, the adapter trained is the fp32 stream's to the bit."""
    import dataclasses
    import hashlib

    from modsent.config import fill_defaults, inline_refs, job_settings, load_schema
    from modsent.training import fastpath
    from modsent.training.checkpoints import RUNTIME_SETTINGS

    schema = load_schema()

    def filled(section):
        return fill_defaults({"language_adapter": section}, inline_refs(schema, schema))

    assert la.LanguageAdapterConfig.from_config(filled({})["language_adapter"]).residual_stream == "fp32"
    assert la.LanguageAdapterConfig.from_config(filled({"residual_stream": "bf16"})["language_adapter"]
                                                ).residual_stream == "bf16"
    assert "residual_stream" not in job_settings(filled({}), "language_adapter")
    assert job_settings(filled({"residual_stream": "bf16"}), "language_adapter")["residual_stream"] == "bf16"

    cfg = la.LanguageAdapterConfig(**{**CFG.__dict__, "steps": 3, "head_warmup_steps": 1})
    low = la.LanguageAdapterConfig(**{**cfg.__dict__, "residual_stream": "bf16"})
    assert low.fingerprint(inputs["corpus"]) != cfg.fingerprint(inputs["corpus"])
    before = {k: v for k, v in dataclasses.asdict(cfg).items()  # the fingerprint as it was before the key
              if k not in (*RUNTIME_SETTINGS, "tracking", "residual_stream")}
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode())
    digest.update(Path(inputs["corpus"]).read_bytes())
    assert cfg.fingerprint(inputs["corpus"]) == digest.hexdigest()[:16]

    changed = []
    real = fastpath.bf16_residual_stream
    monkeypatch.setattr(fastpath, "bf16_residual_stream", lambda model, on=True: changed.append(real(model, on)))
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "fp32",
                              cfg, progress=False, device="cpu")
    assert changed == []
    la.train_language_adapter(inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"], tmp_path / "bf16",
                              low, progress=False, device="cpu")
    assert len(changed) == 1 and changed[0] >= 2 * 2 + 1  # two per layer, the embeddings', the head's
    a, b = _saved(tmp_path / "fp32"), _saved(tmp_path / "bf16")
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
